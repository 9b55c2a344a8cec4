"""The code a job runs, frozen when it is submitted (`slurm.code_snapshot`, on by default).

A requeued job starts Python again, and would import whatever is on disk by then: a user who
edits, pulls or reinstalls while jobs wait gets points trained with other code, and a resumed
run no longer matches an uninterrupted one. So at submit time the importable code is copied into
a `code/` folder (the run dir's, or the sweep dir's, shared by its points), and the batch script
puts that folder first on PYTHONPATH for every task and control step of every life of the job.

What is copied: hpctrain's package, and the top-level package (or module) of every `_target_` in
the config that is your code (your project, an editable install, a folder of sources on
PYTHONPATH). Installed libraries (torch, torchvision, ...) are not copied: they are recorded with
where they came from. A library is code inside the Python installation, or code an installer
recorded beside it (a `*.dist-info` in the same folder naming it): a site's `module load pytorch`
puts such a folder on PYTHONPATH, and copying its torch would write a gigabyte per submit.

Where the copied code is a git checkout, `snapshot.json` records the commit and `git-<n>.diff`
the uncommitted changes to tracked files, so the run can be traced back to a commit even after
the snapshot is deleted.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import logging
import shutil
import site
import sys
import sysconfig
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import hpctrain
from hpctrain.run.paths import CODE_MANIFEST
from hpctrain.submit import git_state

log = logging.getLogger(__name__)

MANIFEST = CODE_MANIFEST
# Never worth copying: bytecode is rebuilt from the copied sources.
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")


def targets_in(tree: Any) -> list[str]:
    """Every `_target_` string of a config tree (plain dicts and lists), in order, once each."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and target and target not in found:
                found.append(target)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return found


def _library_dirs() -> list[Path]:
    """Folders of the Python installation: code there is an installed library, not the user's."""
    paths = sysconfig.get_paths()
    dirs = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    dirs += site.getsitepackages() + [site.getusersitepackages()]
    return [Path(d).resolve() for d in dirs]


def is_installed_library(path: Path, library_dirs: Iterable[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == d or d in resolved.parents for d in (d.resolve() for d in library_dirs))


def installed_beside(source: Path, top: str) -> bool:
    """Whether an installer (pip, conda, uv) recorded `top` in a `*.dist-info` of the folder that
    holds `source`, the folder as named or as its links resolve. An editable install's record
    lives in site-packages, never beside the checkout, so the user's own code is never taken
    for a library. (An `*.egg-info` beside it proves nothing: setuptools leaves one in the
    source tree it builds from.)"""
    folders = {source.parent, source.resolve().parent}
    records = sorted(info for folder in folders for info in folder.glob("*.dist-info") if info.is_dir())
    for dist in map(importlib.metadata.PathDistribution, records):
        if top in (dist.read_text("top_level.txt") or "").split():
            return True
        # RECORD lists every installed file, relative to the folder: the package's own folder,
        # or a module's file (`top.py`, `top.cpython-311-x86_64-linux-gnu.so`).
        for file in dist.files or []:
            first = file.parts[0]
            if first == top or (
                len(file.parts) == 1 and first.split(".", 1)[0] == top and first.endswith((".py", ".so", ".pyd"))
            ):
                return True
    return False


def module_source(module: ModuleType) -> Path | None:
    """The file or folder to copy for a top-level module: its package folder, or its file.
    None for a namespace package spread over several folders, or a module with no file."""
    locations = list(getattr(module, "__path__", None) or [])
    if locations:
        return Path(locations[0]) if len(locations) == 1 else None
    file = getattr(module, "__file__", None)
    return Path(file) if file else None


def _top_source(top: str) -> Path | None:
    """`module_source` of a top-level module, found without importing it when it is not imported
    yet (the config check may have read its targets from hpctrain.config.signatures' cache, and
    importing torch only to find its folder takes a second). ImportError when there is none."""
    module = sys.modules.get(top)
    if module is None:
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise ImportError(f"no module named {top!r}")
        if spec.submodule_search_locations is not None:  # a package: what its __path__ will be
            locations = list(spec.submodule_search_locations)
            return Path(locations[0]) if len(locations) == 1 else None
        if spec.has_location and spec.origin:  # a module: what its __file__ will be
            return Path(spec.origin)
        module = importlib.import_module(top)  # anything else: as it is once imported
    return module_source(module)


class CodeSnapshot:
    """A `code/` folder filled once per hpctrain-submit command; a sweep adds each point's
    targets to the same folder (those already copied are skipped)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.manifest: dict[str, Any] | None = None
        self._libraries = _library_dirs()

    def include(self, targets: Iterable[str], submit_dir: Path) -> None:
        changed = self.manifest is None
        if self.manifest is None:
            self._start(submit_dir)
        assert self.manifest is not None
        for top in sorted({target.split(".", 1)[0] for target in targets} - {"hpctrain"}):
            if top not in self.manifest["modules"] and top not in self.manifest["libraries"]:
                self._add(top)
                changed = True
        if changed:  # a sweep's later points mostly add nothing
            self._write_manifest()

    def _start(self, submit_dir: Path) -> None:
        # A run dir submitted again: its earlier job has ended (a live one is refused before
        # this point), and the new job runs today's code.
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        source = Path(hpctrain.__file__).parent
        # symlinks=False: hpctrain/conf and hpctrain/sbatch_templates are links in a checkout.
        shutil.copytree(source, self.folder / "hpctrain", ignore=_IGNORE)
        self.manifest = {
            "taken_at": round(time.time(), 3),
            "hpctrain": {"version": hpctrain.__version__, "installed_at": str(source)},
            "modules": {},
            "libraries": {},
            "git": [],
            "bytes": 0,
        }
        self._record_git([submit_dir, source])

    def _add(self, top: str) -> None:
        assert self.manifest is not None
        if top in sys.builtin_module_names:  # `builtins.dict`: nothing on disk to copy
            self.manifest["libraries"][top] = "built-in"
            return
        try:
            source = _top_source(top)
        except ImportError:  # `_target_: dict`: Hydra resolved a builtin name, not a module
            self.manifest["libraries"][top] = "built-in"
            return
        if source is None:
            raise ValueError(
                f"slurm.code_snapshot: cannot tell which files make up {top!r} to copy them; "
                "set slurm.code_snapshot=false to run it from where it is installed"
            )
        if is_installed_library(source, self._libraries) or installed_beside(source, top):
            self.manifest["libraries"][top] = str(source)
            return
        target = self.folder / source.name
        if source.is_dir():
            shutil.copytree(source, target, ignore=_IGNORE)
        else:
            shutil.copy2(source, target)
        self.manifest["modules"][top] = str(source)
        self._record_git([source.parent])

    def _record_git(self, folders: Iterable[Path]) -> None:
        assert self.manifest is not None
        known = {entry.get("root") for entry in self.manifest["git"]}
        for folder in folders:
            state = git_state.describe(folder, leave_out=self.folder.parent)
            if state is None or state.get("root") in known:
                continue
            known.add(state.get("root"))
            diff = state.pop("diff", "")
            if diff:
                name = f"git-{len(self.manifest['git'])}.diff"
                (self.folder / name).write_text(diff)
                state["diff_file"] = name
            self.manifest["git"].append(state)

    def _write_manifest(self) -> None:
        assert self.manifest is not None
        self.manifest["bytes"] = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())
        tmp = self.folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2) + "\n")
        tmp.replace(self.folder / MANIFEST)


def summary(snapshot: CodeSnapshot) -> dict[str, Any]:
    """What submission.json says about the snapshot."""
    manifest = snapshot.manifest or {}
    commits = [entry["commit"] for entry in manifest.get("git", []) if entry.get("commit")]
    return {"dir": str(snapshot.folder), "bytes": manifest.get("bytes", 0), "git_commits": commits}
