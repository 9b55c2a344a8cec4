"""The study's summary for hpctrain-status: read tune.json (written after every tell), no optuna."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpctrain.run.paths import TuneDir


def read_summary(folder: Path) -> dict[str, Any] | None:
    """tune.json of a hpctrain-tune sweep dir, or None for any other folder (or before it exists)."""
    tune = TuneDir(folder)
    if not tune.is_study():
        return None
    try:
        return dict(json.loads(tune.summary.read_text()))
    except (OSError, ValueError):
        return None


def render_summary(folder: Path, summary: dict[str, Any]) -> str:
    """Two or three lines: the counts against the budget, then the best trial so far."""
    counts = summary.get("counts", {})
    ended = sum(int(counts.get(k, 0)) for k in ("complete", "pruned", "failed"))
    over = "" if counts.get("running") or ended < summary.get("n_trials", 0) else ", search over"
    lines = [
        f"study {summary.get('study_name')} in {folder}: {summary.get('direction')} {summary.get('metric')}; "
        f"{ended} of {summary.get('n_trials')} trials ended (complete {counts.get('complete', 0)}, "
        f"pruned {counts.get('pruned', 0)}, failed {counts.get('failed', 0)}), running {counts.get('running', 0)} "
        f"of {summary.get('parallel')} at once{over}"
    ]
    best = summary.get("best")
    if best is None:
        lines.append("best: none yet (no trial has completed)")
    else:
        params = ", ".join(f"{k}={_short(v)}" for k, v in best.get("params", {}).items())
        lines.append(f"best: trial {best['number']} {summary.get('metric')}={_short(best['value'])} ({params})")
        lines.append(f"      run dir {best['run_dir']}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
