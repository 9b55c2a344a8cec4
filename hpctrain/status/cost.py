"""What a run cost: the node-hours and GPU-hours its allocations held, and the GPU-hours that
trained the steps it kept. Pure functions over the run's records, its goodput, and what
accounting says (hpctrain.status.usage). Definitions (also in docs/operate.md):

- An allocation is one life of a Slurm job: the first start, and each start after a requeue
  (one SLURM_RESTART_COUNT). A relaunch onto spare nodes stays in the same allocation.
- From the records: an allocation's time is the sum of its goodput lives' allocated time (from
  the batch script's start, `allocated_at`, to the life's last record, or now for a running
  life); its nodes are, after a relaunch, the nodes that trained plus the relaunch's
  `spare_nodes` left (the failed ones left the allocation), else the `start`'s `job_nodes`, else
  the nodes that trained plus the spares (a requeue's lowered `nodes`, or config.yaml's
  slurm.spare_nodes as of that start); its GPUs are `gpus_per_node` x nodes, from the `start`, else
  config.yaml's slurm.gpus_per_node as of that start. A run of hpctrain-train holds one node and
  the CUDA devices its ranks drove.
- From sacct (where accounting runs, it wins): ElapsedRaw x AllocTRES `node=`, and `gres/gpu=`
  where the site's accounting counts GPUs; elsewhere the GPUs per node come from the records and
  are multiplied by sacct's node count (`gpus_source` says which). Allocations sacct knows that
  the records do not (a life ended before its `start`) count too, with nothing kept.
- node-hours = sum of time x nodes; GPU-hours = sum of time x GPUs (none for a run without GPUs:
  shown as `-`, never 0 made up as a number of a GPU run).
- kept GPU-hours = sum over goodput lives of kept time x the allocation's GPUs: the GPU-hours
  held while the run trained steps that survive into its final weights (its last logged step
  while it runs). The share kept = kept GPU-hours / GPU-hours (kept node-hours / node-hours
  without GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpctrain.run.events import Event, Relaunch, Replanned, Requeue, Start
from hpctrain.slurm import client
from hpctrain.status.goodput import Goodput
from hpctrain.status.usage import Usage

SACCT = client.SACCT  # the numbers accounting gave (hpctrain-status shows the source by name)
RECORDS = "records"
_HOUR = 3600.0


@dataclass(frozen=True)
class Plan:
    """config.yaml's keys that shape an allocation (the job's sbatch directives come from them)."""

    gpus_per_node: int = 0
    spare_nodes: int = 0


@dataclass(frozen=True)
class Shape:
    """What one life held, from its records."""

    nodes: int
    gpus: int  # all nodes together; 0 on CPU nodes
    gpus_per_node: int


@dataclass(frozen=True)
class Allocation:
    job_id: str | None  # None: hpctrain-train on this machine
    restart: int | None
    elapsed_s: float
    nodes: int  # at its start (a relaunch may leave fewer)
    gpus: int | None  # at its start, all nodes together; None: no GPU
    node_s: float
    gpu_s: float | None
    kept_s: float
    kept_node_s: float
    kept_gpu_s: float | None
    source: str  # sacct | records: the time and the nodes
    gpus_source: str  # sacct | records: the GPUs

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "restart": self.restart,
            "elapsed_s": round(self.elapsed_s, 3),
            "nodes": self.nodes,
            "gpus": self.gpus,
            "node_hours": _hours(self.node_s),
            "gpu_hours": _hours(self.gpu_s),
            "kept_s": round(self.kept_s, 3),
            "kept_gpu_hours": _hours(self.kept_gpu_s),
            "source": self.source,
            "gpus_source": self.gpus_source if self.gpus is not None else None,
        }


@dataclass(frozen=True)
class Cost:
    allocations: list[Allocation]
    node_s: float
    gpu_s: float | None  # None: no allocation held a GPU
    kept_node_s: float
    kept_gpu_s: float | None
    source: str | None  # sacct | records | sacct+records; None: nothing allocated yet
    gpus_source: str | None

    @property
    def kept_pct(self) -> float | None:
        """The share of the allocated GPU-hours (node-hours without GPUs) that trained kept steps."""
        if self.gpu_s:
            return 100.0 * (self.kept_gpu_s or 0.0) / self.gpu_s
        if self.gpu_s is None and self.node_s > 0:
            return 100.0 * self.kept_node_s / self.node_s
        return None

    def to_json(self, with_allocations: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {
            "node_hours": _hours(self.node_s),
            "gpu_hours": _hours(self.gpu_s),
            "kept_gpu_hours": _hours(self.kept_gpu_s),
            "kept_node_hours": _hours(self.kept_node_s),
            "kept_pct": None if self.kept_pct is None else round(self.kept_pct, 3),
            "source": self.source,
            "gpus_source": self.gpus_source,
        }
        if with_allocations:
            record["allocations"] = [a.to_json() for a in self.allocations]
        return record


def run_cost(
    events: Sequence[Event],
    figures: Goodput,
    plan: Plan,
    usage: Mapping[str, list[Usage]],
    job_ids: Sequence[str] = (),
) -> Cost:
    """The run's cost. figures: goodput_of the same events (counted until now for a running run);
    usage: sacct's lives of the run's jobs (empty without accounting); job_ids: the run's jobs
    beyond those its `start`s name (the one submitted last, which may have ended before its start)."""
    starts = [e for e in events if isinstance(e, Start)]
    shapes = life_shapes(events, plan)
    return total(allocations(figures, shapes, usage, [*(s.job_id for s in starts), *job_ids]))


def life_shapes(events: Sequence[Event], plan: Plan) -> list[Shape]:
    """One Shape per `start` (goodput's lives, in order), from what the records say."""
    shapes: list[Shape] = []
    relaunch: Relaunch | None = None
    lowered: int | None = None
    for event in events:
        if isinstance(event, Start):
            moved = relaunch if relaunch is not None and relaunch.job_id == event.job_id else None
            shapes.append(_shape(event, moved, lowered, plan_at(plan, events, event.time)))
            relaunch, lowered = None, None
        elif isinstance(event, Relaunch):
            relaunch = event
        elif isinstance(event, Requeue):
            lowered = event.nodes
    return shapes


def _shape(start: Start, relaunch: Relaunch | None, lowered: int | None, plan: Plan) -> Shape:
    trained_on = max(1, len(start.nodes))
    if start.job_id is None:  # hpctrain-train: this machine and the CUDA devices its ranks drove
        devices = {str(r.get("device")) for r in start.ranks or [] if isinstance(r, dict)}
        gpus = sum(1 for d in devices if d.startswith("cuda"))
        return Shape(1, gpus, gpus)
    if relaunch is not None:  # the allocation lost its failed nodes; these spares are left
        nodes = trained_on + relaunch.spare_nodes
    elif start.job_nodes is not None:
        nodes = start.job_nodes
    elif lowered is not None:  # requeued with fewer nodes than asked at submit time
        nodes = max(trained_on, lowered)
    else:
        nodes = trained_on + plan.spare_nodes
    per_node = start.gpus_per_node if start.gpus_per_node is not None else plan.gpus_per_node
    return Shape(nodes, nodes * per_node, per_node)


def plan_at(plan: Plan, events: Sequence[Event], time: float) -> Plan:
    """The plan of a life started at `time`: config.yaml's, with the old value of each key a
    later `replanned` changed (the earliest such change holds the value the life ran with)."""
    values = {"slurm.gpus_per_node": plan.gpus_per_node, "slurm.spare_nodes": plan.spare_nodes}
    for event in reversed(events):
        if isinstance(event, Replanned) and event.time > time:
            for key in values:
                old = (event.changes.get(key) or [None])[0]
                if isinstance(old, int) and not isinstance(old, bool):
                    values[key] = old
    return Plan(values["slurm.gpus_per_node"], values["slurm.spare_nodes"])


@dataclass
class _Held:
    """An allocation's goodput lives added up from the records."""

    job_id: str | None
    restart: int | None
    elapsed_s: float = 0.0
    node_s: float = 0.0
    gpu_s: float = 0.0
    kept_s: float = 0.0
    kept_node_s: float = 0.0
    kept_gpu_s: float = 0.0
    shape: Shape | None = None  # its first life's


def allocations(
    figures: Goodput, shapes: Sequence[Shape], usage: Mapping[str, list[Usage]], job_ids: Sequence[str | None]
) -> list[Allocation]:
    """Each allocation of the run, in the order of its jobs, then of their restarts."""
    held: dict[tuple[str | None, int | None], _Held] = {}
    for life, shape in zip(figures.lives, shapes):
        key = (life.job_id, life.restart)
        entry = held.setdefault(key, _Held(life.job_id, life.restart, shape=shape))
        entry.elapsed_s += life.allocated_s
        entry.node_s += life.allocated_s * shape.nodes
        entry.gpu_s += life.allocated_s * shape.gpus
        entry.kept_s += life.kept_s
        entry.kept_node_s += life.kept_s * shape.nodes
        entry.kept_gpu_s += life.kept_s * shape.gpus
    found: list[Allocation] = []
    for job_id in dict.fromkeys([*(life.job_id for life in figures.lives), *job_ids]):
        lives = usage.get(job_id, []) if job_id is not None else []
        accounted = {restart: u for restart, u in enumerate(lives) if u.allocated}
        by_restart = {(key[1] or 0): sums for key, sums in held.items() if key[0] == job_id}
        for restart in sorted({*accounted, *by_restart}):
            if restart in accounted:
                found.append(_from_sacct(job_id, restart, accounted[restart], by_restart.get(restart)))
            else:
                found.append(_from_records(by_restart[restart]))
    return found


def _from_records(entry: _Held) -> Allocation:
    shape = entry.shape or Shape(1, 0, 0)
    gpus = shape.gpus > 0 or entry.gpu_s > 0
    return Allocation(
        job_id=entry.job_id,
        restart=entry.restart,
        elapsed_s=entry.elapsed_s,
        nodes=shape.nodes,
        gpus=shape.gpus if gpus else None,
        node_s=entry.node_s,
        gpu_s=entry.gpu_s if gpus else None,
        kept_s=entry.kept_s,
        kept_node_s=entry.kept_node_s,
        kept_gpu_s=entry.kept_gpu_s if gpus else None,
        source=RECORDS,
        gpus_source=RECORDS,
    )


def _from_sacct(job_id: str | None, restart: int, usage: Usage, entry: _Held | None) -> Allocation:
    if usage.gpus is not None:
        gpus, gpus_source = usage.gpus, SACCT
    else:  # the site's accounting does not count GPUs: the records' per node, on sacct's nodes
        per_node = entry.shape.gpus_per_node if entry is not None and entry.shape is not None else 0
        gpus, gpus_source = usage.nodes * per_node, RECORDS
    elapsed = float(usage.elapsed_s)
    kept = min(entry.kept_s, elapsed) if entry is not None else 0.0
    return Allocation(
        job_id=job_id,
        restart=restart,
        elapsed_s=elapsed,
        nodes=usage.nodes,
        gpus=gpus or None,
        node_s=elapsed * usage.nodes,
        gpu_s=elapsed * gpus if gpus else None,
        kept_s=kept,
        kept_node_s=kept * usage.nodes,
        kept_gpu_s=kept * gpus if gpus else None,
        source=SACCT,
        gpus_source=gpus_source,
    )


def total(parts: Sequence[Allocation]) -> Cost:
    """Allocations added up (a run's, or a sweep's: every allocation of its runs)."""
    with_gpus = [a for a in parts if a.gpu_s is not None]
    return Cost(
        allocations=list(parts),
        node_s=sum(a.node_s for a in parts),
        gpu_s=sum(a.gpu_s or 0.0 for a in with_gpus) if with_gpus else None,
        kept_node_s=sum(a.kept_node_s for a in parts),
        kept_gpu_s=sum(a.kept_gpu_s or 0.0 for a in with_gpus) if with_gpus else None,
        source=_sources(a.source for a in parts),
        gpus_source=_sources(a.gpus_source for a in with_gpus),
    )


def _sources(names: Iterable[str]) -> str | None:
    found = set(names)
    if not found:
        return None
    return SACCT if found == {SACCT} else RECORDS if found == {RECORDS} else f"{SACCT}+{RECORDS}"


def read_plan(config: Path) -> Plan:
    """slurm.gpus_per_node and slurm.spare_nodes of a run's config.yaml (0 where unreadable)."""
    try:
        with open(config, encoding="utf-8") as file:
            loaded = yaml.load(file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, yaml.YAMLError):
        return Plan()
    slurm = loaded.get("slurm") if isinstance(loaded, dict) else None
    slurm = slurm if isinstance(slurm, dict) else {}
    return Plan(_count(slurm.get("gpus_per_node")), _count(slurm.get("spare_nodes")))


def hours(seconds: float | None) -> str:
    """A number of hours for the table: `-` for none, more digits while small."""
    if seconds is None:
        return "-"
    value = seconds / _HOUR
    if value < 0.1:
        return f"{value:.3f}"
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / _HOUR, 6)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
