"""Submit prepared run dirs: render job.sbatch, sbatch them, record and print what was queued.

A submission is all or nothing: when sbatch refuses any point of a sweep (or the command is
interrupted), the points already queued by this call are cancelled and every run dir it made is
removed, so a fixed command can simply be run again. A run dir that held a run before this
command is never removed.
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain.config import Config
from hpctrain.run.paths import RunDir, remove_empty_parents
from hpctrain.slurm import sbatch
from hpctrain.slurm.code_snapshot import CodeSnapshot, summary
from hpctrain.slurm.render import render

log = logging.getLogger(__name__)

# What hpctrain-submit writes in a fresh run dir (besides Hydra's .hydra/): removable on failure.
_NAMES = RunDir(Path("."))
_OURS = {".hydra", *(p.name for p in (_NAMES.config, _NAMES.job_script, _NAMES.submission, _NAMES.code))}
# What Hydra writes in a fresh sweep dir besides the points' run dirs (and the shared code/).
_SWEEP_FILES = {"multirun.yaml", _NAMES.code.name}
# Job states in which a job still owns its run dir.
_LIVE_STATES = {
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "SUSPENDED",
    "RESV_DEL_HOLD",
}


@dataclass
class Point:
    """One run to submit: its checked config and its run dir (config.yaml already written)."""

    config: Config
    run: RunDir
    overrides: list[str]
    # The run dir held no run before this command: removing it on failure loses nothing.
    fresh: bool = True
    # The code the job imports first (slurm.code_snapshot), shared by a sweep's points.
    code: CodeSnapshot | None = None

    @property
    def script(self) -> Path:
        return self.run.job_script


def write_script(point: Point, submit_dir: Path) -> str:
    rendered = render(point.config, point.run.root, submit_dir, point.code.folder if point.code else None)
    tmp = point.script.with_name(point.script.name + ".tmp")
    tmp.write_text(rendered.script)
    tmp.chmod(0o755)
    tmp.replace(point.script)
    return rendered.script


def live_job(run: RunDir) -> str | None:
    """`JOBID (STATE)` when the job last submitted from this run dir is still queued or
    running: a second job would train in the same run dir at the same time."""
    job_id = run.submitted_job_id()
    if job_id is None or not job_id.isdigit() or shutil.which("squeue") is None:
        return None
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):  # no answer: sbatch will say what is wrong
        return None
    state = done.stdout.strip()
    return f"{job_id} ({state})" if done.returncode == 0 and state in _LIVE_STATES else None


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
            futures = [pool.submit(sbatch.submit, p.script) for p in points[1:]]
            try:
                for index, future in enumerate(futures, start=1):
                    job_ids[index] = future.result()
            finally:
                _collect(futures, job_ids)  # every job queued before a failure, to cancel it
    except BaseException as error:  # a refusal, a timeout, Ctrl-C: undo what this call did
        unsure = isinstance(error, sbatch.SbatchError) and error.maybe_queued
        _undo([j for j in job_ids if j], [p for p in points if not unsure or p.script != error.script])
        raise
    ids = [str(j) for j in job_ids]
    for point, job_id in zip(points, ids):
        _record(point, job_id)
    return ids


def _collect(futures: list[Future[str]], job_ids: list[str | None]) -> None:
    for future in futures:
        future.cancel()
    for index, future in enumerate(futures, start=1):
        if not future.cancelled() and job_ids[index] is None:
            try:
                job_ids[index] = future.result()
            except BaseException:  # its own failure is reported by the first one raised
                pass


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
        "code_snapshot": summary(point.code) if point.code else None,
    }
    point.run.submission.write_text(json.dumps(record, indent=2) + "\n")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in a bare container
        return str(os.getuid())


def _undo(job_ids: list[str], points: list[Point]) -> None:
    if job_ids and shutil.which("scancel"):
        subprocess.run(["scancel", *job_ids], capture_output=True, check=False, stdin=subprocess.DEVNULL)
        log.warning("cancelled the %d job(s) this submission had queued: %s", len(job_ids), " ".join(job_ids))
    discard_points(points)


def discard_points(points: list[Point]) -> None:
    for point in points:
        if point.fresh:
            discard_run_dir(point.run.root)


def discard_run_dir(root: Path) -> None:
    """Remove a run dir this submission made, only if it holds nothing but our own files."""
    if root.is_dir() and {p.name for p in root.iterdir()} <= _OURS:
        shutil.rmtree(root, ignore_errors=True)
        remove_empty_parents(root)


def discard_sweep_dir(root: Path) -> None:
    """After a failed sweep: remove its folder if nothing but Hydra's multirun.yaml is left."""
    if root.is_dir() and {p.name for p in root.iterdir()} <= _SWEEP_FILES:
        shutil.rmtree(root, ignore_errors=True)
        remove_empty_parents(root)
