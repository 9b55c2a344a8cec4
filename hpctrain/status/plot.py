"""--plot FILE.png: loss and eval accuracy of the listed runs against step.

matplotlib comes with the optional extra `plot` (pip install 'hpctrain[plot]'); hpctrain itself
never needs it, so it is imported only here, and its absence is one error line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir
from hpctrain.status.rows import Row
from hpctrain.status.table import shown_path

INSTALL_HINT = "pip install 'hpctrain[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed, or the image cannot be written; the message says which."""


def require_matplotlib() -> None:
    """Checked before anything else runs, so a missing extra is said at once."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None


def curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of loss, eval_accuracy and eval_loss. A resumed run logs again the steps
    after its last checkpoint: the later line of a step wins, so a curve never runs backwards."""
    by_step: dict[str, dict[int, float]] = {"loss": {}, "eval_accuracy": {}, "eval_loss": {}}
    for record in read_jsonl(RunDir(run).metrics):
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key, points in by_step.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                points[step] = float(value)
    return {key: sorted(points.items()) for key, points in by_step.items()}


def draw(rows: list[Row], path: Path, cwd: Path | None = None) -> None:
    require_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    loss_axes, eval_axes = figure.subplots(1, 2)
    runs = [(row, curves(row.run_dir)) for row in rows]
    # Models without classes (a GPT) log eval_loss only: plot that when no run has an accuracy.
    eval_key = "eval_accuracy" if any(c["eval_accuracy"] for _, c in runs) else "eval_loss"
    for row, run_curves in runs:
        label = _label(row, cwd)
        _line(loss_axes, run_curves["loss"], label)
        _line(eval_axes, run_curves[eval_key], label, marker="o")
    for axes, title in ((loss_axes, "loss"), (eval_axes, eval_key.replace("_", " "))):
        axes.set_xlabel("step")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        if axes.get_lines():
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "nothing logged yet", ha="center", va="center", transform=axes.transAxes)
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise PlotUnavailable(f"--plot: cannot write {path}: {error.strerror or error}") from None
    except ValueError as error:  # an image format matplotlib does not know, from the suffix
        raise PlotUnavailable(f"--plot: cannot write {path}: {error}") from None


def _line(axes: Any, points: list[tuple[int, float]], label: str, marker: str | None = None) -> None:
    if points:
        steps, values = zip(*points)
        axes.plot(steps, values, label=label, marker=marker, markersize=3)


def _label(row: Row, cwd: Path | None) -> str:
    where = shown_path(row.run_dir, cwd or Path.cwd())
    return f"{row.job_id} {where}" if row.job_id else where
