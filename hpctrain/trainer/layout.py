"""How a step's global batch is split over processes and micro-batches, and where a run's data
position lands when it resumes with another number of processes (trainer.elastic).

A step trains one global batch of G samples: the positions [k*G, (k+1)*G) of the epoch's
permutation for step k of the epoch, whatever the split (hpctrain.trainer.loaders). Process r of
W takes the step's positions r, r+W, r+2W, ...: G // W samples, one more for the first G % W
processes. At the configured size every process takes data.batch_size x trainer.grad_accum (an
*even* layout). After an elastic resize the shares may differ by one sample (45 samples on 2
processes: 23 and 22); each process then cuts its share into the same number of micro-batches
(every process must take part in the same number of forwards: FSDP gathers parameters in each),
of at most data.batch_size samples and as equal as they can be. A micro-batch's mean loss is then
weighted by its samples x W / G (`loss_weights`), so the all-reduced gradient, which averages the
processes, is the mean over the G samples exactly as at any other size.

Pure functions: tested as tables in tests/test_layout.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpctrain.errors import UserError


@dataclass(frozen=True)
class Layout:
    world_size: int  # processes
    micro_batch: int  # samples in the largest micro-batch a process takes
    grad_accum: int  # micro-batches per optimizer step, on every process
    global_batch: int = 0  # samples a step, all processes together; 0: world_size x micro_batch x grad_accum

    def __post_init__(self) -> None:
        if self.global_batch == 0:
            object.__setattr__(self, "global_batch", self.world_size * self.micro_batch * self.grad_accum)

    @property
    def even(self) -> bool:
        """Every micro-batch of every process holds micro_batch samples."""
        return self.global_batch == self.world_size * self.micro_batch * self.grad_accum

    def share(self, rank: int) -> int:
        """Samples process `rank` takes a step."""
        base, extra = divmod(self.global_batch, self.world_size)
        return base + (rank < extra)

    def micro_sizes(self, rank: int) -> list[int]:
        """The samples of each of process `rank`'s micro-batches in a step, in order."""
        if self.even:
            return [self.micro_batch] * self.grad_accum
        base, extra = divmod(self.share(rank), self.grad_accum)
        return [base + 1] * extra + [base] * (self.grad_accum - extra)

    def loss_weights(self, rank: int) -> list[float] | None:
        """What each micro-batch's mean loss is multiplied by on process `rank`, or None for an
        even layout, whose micro-batches are divided by grad_accum as they always were (the same
        weight, written so the configured size stays bit-identical to earlier versions)."""
        if self.even:
            return None
        return [size * self.world_size / self.global_batch for size in self.micro_sizes(rank)]

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Layout:
        fields = int(saved["world_size"]), int(saved["micro_batch"]), int(saved["grad_accum"])
        return cls(*fields, int(saved.get("global_batch", 0)))


def resized(global_batch: int, world_size: int, max_micro_batch: int) -> Layout:
    """The layout that keeps `global_batch` on `world_size` processes, with micro-batches of at
    most `max_micro_batch` samples and the fewest of them; UserError where no process count's split
    can work (a process left without a sample, or micro-batches that cannot be equal in number)."""
    largest_share = -(-global_batch // world_size)
    accum = -(-largest_share // max_micro_batch)
    if global_batch % world_size == 0 and largest_share % accum == 0:
        return Layout(world_size, largest_share // accum, accum)
    smallest_share = global_batch // world_size
    if smallest_share < accum:
        raise UserError(_refusal(global_batch, world_size, max_micro_batch))
    return Layout(world_size, -(-largest_share // accum), accum, global_batch)


def _refusal(global_batch: int, world_size: int, max_micro_batch: int) -> str:
    fitting = divisors(global_batch)
    shown = ", ".join(str(n) for n in fitting[:8]) + (" ..." if len(fitting) > 8 else "")
    if global_batch < world_size:
        why = f"{world_size} processes would leave {world_size - global_batch} of them without a sample each step"
    else:
        low, high = global_batch // world_size, global_batch // world_size + 1
        why = (
            f"{world_size} processes would take {high} or {low} samples a step, and in micro-batches of at most "
            f"data.batch_size={max_micro_batch} they would need {high} and {low} micro-batches: every process must "
            "take the same number"
        )
    return (
        f"trainer.elastic: this run's global batch is {global_batch} samples; {why}. Resume it on a process "
        f"count that divides {global_batch} ({shown})"
    )


def divisors(number: int) -> list[int]:
    return [n for n in range(1, number + 1) if number % n == 0]


def moved_position(batch_in_epoch: int, old: Layout, new: Layout) -> int:
    """A data position (micro-batches each process consumed this epoch) in `old`'s layout,
    counted in `new`'s. Exact at step boundaries, where every checkpoint is taken: both layouts
    train the same G samples a step."""
    steps, within = divmod(batch_in_epoch, old.grad_accum)
    if within or old.global_batch != new.global_batch:
        raise ValueError(f"position {batch_in_epoch} of {old} is not a whole number of {new}'s steps")
    return steps * new.grad_accum


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


def range_refusal(sizes: range, tasks_per_node: int, micro_batch: int, grad_accum: int) -> str | None:
    """Why a Slurm node range cannot train elastically, or None: a run keeps the global batch of
    its first life (micro_batch x grad_accum x its processes), so every size of the range it may
    start on must be able to go on at every other size."""
    cannot = []
    for first in sizes:
        global_batch = micro_batch * grad_accum * first * tasks_per_node
        for then in sizes:
            try:
                resized(global_batch, then * tasks_per_node, micro_batch)
            except UserError:
                cannot.append(f"started on {first} (a global batch of {global_batch}) it cannot go on on {then}")
    if not cannot:
        return None
    return (
        f"nodes {sizes.start}-{sizes.stop - 1} with {tasks_per_node} process{'es' if tasks_per_node > 1 else ''} "
        f"each and data.batch_size="
        f"{micro_batch}: {'; '.join(cannot)} (a process would get no sample, or the processes would need different "
        "numbers of micro-batches); raise "
        "data.batch_size (and lower trainer.grad_accum to keep the batch), or narrow the range to sizes that "
        "divide each other's global batches"
    )
