"""Which run dirs to show: named run dirs, sweep dirs (their points), or folders holding runs."""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.run.paths import RunDir, TuneDir

# hydra.run.dir (runs/<date>/<time>) and hydra.sweep.dir (runs/multirun/<date>/<time>/<point>)
# of conf/config.yaml both start here, relative to where the command was run.
DEFAULT_ROOT = Path("runs")
DEFAULT_LIMIT = 20
# runs/multirun/<date>/<time>/<point> is the deepest default layout; a search stops there so a
# mistyped `/` never walks a whole disk.
MAX_DEPTH = 5
# Files that only a run dir holds: the journal (once trained), submission.json (once queued).
_NAMES = RunDir(Path("."))
_RUN_FILES = tuple(p.name for p in (_NAMES.events, _NAMES.submission, _NAMES.metrics))
# What Hydra writes at the top of a sweep dir (hpctrain-submit -m, hpctrain-train -m).
_SWEEP_FILE = "multirun.yaml"


class NotARunDir(ValueError):
    """A path given by the user holds no run; the message names it."""


def is_run_dir(path: Path) -> bool:
    """A run dir before its first step holds config.yaml beside Hydra's .hydra/; a config.yaml
    alone may be a project's own Hydra config folder (conf/config.yaml), not a run."""
    if any((path / name).is_file() for name in _RUN_FILES):
        return True
    return RunDir(path).config.is_file() and (path / ".hydra").is_dir()


def run_dirs(paths: list[Path], limit: int = DEFAULT_LIMIT) -> list[Path]:
    """The run dirs to show, in order: each named run dir as given, a sweep's points by number,
    the runs found under any other folder most recent first (at most `limit` of them per folder;
    0 for all). Raises NotARunDir for a path that holds none."""
    found: list[Path] = []
    for path in paths or [DEFAULT_ROOT]:
        found.extend(_expand(path, limit, named=bool(paths)))
    unique: dict[Path, Path] = {}
    for run in found:
        unique.setdefault(run.resolve(), run)
    return list(unique.values())


def _expand(path: Path, limit: int, named: bool) -> list[Path]:
    if not path.exists():
        where = "" if named else " (hpctrain's default output folder); name a run dir or a folder of runs"
        raise NotARunDir(f"{path}: no such directory{where}")
    if not path.is_dir():
        raise NotARunDir(f"{path} is not a run dir (it is a file)")
    if is_run_dir(path):
        return [path]
    points = _sweep_points(path)
    if points:
        return points
    runs = _search(path)
    if not runs and named:
        raise NotARunDir(
            f"{path} is not a run dir, a sweep dir or a folder holding runs "
            f"(no {', '.join(_RUN_FILES)}, or config.yaml beside .hydra/, within {MAX_DEPTH} levels)"
        )
    runs.sort(key=last_activity, reverse=True)
    return runs[:limit] if limit > 0 else runs


def sweep_points(path: Path) -> list[Path]:
    """A sweep dir's points (run dirs) in Hydra's numbering; [] for a folder that is no sweep dir."""
    return _sweep_points(path)


def _sweep_points(path: Path) -> list[Path]:
    """A sweep dir's points in Hydra's numbering (0, 1, ..., 10), not in the order 0, 1, 10;
    hpctrain-tune's trials likewise, by trial number."""
    if not (path / _SWEEP_FILE).is_file() and not TuneDir(path).is_study():
        return []
    children = [Path(entry.path) for entry in _subdirs(path)]
    points = [child for child in children if is_run_dir(child)]
    return sorted(points, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def _search(root: Path) -> list[Path]:
    """Run dirs under root, without descending into one (its checkpoints/ holds no runs)."""
    found: list[Path] = []
    level = [root]
    for _ in range(MAX_DEPTH):
        below: list[Path] = []
        for folder in level:
            for entry in _subdirs(folder):
                child = Path(entry.path)
                (found if is_run_dir(child) else below).append(child)
        level = below
    return found


def _subdirs(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            # Hidden folders are Hydra's .hydra/ and the like, never runs.
            return [e for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except OSError:  # unreadable: it holds no run this user can see
        return []


def last_activity(run: Path) -> float:
    """When the run last wrote anything it is known by: a running job keeps moving to the top."""
    newest = 0.0
    for name in (_NAMES.config.name, *_RUN_FILES):
        try:
            newest = max(newest, (run / name).stat().st_mtime)
        except OSError:
            continue
    return newest
