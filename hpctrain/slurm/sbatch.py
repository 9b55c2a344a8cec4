"""Call sbatch: a list of arguments, never a shell string; its refusals in its own words."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class SbatchError(RuntimeError):
    """sbatch is missing or refused the job; the message is what the user should read.
    `maybe_queued`: sbatch gave no answer, so the job of `script` may be queued after all."""

    def __init__(self, message: str, script: Path | None = None, maybe_queued: bool = False) -> None:
        super().__init__(message)
        self.script = script
        self.maybe_queued = maybe_queued


def sbatch_path() -> str:
    path = shutil.which("sbatch")
    if path is None:
        raise SbatchError(
            "sbatch: not found on PATH. Submit from a Slurm login node, or load Slurm's module; "
            "to train on this machine instead, run hpctrain-train"
        )
    return path


def submit(script: Path, extra_args: tuple[str, ...] = (), timeout_s: float = 120) -> str:
    """Queue `script`; returns the job id (`--parsable` prints `id` or `id;cluster`)."""
    command = [sbatch_path(), "--parsable", *extra_args, str(script)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SbatchError(
            f"sbatch: no answer from the Slurm controller within {timeout_s:.0f} s; the job of {script} may "
            f"have been queued all the same (see squeue --me), so its run dir is kept",
            script,
            maybe_queued=True,
        ) from None
    if done.returncode != 0:
        raise SbatchError((done.stderr or done.stdout).strip() or f"sbatch exited with {done.returncode}", script)
    job_id = done.stdout.strip().splitlines()[-1].split(";")[0] if done.stdout.strip() else ""
    if not job_id.isdigit():
        raise SbatchError(f"sbatch: unexpected answer {done.stdout!r}", script, maybe_queued=True)
    return job_id


def test_only(script: Path) -> str:
    """`sbatch --test-only`: Slurm checks the script against the cluster and queues nothing."""
    done = subprocess.run(
        [sbatch_path(), "--test-only", str(script)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise SbatchError((done.stderr or done.stdout).strip())
    return (done.stderr or done.stdout).strip()
