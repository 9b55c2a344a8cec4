"""How a step's global batch is split over processes and micro-batches, and where a run's data
position lands when it resumes with another number of processes (trainer.elastic).

A step trains one global batch: `world_size` processes x `grad_accum` micro-batches x
`micro_batch` samples. The training sampler (hpctrain.trainer.loaders) makes global batch k of an
epoch the samples at positions [k*G, (k+1)*G) of the epoch's permutation, whatever the split, so a
run keeps its global batch G when the process count changes and sees the same samples in the same
steps. The per-process share G / world_size is then cut into the fewest micro-batches that fit in
data.batch_size (more accumulation, never a larger batch than the user allowed).

Pure functions: tested as tables in tests/test_layout.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpctrain.errors import UserError


@dataclass(frozen=True)
class Layout:
    world_size: int  # processes
    micro_batch: int  # samples per process per micro-batch
    grad_accum: int  # micro-batches per optimizer step

    @property
    def global_batch(self) -> int:
        return self.world_size * self.micro_batch * self.grad_accum

    @property
    def samples_per_micro_batch(self) -> int:
        """Samples all processes take together per micro-batch (one per process)."""
        return self.world_size * self.micro_batch

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "global_batch": self.global_batch}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Layout:
        return cls(int(saved["world_size"]), int(saved["micro_batch"]), int(saved["grad_accum"]))


def resized(global_batch: int, world_size: int, max_micro_batch: int) -> Layout:
    """The layout that keeps `global_batch` on `world_size` processes, with micro-batches of at
    most `max_micro_batch` samples; UserError when the global batch does not divide."""
    if global_batch % world_size:
        fitting = divisors(global_batch)
        shown = ", ".join(str(n) for n in fitting[:8]) + (" ..." if len(fitting) > 8 else "")
        raise UserError(
            f"trainer.elastic: this run's global batch is {global_batch} samples, which {world_size} processes "
            f"cannot share equally; resume it on a process count that divides {global_batch} ({shown})"
        )
    per_process = global_batch // world_size
    accum = -(-per_process // max_micro_batch)  # the fewest micro-batches that fit ...
    while per_process % accum:  # ... and split the share equally
        accum += 1
    return Layout(world_size, per_process // accum, accum)


def divisors(number: int) -> list[int]:
    return [n for n in range(1, number + 1) if number % n == 0]


def moved_position(batch_in_epoch: int, old: Layout, new: Layout) -> int:
    """A data position (micro-batches each process consumed this epoch) in `old`'s layout,
    counted in `new`'s. Exact at step boundaries, where every checkpoint is taken."""
    samples = batch_in_epoch * old.samples_per_micro_batch
    if samples % new.samples_per_micro_batch:
        raise ValueError(
            f"position {batch_in_epoch} of {old} is {samples} samples, not a whole number of {new}'s micro-batches"
        )
    return samples // new.samples_per_micro_batch


def world_refusal(saved_world: int, world_size: int, step: int) -> str:
    """Why a checkpoint of `saved_world` processes is not resumed by `world_size` of them
    without trainer.elastic."""
    return (
        f"the checkpoint at step {step} was written by {saved_world} processes and this run has {world_size}; "
        f"resume with {saved_world} processes (trainer.nprocs={saved_world} locally, slurm.nodes x "
        f"slurm.ntasks_per_node = {saved_world} on Slurm), set trainer.elastic=true to resume at another "
        f"size (the same samples in the same steps; the weights equal within floating-point reduction "
        f"order), or train this config in a new run dir (hydra.run.dir=...)"
    )


def resumed(saved: Layout, world_size: int, max_micro_batch: int, elastic: bool, step: int) -> Layout:
    """The layout a run resumes with from a checkpoint written in `saved`'s: its global batch,
    on this run's processes; UserError at another process count unless `elastic`."""
    if saved.world_size != world_size and not elastic:
        raise UserError(world_refusal(saved.world_size, world_size, step))
    return resized(saved.global_batch, world_size, max_micro_batch)
