"""The digits, with every training sample each process fetches written down, in order.

`_target_: helpers.recorded.recorded_digits`: with HPCTRAIN_TEST_SAMPLES=PATH set, each process
appends the index of every training sample it fetches to PATH.rank<R> (R its global rank), so a
test can rebuild which samples each step trained on, at any world size, and compare runs exactly.
In a Slurm job each srun step of the batch script records apart, in PATH.<launched at>.rank<R>
(HPCTRAIN_LAUNCHED_AT, which the batch shell exports before each launch), so a relaunch's records
are not mixed with those of the step it replaced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import Dataset

from hpctrain.data.digits import digits
from hpctrain.data.splits import Splits
from hpctrain.data.tokens import synthetic_tokens

ENV = "HPCTRAIN_TEST_SAMPLES"
LAUNCHED_AT_ENV = "HPCTRAIN_LAUNCHED_AT"


class Recorded(Dataset):
    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        path = os.environ.get(ENV)
        if path:
            rank = dist.get_rank() if dist.is_initialized() else 0
            launched_at = os.environ.get(LAUNCHED_AT_ENV)
            step = f".{launched_at}" if launched_at else ""
            with open(f"{path}{step}.rank{rank}", "a") as out:
                out.write(f"{index}\n")
        return self.inner[index]


def recorded_digits(**options: Any) -> Splits:
    splits = digits(**options)
    return Splits(train=Recorded(splits.train), eval=splits.eval)


def recorded_tokens(**options: Any) -> Splits:
    """The synthetic token sequences (data=tokens), recorded the same way."""
    splits = synthetic_tokens(**options)
    return Splits(train=Recorded(splits.train), eval=splits.eval)


def steps_of(
    path: str,
    world_size: int,
    micro_batch: int,
    grad_accum: int,
    kept: int | None = None,
    global_batch: int | None = None,
) -> list[list[int]]:
    """The sorted sample indices of each step one life trained, from its processes' records;
    `kept`: only its first steps (a life that died past them: the next resumed from there).
    `global_batch` (a `start` event's layout gives it): where it does not divide by the
    processes, process r took one sample more a step for r < global_batch % world_size."""
    per_rank = [[int(i) for i in Path(f"{path}.rank{rank}").read_text().split()] for rank in range(world_size)]
    total = global_batch or world_size * micro_batch * grad_accum
    shares = [total // world_size + (rank < total % world_size) for rank in range(world_size)]
    if kept is not None:
        assert all(len(f) >= kept * share for f, share in zip(per_rank, shares)), [len(f) for f in per_rank]
        per_rank = [fetched[: kept * share] for fetched, share in zip(per_rank, shares)]
    steps = len(per_rank[0]) // shares[0]
    assert all(len(f) == steps * share for f, share in zip(per_rank, shares)), [len(f) for f in per_rank]
    return [
        sorted(i for fetched, share in zip(per_rank, shares) for i in fetched[k * share : (k + 1) * share])
        for k in range(steps)
    ]


def steps_in_layout(path: str, layout: dict[str, int], kept: int | None = None) -> list[list[int]]:
    """`steps_of` in the layout a `start` event records."""
    fields = layout["world_size"], layout["micro_batch"], layout["grad_accum"]
    return steps_of(path, *fields, kept, layout["global_batch"])
