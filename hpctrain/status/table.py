"""The status table: one row per run, columns sized to their content."""

from __future__ import annotations

import math
import os
from pathlib import Path

from hpctrain.status.cost import Cost, hours
from hpctrain.status.rows import Row

# NODE-H: node-hours allocated; GPU-H: GPU-hours allocated / of them, on kept steps (cost.py).
# New columns go before RUN DIR, which stays last (a path may hold spaces).
HEADER = (
    "JOB",
    "STATE",
    "RESTARTS",
    "STEP",
    "LOSS",
    "EVAL ACC",
    "SAMPLES/S",
    "CKPT AGE",
    "NODE-H",
    "GPU-H",
    "RUN DIR",
)
# Numbers read best aligned on the right.
_RIGHT = {"RESTARTS", "STEP", "LOSS", "EVAL ACC", "SAMPLES/S", "CKPT AGE", "NODE-H", "GPU-H"}


def render(rows: list[Row], cwd: Path | None = None) -> str:
    cells = [HEADER, *(_cells(row, cwd or Path.cwd()) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    lines = []
    for line in cells:
        padded = [
            value.rjust(width) if name in _RIGHT else value.ljust(width)
            for name, value, width in zip(HEADER, line, widths)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _cells(row: Row, cwd: Path) -> tuple[str, ...]:
    return (
        row.job_id or "local",
        row.state,
        str(row.restarts),
        f"{_int(row.step)}/{_int(row.max_steps)}",
        _float(row.loss, "{:.4f}"),
        _float(row.eval_accuracy, "{:.4f}"),
        _float(row.samples_per_s, "{:.0f}"),
        age(row.checkpoint_age_s),
        node_hours(row.cost),
        gpu_hours(row.cost),
        shown_path(row.run_dir, cwd),
    )


def node_hours(cost: Cost | None) -> str:
    return "-" if cost is None or not cost.allocations else hours(cost.node_s)


def gpu_hours(cost: Cost | None) -> str:
    """`12.4/10.1`: allocated, then on kept steps; `-` for a run without GPUs."""
    if cost is None or cost.gpu_s is None:
        return "-"
    return f"{hours(cost.gpu_s)}/{hours(cost.kept_gpu_s)}"


def age(seconds: float | None) -> str:
    """45s, 12m, 3h05m, 2d04h: enough to see whether checkpoints keep coming."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def shown_path(path: Path, cwd: Path) -> str:
    """Relative to where the command runs when the run is below it (runs/...), else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(cwd))
    except ValueError:
        return str(absolute)


def _int(value: int | None) -> str:
    return "?" if value is None else str(value)


def _float(value: float | None, form: str) -> str:
    if value is None:
        return "-"
    return "nan" if not math.isfinite(value) else form.format(value)
