"""A sweep's cost: its points' allocations added up, for the line above the table and --json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.status import discover
from hpctrain.status.cost import Cost, total
from hpctrain.status.detail import cost_words
from hpctrain.status.rows import Row
from hpctrain.status.table import shown_path


@dataclass(frozen=True)
class SweepCost:
    sweep_dir: Path
    runs: list[Path]  # its points shown in this status
    cost: Cost

    def header(self, cwd: Path | None = None) -> str:
        """`sweep runs/multirun/2026-11-22/12-00-00: 6 runs; 48.2 GPU-h allocated, ...`"""
        where = shown_path(self.sweep_dir, cwd or Path.cwd())
        count = f"{len(self.runs)} run{'s' if len(self.runs) != 1 else ''}"
        return f"sweep {where}: {count}; {cost_words(self.cost)}"

    def to_json(self) -> dict[str, Any]:
        return {"sweep_dir": str(self.sweep_dir.resolve()), "runs": len(self.runs), **self.cost.to_json(False)}


def sweep_costs(paths: list[Path], rows: list[Row]) -> list[SweepCost]:
    """One total per named sweep dir (hpctrain-submit -m, hpctrain-train -m, hpctrain-tune)."""
    by_dir = {row.run_dir.resolve(): row for row in rows}
    sweeps = []
    for path in paths:
        points = [p.resolve() for p in discover.sweep_points(path) if p.resolve() in by_dir]
        if points:
            costs = [by_dir[p].cost for p in points]
            allocations = [a for cost in costs if cost is not None for a in cost.allocations]
            sweeps.append(SweepCost(path, [by_dir[p].run_dir for p in points], total(allocations)))
    return sweeps
