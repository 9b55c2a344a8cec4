"""hpctrain-status --detail: one run's lives and its goodput, as text.

run dir runs/2026-11-22/10-04-31: job 4121, RUNNING, step 1200/5000
LIFE  JOB   RESTART  STARTED   ALLOCATED  START-UP  KEPT    STALLS  REDONE  STEPS KEPT  STATE FROM  ENDED BY
   1  4121        0  10:04:31     12m03s      0.0s  11m50s    1.2s   11.2s  0-1100      -           requeue (preempt)
goodput 96.1%: 1h02m kept of 1h04m allocated; lost: start-up 0.0s, checkpoint stalls 3.1s,
redone 1m00s; waits between lives 4m02s (not allocated, not counted)
cost: 1.61 GPU-h allocated, 1.58 on kept steps (98.1%); 0.40 node-h (from sacct)
ALLOC  JOB   RESTART  ELAPSED  NODES  GPUS  NODE-H  GPU-H  KEPT GPU-H  SOURCE  GPUS FROM
    1  4121        0   12m03s      2     4    0.40   1.61        1.58  sacct   sacct
"""

from __future__ import annotations

import time
from pathlib import Path

from hpctrain.status.cost import Allocation, Cost, hours
from hpctrain.status.goodput import Goodput, Life
from hpctrain.status.rows import Row
from hpctrain.status.table import shown_path

HEADER = (
    "LIFE",
    "JOB",
    "RESTART",
    "STARTED",
    "ALLOCATED",
    "START-UP",
    "KEPT",
    "STALLS",
    "REDONE",
    "STEPS KEPT",
    "STATE FROM",  # memory (the in-memory tier), disk (a checkpoint), - (a fresh start)
    "ENDED BY",
)
_RIGHT = {0, 2, 4, 5, 6, 7, 8}  # numeric columns, right-aligned
COST_HEADER = (
    "ALLOC",
    "JOB",
    "RESTART",
    "ELAPSED",
    "NODES",
    "GPUS",
    "NODE-H",
    "GPU-H",
    "KEPT GPU-H",
    "SOURCE",
    "GPUS FROM",
)
_COST_RIGHT = {0, 2, 3, 4, 5, 6, 7, 8}


def render_detail(row: Row, figures: Goodput, cwd: Path | None = None) -> str:
    where = shown_path(row.run_dir, cwd or Path.cwd())
    steps = f"{row.step if row.step is not None else '-'}/{row.max_steps if row.max_steps is not None else '?'}"
    lines = [f"run dir {where}: job {row.job_id or 'local'}, {row.state}, step {steps}"]
    if figures.lives:
        lines.append(_table([HEADER, *(_cells(n, life) for n, life in enumerate(figures.lives, 1))]))
    lines.append(summary(figures))
    if row.cost is not None:
        lines.append(cost_summary(row.cost))
        if row.cost.allocations:
            rows = [COST_HEADER, *(_cost_cells(n, a) for n, a in enumerate(row.cost.allocations, 1))]
            lines.append(_table(rows, _COST_RIGHT))
    return "\n".join(lines)


def cost_summary(cost: Cost) -> str:
    """`cost: 1.61 GPU-h allocated, 1.58 on kept steps (98.1%); 0.40 node-h (from sacct)`."""
    return f"cost: {cost_words(cost)}"


def cost_words(cost: Cost) -> str:
    if not cost.allocations:
        return "nothing allocated yet"
    share = f" ({cost.kept_pct:.1f}%)" if cost.kept_pct is not None else ""
    where = f"from {cost.source}" + (
        f", GPUs from {cost.gpus_source}" if cost.gpus_source and cost.gpus_source != cost.source else ""
    )
    if cost.gpu_s is None:
        return (
            f"no GPUs; {hours(cost.node_s)} node-h allocated, {hours(cost.kept_node_s)} on kept steps{share} ({where})"
        )
    return (
        f"{hours(cost.gpu_s)} GPU-h allocated, {hours(cost.kept_gpu_s)} on kept steps{share}; "
        f"{hours(cost.node_s)} node-h ({where})"
    )


def summary(figures: Goodput) -> str:
    if figures.goodput_pct is None:
        return "goodput: no training started yet"
    return (
        f"goodput {figures.goodput_pct:.1f}%: {duration(figures.kept_s)} kept of {duration(figures.allocated_s)} "
        f"allocated; lost: start-up {duration(figures.startup_s)}, checkpoint stalls {duration(figures.stall_s)}, "
        f"redone {duration(figures.redone_s)}"
        + (f", detection {duration(figures.detection_s)}" if figures.detection_s > 0 else "")
        + f"; waits between lives {duration(figures.wait_s)} "
        "(not allocated, not counted)"
    )


def duration(seconds: float) -> str:
    """1.2s, 3m05s, 2h04m: seconds to a tenth while short, then coarser."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _cells(number: int, life: Life) -> tuple[str, ...]:
    ended_by = life.ending + (f" ({life.cause})" if life.cause else "")
    return (
        str(number),
        life.job_id or "local",
        str(life.restart) if life.restart is not None else "-",
        time.strftime("%H:%M:%S", time.localtime(life.started)),
        duration(life.allocated_s),
        duration(life.startup_s),
        duration(life.kept_s),
        duration(life.stall_s),
        duration(life.redone_s),
        f"{life.resumed_from}-{life.kept_to}",
        life.state_from or "-",
        ended_by,
    )


def _cost_cells(number: int, allocation: Allocation) -> tuple[str, ...]:
    has_gpus = allocation.gpus is not None
    return (
        str(number),
        allocation.job_id or "local",
        str(allocation.restart) if allocation.restart is not None else "-",
        duration(allocation.elapsed_s),
        str(allocation.nodes),
        str(allocation.gpus) if has_gpus else "-",
        hours(allocation.node_s),
        hours(allocation.gpu_s),
        hours(allocation.kept_gpu_s),
        allocation.source,
        allocation.gpus_source if has_gpus else "-",
    )


def _table(rows: list[tuple[str, ...]], right: set[int] = _RIGHT) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    )
