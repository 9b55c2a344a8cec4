"""Call sbatch: a list of arguments, never a shell string; its refusals in its own words.

Through hpctrain.slurm.client (SUBMIT): retried only while Slurm says the request never left.
A reply that never came (Slurm's "Socket timed out", or our time limit) may hide a queued job:
seen on Slurm 22.05, an sbatch against a stopped slurmctld failed with "Socket timed out on
send/recv operation" and its job was queued once slurmctld went on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hpctrain.slurm import client


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


def submit(script: Path, extra_args: tuple[str, ...] = (), timeout_s: float = client.SUBMIT.timeout_s) -> str:
    """Queue `script`; returns the job id (`--parsable` prints `id` or `id;cluster`)."""
    policy = client.Policy(timeout_s, client.SUBMIT.retry_for_s, retry_unsure=False)
    done = client.run([sbatch_path(), "--parsable", *extra_args, str(script)], policy)
    if done.unsure:
        raise SbatchError(
            f"sbatch: no answer from the Slurm controller ({done.why()}); the job of {script} may have been "
            "queued all the same (see squeue --me), so its run dir is kept",
            script,
            maybe_queued=True,
        )
    if not done.ok:
        raise SbatchError(_refusal(done), script)
    job_id = done.stdout.strip().splitlines()[-1].split(";")[0] if done.stdout.strip() else ""
    if not job_id.isdigit():
        raise SbatchError(f"sbatch: unexpected answer {done.stdout!r}", script, maybe_queued=True)
    return job_id


def test_only(script: Path) -> str:
    """`sbatch --test-only`: Slurm checks the script against the cluster and queues nothing."""
    done = client.run([sbatch_path(), "--test-only", str(script)], client.READ)
    if not done.ok:
        raise SbatchError(_refusal(done))
    return (done.stderr or done.stdout).strip()


def _refusal(done: client.Reply) -> str:
    """sbatch's own words (it says which option is wrong), else why it gave none."""
    if done.answered:
        return (done.stderr or done.stdout).strip() or f"sbatch exited with {done.exit_code}"
    return done.why()
