"""What accounting says one life of a job held: sacct's ElapsedRaw and AllocTRES.

    23817010|COMPLETED|23817010|3|billing=2,cpu=2,gres/gpu=4,node=2

AllocTRES counts the whole allocation (every node: `gres/gpu=4` for 2 nodes x 2 GPUs). It names
`gres/gpu` only where the site tracks it (`AccountingStorageTRES=gres/gpu`; Slurm's default does
not): without it accounting cannot tell a CPU job from a GPU job, and the GPUs come from the run's
records. Where any line of an answer names `gres/gpu` the site tracks it, and a line without it
held no GPU. A pending life has no allocation yet (ElapsedRaw 0, AllocTRES empty); a running one's
ElapsedRaw is its time so far. Lines as the dev cluster printed them: tests/fixtures/sacct_usage/.
"""

from __future__ import annotations

from dataclasses import dataclass

# sacct's fields after JobIDRaw, State and JobID (hpctrain.status.slurm_query.SACCT_FIELDS).
_ELAPSED, _TRES = 3, 4


@dataclass(frozen=True)
class Usage:
    state: str  # the life's state as sacct spells it (REQUEUED, COMPLETED, RUNNING, ...)
    elapsed_s: int  # ElapsedRaw
    nodes: int  # AllocTRES node=
    gpus: int | None  # AllocTRES gres/gpu=, all nodes together; None: not tracked (not 0 GPUs)

    @property
    def allocated(self) -> bool:
        return self.nodes > 0


def usage_of(parts: list[str], gpus_tracked: bool) -> Usage | None:
    """One sacct line split at `|`; None when it lacks the usage fields (an older format).
    gpus_tracked: the site's accounting counts GPUs (a line without gres/gpu held none)."""
    if len(parts) <= _TRES or not parts[_ELAPSED].isdigit():
        return None
    tres = parse_tres(parts[_TRES])
    gpus = tres.get("gres/gpu", 0 if gpus_tracked else None)
    return Usage(parts[1].split()[0] if parts[1] else "", int(parts[_ELAPSED]), tres.get("node", 0), gpus)


def tracks_gpus(text: str) -> bool:
    """Whether any line of sacct's answer counts GPUs (`gres/gpu=`)."""
    return "gres/gpu=" in text


def parse_tres(text: str) -> dict[str, int]:
    """`billing=4,cpu=4,gres/gpu=4,mem=16G,node=2` -> the counts that are whole numbers
    (`mem=16G` and the like are left out; a typed `gres/gpu:a100=4` repeats `gres/gpu=4`)."""
    counts: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep and value.isdigit():
            counts[name.strip()] = int(value)
    return counts
