"""Call sbatch: a list of arguments, never a shell string; its refusals in its own words.

Through hpctrain.slurm.client (Purpose.SUBMIT): retried only while Slurm says the request never
left. A reply that never came (Slurm's "Socket timed out", or our time limit) may hide a queued
job: seen on Slurm 22.05, an sbatch against a stopped slurmctld failed with "Socket timed out on
send/recv operation" and its job was queued once slurmctld went on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose


class SbatchError(RuntimeError):
    """sbatch is missing or refused the job; the message is what the user should read.
    `maybe_queued`: sbatch gave no answer, so the job of `script` may be queued after all."""

    def __init__(self, message: str, script: Path | None = None, maybe_queued: bool = False) -> None:
        super().__init__(message)
        self.script = script
        self.maybe_queued = maybe_queued


def require_sbatch() -> None:
    """Say plainly, before anything is written or queued, that jobs cannot be submitted here."""
    if not client.available(client.SBATCH):
        raise SbatchError(
            "sbatch: not found on PATH. Submit from a Slurm login node, or load Slurm's module; "
            "to train on this machine instead, run hpctrain-train"
        )


def submit(script: Path, env: Mapping[str, str] | None = None) -> str:
    """Queue `script` (sbatch given `env`, else this process's environment); returns the job id."""
    require_sbatch()
    done = client.submit(script, purpose=Purpose.SUBMIT, env=env)
    if done.unsure:
        raise SbatchError(
            f"sbatch: no answer from the Slurm controller ({done.why()}); the job of {script} may have been "
            "queued all the same (see squeue --me), so its run dir is kept",
            script,
            maybe_queued=True,
        )
    if not done.ok:
        raise SbatchError(_refusal(done.reply), script)
    if done.value is None:
        raise SbatchError(f"sbatch: unexpected answer {done.reply.stdout!r}", script, maybe_queued=True)
    return done.value


def _refusal(done: client.Reply) -> str:
    """sbatch's own words (it says which option is wrong), else why it gave none."""
    if done.answered:
        return (done.stderr or done.stdout).strip() or f"sbatch exited with {done.exit_code}"
    return done.why()
