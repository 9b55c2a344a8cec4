"""The training loop's promises, checked on real multi-process runs (gloo, file:// rendezvous).

- the same seed, world size and threads give bit-identical weights (dropout included);
- W processes x batch B train the same model as 1 process x batch W*B (DDP averages right);
- grad accumulation over micro-batches equals one big batch, on one and on two processes;
- the sampler shards, reshuffles and resumes the way the equivalences above need;
- the quickstart (default config, 2 processes) reaches the accuracy the README promises.

Runs go through `hpctrain-train` itself (see conftest.train_run), never through a fixed port.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import DEFAULT_RUN, Spec, TrainRuns, assert_ok, finish, load_weights
from torch.utils.data import DataLoader, DistributedSampler

from hpctrain.dist.context import DistContext
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.trainer.layout import Layout, resized
from hpctrain.trainer.loaders import TrainBatches

# The MLP has no dropout and no batch norm: the equivalence runs below are exact up to float
# summation order. 25 steps cover the warmup and part of the cosine decay. Plain SGD without
# clipping, because both would hide a gradient off by a constant factor (a sum where a mean
# belongs): Adam's update does not change when every gradient is scaled, nor does a clipped one.
MLP = ("model=mlp", "trainer.max_steps=25", "optim=sgd", "trainer.grad_clip=0")
ATOL = 1e-5

DET = ("trainer.nprocs=2", "trainer.max_steps=30")
RUNS = {
    spec.label: spec
    for spec in (
        DEFAULT_RUN,
        Spec("det-a", DET),
        Spec("det-b", DET),
        # The reference: 1 process x batch 64.
        Spec("mlp-1x64", (*MLP, "trainer.nprocs=1", "data.batch_size=64")),
        Spec("mlp-1x64-seed1", (*MLP, "trainer.nprocs=1", "data.batch_size=64", "trainer.seed=1")),
        Spec("mlp-2x32", (*MLP, "trainer.nprocs=2", "data.batch_size=32")),
        Spec("mlp-1x32x2", (*MLP, "trainer.nprocs=1", "data.batch_size=32", "trainer.grad_accum=2")),
        Spec("mlp-2x16x2", (*MLP, "trainer.nprocs=2", "data.batch_size=16", "trainer.grad_accum=2")),
    )
}


@pytest.fixture(scope="module")
def runs(train_run: TrainRuns) -> TrainRuns:
    """Every training run of this module, started side by side (longest first)."""
    train_run.prefetch(*RUNS.values())
    return train_run


def _trained(runs: TrainRuns, label: str) -> Path:
    spec = RUNS[label]
    proc, run_dir = runs(spec.label, *spec.overrides)
    assert_ok(proc)
    return run_dir


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape, key
        assert torch.allclose(a[key], b[key], rtol=0, atol=ATOL), (
            f"{what}: {key} differs by {(a[key] - b[key]).abs().max().item():.3g}"
        )


def _metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


# determinism -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_seed_gives_bit_identical_weights_and_another_seed_does_not(runs: TrainRuns) -> None:
    # The default ConvNet has dropout: the per-rank dropout streams must be seeded too.
    first, second = (_trained(runs, label) for label in ("det-a", "det-b"))
    for run_dir in (first, second):
        assert finish(run_dir)["step"] == 30

    a, b = load_weights(first), load_weights(second)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs between two runs with the same seed"
    # The metrics, down to the last bit of the loss, are the same as well.
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("samples_per_s", "time")} for r in rows]  # noqa: E731
    assert strip(_metrics(first)) == strip(_metrics(second))

    # trainer.seed=1 changes every tensor (the MLP pair the DDP test below trains anyway).
    c, d = load_weights(_trained(runs, "mlp-1x64")), load_weights(_trained(runs, "mlp-1x64-seed1"))
    differing = [key for key in c if not torch.equal(c[key], d[key])]
    assert differing == list(c), f"trainer.seed=1 left {set(c) - set(differing)} unchanged"


# DDP equivalence -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_of_32_train_the_same_model_as_one_of_64(runs: TrainRuns) -> None:
    two, one, other_seed = (_trained(runs, label) for label in ("mlp-2x32", "mlp-1x64", "mlp-1x64-seed1"))
    w_two, w_one, w_other = load_weights(two), load_weights(one), load_weights(other_seed)
    _assert_close(w_two, w_one, "2 x 32 vs 1 x 64")
    # The tolerance is far below what a real difference looks like, so the check can fail.
    assert _max_diff(w_one, w_other) > 100 * ATOL

    # Logged losses (averaged over ranks and steps) and the sharded evaluation agree as well.
    m_two, m_one = _metrics(two), _metrics(one)
    assert [r["step"] for r in m_two] == [r["step"] for r in m_one] == [10, 20, 25]
    for r2, r1 in zip(m_two, m_one):
        assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-5)
        assert r2["lr"] == pytest.approx(r1["lr"], rel=1e-12)
    assert m_two[-1]["eval_loss"] == pytest.approx(m_one[-1]["eval_loss"], abs=1e-5)
    assert m_two[-1]["eval_accuracy"] == m_one[-1]["eval_accuracy"]


# gradient accumulation -------------------------------------------------------------------------


@pytest.mark.slow
def test_grad_accum_on_one_process_equals_the_full_batch(runs: TrainRuns) -> None:
    # 1 process x 32 x 2 micro-batches == 1 process x 64.
    accum, full = _trained(runs, "mlp-1x32x2"), _trained(runs, "mlp-1x64")
    _assert_close(load_weights(accum), load_weights(full), "1 x 32 x 2 micro-batches vs 1 x 64")
    # The logged loss is the step's loss, not the last micro-batch's or the sum of both.
    for ra, rf in zip(_metrics(accum), _metrics(full), strict=True):
        assert ra["loss"] == pytest.approx(rf["loss"], abs=1e-5)
    # Both counted 25 optimizer steps, not 25 micro-batches.
    assert finish(accum)["step"] == finish(full)["step"] == 25


@pytest.mark.slow
def test_grad_accum_on_two_processes_equals_the_full_batch(runs: TrainRuns) -> None:
    # 2 processes x 16 x 2 micro-batches (the first under DDP's no_sync) == 1 process x 64.
    accum, full = _trained(runs, "mlp-2x16x2"), _trained(runs, "mlp-1x64")
    _assert_close(load_weights(accum), load_weights(full), "2 x 16 x 2 vs 1 x 64")
    for ra, rf in zip(_metrics(accum), _metrics(full), strict=True):
        assert ra["loss"] == pytest.approx(rf["loss"], abs=1e-5)


# accuracy --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quickstart_reaches_95_percent_on_two_processes(runs: TrainRuns) -> None:
    done = finish(_trained(runs, DEFAULT_RUN.label))
    # 10 epochs of 1437 images at 2 x 32 a step: 22 steps an epoch.
    assert done["step"] == 220
    assert done["eval_accuracy"] >= 0.95, done
    assert math.isfinite(done["eval_loss"]) and done["eval_loss"] < 0.5


# the sampler (in-process, no training) --------------------------------------------------------


def _ctx(rank: int, world_size: int) -> DistContext:
    return DistContext(rank, rank, world_size, world_size, "", torch.device("cpu"), "spawn")


def _batches(size: int, layout: Layout, rank: int, epoch: int = 0, seed: int = 0, first: int = 0) -> list[list[int]]:
    """Rank `rank`'s micro-batches of one epoch (from micro-batch `first`), as the trainer draws them."""
    batches = TrainBatches(size, layout, rank, seed)
    batches.start(epoch, first)
    drawn = [list(batch) for batch in batches]
    assert len(drawn) == len(batches)
    return drawn


def _shards(size: int, world_size: int, epoch: int = 0, seed: int = 0) -> list[list[int]]:
    """Every rank's samples of one epoch, in order (one sample a micro-batch)."""
    layout = Layout(world_size, 1, 1)
    return [sum(_batches(size, layout, rank, epoch, seed), []) for rank in range(world_size)]


def test_sampler_shards_are_disjoint_and_cover_the_permutation() -> None:
    first, second = _shards(100, 2)
    assert len(first) == len(second) == 50
    assert not set(first) & set(second)
    assert sorted(first + second) == list(range(100))
    assert first + second != list(range(100))  # shuffled, not split in two halves
    # Interleaved: rank r takes every W-th index of the one shared permutation.
    (whole,) = _shards(100, 1)
    assert first == whole[0::2] and second == whole[1::2]


@pytest.mark.parametrize(
    "size, world_size, batch, accum", [(100, 2, 4, 1), (103, 3, 5, 2), (1437, 2, 9, 2), (9, 2, 1, 1)]
)
def test_an_even_layout_draws_what_torchs_distributed_sampler_drew(
    size: int, world_size: int, batch: int, accum: int
) -> None:
    """Runs of earlier versions (torch's DistributedSampler, drop_last, cut into batches) resume
    bit-identical: every rank's micro-batches of every epoch are the same samples in the same order."""
    for epoch in (0, 3):
        for rank in range(world_size):
            sampler = DistributedSampler(range(size), world_size, rank, shuffle=True, seed=5, drop_last=True)  # type: ignore[arg-type]
            sampler.set_epoch(epoch)
            drawn = list(sampler)
            whole_steps = len(drawn) // batch // accum * accum
            before = [drawn[k * batch : (k + 1) * batch] for k in range(whole_steps)]
            assert _batches(size, Layout(world_size, batch, accum), rank, epoch, seed=5) == before


def test_sampler_set_epoch_reshuffles_and_is_reproducible() -> None:
    epoch0, epoch1 = _shards(100, 2, epoch=0), _shards(100, 2, epoch=1)
    assert epoch0[0] != epoch1[0] and epoch0[1] != epoch1[1]
    assert sorted(epoch1[0] + epoch1[1]) == list(range(100))
    assert _shards(100, 2, epoch=1) == epoch1  # the same epoch again: the same order
    assert _shards(100, 2, epoch=0, seed=1) != epoch0  # the seed matters


def test_sampler_start_skips_exactly_that_many_micro_batches() -> None:
    layout = Layout(2, 4, 1)
    full = _batches(100, layout, 1, epoch=3)
    assert _batches(100, layout, 1, epoch=3, first=7) == full[7:]
    # Through a DataLoader, as the trainer uses it: the very next batch, no replay.
    batches = TrainBatches(100, layout, 1, 0)
    loader = DataLoader(range(100), batch_sampler=batches)  # type: ignore[arg-type]
    batches.start(3, 8)
    fetched = [b.tolist() for b in loader]
    assert fetched == full[8:] and len(fetched) == 50 // 4 - 8


def _global_batches(size: int, layout: Layout, epochs: int) -> list[list[int]]:
    """The samples of each optimizer step, all ranks together, as the trainer draws them."""
    per_rank = []
    for rank in range(layout.world_size):
        micro = sum((_batches(size, layout, rank, epoch) for epoch in range(epochs)), [])
        accum = layout.grad_accum
        per_rank.append([sum(micro[k : k + accum], []) for k in range(0, len(micro), accum)])
    assert len({len(steps) for steps in per_rank}) == 1, "ranks disagree on the number of steps"
    return [sorted(sum(step, [])) for step in zip(*per_rank)]


@pytest.mark.parametrize("world_size, batch", [(2, 8), (4, 4), (3, 5)])
def test_w_ranks_of_b_see_the_samples_of_one_rank_of_w_times_b(world_size: int, batch: int) -> None:
    # 120 samples divide evenly among 2, 3 and 4 ranks; two epochs cross an epoch boundary.
    many = _global_batches(120, Layout(world_size, batch, 1), epochs=2)
    one = _global_batches(120, Layout(1, world_size * batch, 1), epochs=2)
    assert many == one
    assert len(one) == 2 * (120 // (world_size * batch))


@pytest.mark.parametrize("world_size, max_micro", [(2, 15), (2, 23), (4, 5), (7, 2), (3, 4)])
def test_uneven_shares_train_the_samples_of_the_global_batch_each_step(world_size: int, max_micro: int) -> None:
    """45 samples a step on processes that cannot share them equally (23 + 22 on two): each step
    still trains positions [k*45, (k+1)*45) of the permutation, across two epochs of 1,000."""
    layout = resized(45, world_size, max_micro)
    assert not layout.even and layout.micro_batch <= max_micro
    shares = [sum(layout.micro_sizes(rank)) for rank in range(world_size)]
    assert sum(shares) == 45 and max(shares) - min(shares) <= 1
    many = _global_batches(1000, layout, epochs=2)
    assert many == _global_batches(1000, Layout(1, 45, 1), epochs=2)
    assert len(many) == 2 * (1000 // 45)
    # The all-reduce averages the processes: the weights make it the mean over the 45 samples.
    weights = [layout.loss_weights(rank) or [] for rank in range(world_size)]
    assert math.isclose(sum(sum(w) for w in weights) / world_size, 1.0)


def test_w_ranks_match_one_rank_across_epochs_when_the_size_does_not_divide() -> None:
    # 9 samples, 2 ranks x 1 vs 1 rank x 2: 4 steps an epoch each, the same samples each step.
    many = _global_batches(9, Layout(2, 1, 1), epochs=2)
    one = _global_batches(9, Layout(1, 2, 1), epochs=2)
    assert many == one
