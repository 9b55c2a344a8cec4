"""Submit prepared run dirs: render job.sbatch, sbatch them, record and print what was queued.

A submission is all or nothing: when sbatch refuses any point of a sweep, the points already
queued by this call are cancelled and every run dir it made is removed, so a fixed command
can simply be run again.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain.config import Config
from hpctrain.rundir import RunDir
from hpctrain.slurm import sbatch
from hpctrain.slurm.render import render

log = logging.getLogger(__name__)

# What hpctrain-submit writes in a fresh run dir (besides Hydra's .hydra/): removable on failure.
_OURS = {".hydra", "config.yaml", "job.sbatch", "submission.json"}


@dataclass
class Point:
    """One run to submit: its checked config and its run dir (config.yaml already written)."""

    config: Config
    run: RunDir
    overrides: list[str]

    @property
    def script(self) -> Path:
        return self.run.root / "job.sbatch"


def write_script(point: Point, submit_dir: Path) -> str:
    rendered = render(point.config, point.run.root, submit_dir)
    point.script.write_text(rendered.script)
    point.script.chmod(0o755)
    return rendered.script


def submit_all(points: list[Point], parallelism: int) -> list[str]:
    """sbatch every point; the first alone (a wrong partition or account fails there, before
    any other job is queued), the rest `parallelism` at a time. Returns the job ids in order."""
    if not points:
        return []
    job_ids: list[str | None] = [None] * len(points)
    try:
        sbatch.sbatch_path()  # say "no sbatch" once, before anything else happens
        job_ids[0] = sbatch.submit(points[0].script)
        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            for index, job_id in enumerate(pool.map(lambda p: sbatch.submit(p.script), points[1:]), start=1):
                job_ids[index] = job_id
    except sbatch.SbatchError:
        _undo([j for j in job_ids if j], points)
        raise
    ids = [j for j in job_ids if j]
    for point, job_id in zip(points, ids):
        _record(point, job_id)
    return ids


def _record(point: Point, job_id: str) -> None:
    record = {
        "job_id": job_id,
        "submitted_at": round(time.time(), 3),
        "overrides": point.overrides,
        "script": str(point.script),
        "user": _user(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "python": point.config.slurm.python or sys.executable,
        "hpctrain_version": __version__,
    }
    (point.run.root / "submission.json").write_text(json.dumps(record, indent=2) + "\n")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in a bare container
        return str(os.getuid())


def _undo(job_ids: list[str], points: list[Point]) -> None:
    if job_ids and shutil.which("scancel"):
        subprocess.run(["scancel", *job_ids], capture_output=True, check=False)
        log.warning("cancelled the %d job(s) this submission had queued: %s", len(job_ids), " ".join(job_ids))
    for point in points:
        discard_run_dir(point.run.root)


def discard_run_dir(root: Path) -> None:
    """Remove a run dir this submission made, only if it holds nothing but our own files."""
    if root.is_dir() and {p.name for p in root.iterdir()} <= _OURS:
        shutil.rmtree(root, ignore_errors=True)
