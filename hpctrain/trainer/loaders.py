"""Data loaders: a shuffled, sharded training stream and an exact, unpadded eval shard.

The training stream is exact across resumes whatever `data.num_workers` is: the sample order is a
function of (seed, epoch, world size, rank) and the randomness a dataset draws in a worker
process (augmentation) is seeded per batch from (seed, epoch, rank, batch number in the epoch).
Seeding per worker would not do: a run resumed mid-epoch hands its first batch to worker 0,
which in the uninterrupted run may have been worker 1, with another number of draws behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hpctrain.config import DataConfig
from hpctrain.data.worker_seeds import SeededBatch, WorkerSeeded
from hpctrain.dist.context import DistContext
from hpctrain.trainer.layout import Layout


class TrainBatches(Sampler[SeededBatch]):
    """The training loader's batch sampler: this rank's micro-batches of one epoch from a
    position, each carrying the seed its worker draws the batch's randomness from.

    Every rank draws the same permutation of the epoch (seeded by seed + epoch, as torch's
    DistributedSampler draws it). Step k of the epoch trains the global batch at positions
    [k*G, (k+1)*G); rank r of W takes the step's positions r, r+W, r+2W, ... in order, cut into
    the micro-batches its layout gives (hpctrain.trainer.layout). With an even layout that is
    exactly DistributedSampler's every-W-th index cut into batches of data.batch_size, so runs stay
    bit-identical to earlier versions; at any other size or split each step still trains the same
    samples. An epoch ends with its last whole step, so a step never takes micro-batches from two
    epochs and an epoch has floor(samples / G) steps at every size."""

    def __init__(self, samples: int, layout: Layout, rank: int, seed: int) -> None:
        self.samples = samples
        self.layout = layout
        self.rank = rank
        self.seed = seed
        self.epoch = 0
        self.first_batch = 0  # micro-batches of this epoch already consumed (a resume starts later)
        # This rank's offsets within a step, and where each of its micro-batches starts among them.
        self.offsets = list(range(rank, layout.global_batch, layout.world_size))
        sizes = layout.micro_sizes(rank)
        self.cuts = [(sum(sizes[:micro]), size) for micro, size in enumerate(sizes)]

    def epoch_batches(self) -> int:
        """Micro-batches a whole epoch gives this rank: whole steps of them."""
        return self.samples // self.layout.global_batch * self.layout.grad_accum

    def start(self, epoch: int, batch_in_epoch: int) -> None:
        self.epoch = epoch
        self.first_batch = batch_in_epoch

    def permutation(self) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[SeededBatch]:
        order = self.permutation()
        for batch in range(self.first_batch, self.epoch_batches()):
            step, micro = divmod(batch, self.layout.grad_accum)
            first, size = self.cuts[micro]
            base = step * self.layout.global_batch
            indices = [order[base + offset] for offset in self.offsets[first : first + size]]
            yield SeededBatch(indices, self.seed, self.epoch, self.rank, batch)

    def __len__(self) -> int:
        return max(0, self.epoch_batches() - self.first_batch)


class EvalShard(Sampler[int]):
    """Rank r takes indices r, r+W, r+2W, ...: no padding, so every sample counts once."""

    def __init__(self, size: int, ctx: DistContext) -> None:
        self.indices = list(range(ctx.rank, size, ctx.world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _worker_options(data: DataConfig, ctx: DistContext) -> dict[str, Any]:
    return {
        "num_workers": data.num_workers,
        "pin_memory": data.pin_memory and ctx.device.type == "cuda",
    }


def train_loader(dataset: Dataset, data: DataConfig, ctx: DistContext, seed: int, layout: Layout) -> DataLoader:
    """This rank's micro-batches in `layout`: data.batch_size samples each, or as the layout of an
    elastic resume cuts them (hpctrain.trainer.layout); grad_accum of them make one step."""
    batches = TrainBatches(len(dataset), layout, ctx.rank, seed)  # type: ignore[arg-type]
    return DataLoader(
        WorkerSeeded(dataset),
        batch_sampler=batches,
        persistent_workers=data.num_workers > 0 and data.persistent_workers,
        # Its own generator: creating an iterator must not draw from the global RNG (dropout).
        generator=torch.Generator().manual_seed(seed),
        **_worker_options(data, ctx),
    )


def eval_loader(dataset: Dataset, data: DataConfig, ctx: DistContext) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=data.eval_batch_size or data.batch_size,
        sampler=EvalShard(len(dataset), ctx),  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(0),
        **_worker_options(data, ctx),
    )


def _batches(loader: DataLoader) -> TrainBatches:
    batches = loader.batch_sampler
    if not isinstance(batches, TrainBatches):
        raise TypeError(f"not a training loader from hpctrain.trainer.loaders.train_loader: {batches!r}")
    return batches


def start_epoch(loader: DataLoader, seed: int, epoch: int, batch_in_epoch: int) -> None:
    """Point the loader at `epoch`, `batch_in_epoch` batches in; its next iterator starts there."""
    _batches(loader).start(epoch, batch_in_epoch)
    # Worker start-up seeds come from the loader's own generator; reset per epoch, a resumed run
    # draws the same ones (the batches' randomness is seeded per batch anyway).
    assert loader.generator is not None  # train_loader always gives it one
    loader.generator.manual_seed(seed * 1_000_003 + epoch)


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    # non_blocking only helps from pinned memory; on CPU it is a no-op.
    return tuple(t.to(device, non_blocking=True) for t in batch)
