"""Whether a training step's tasks began at all: the mark its tasks leave as they start.

The batch shell launches each training step (srun) with HPCTRAIN_LAUNCHED_AT, the moment of that
launch. The first task of each node of the step (SLURM_LOCALID 0), as its first act
(hpctrain.process.door: before its imports and any fault point), touches one empty file
`RUN_DIR/.launched-<moment>`: one touch a node, not a rank. Any task may be the first to begin
and the first to die (a rank killed as it starts takes the step down with it, srun's
--kill-on-bad-exit, before another has run a line). The control step's after-step reads the
mark and removes it:
  - there: a task of the step ran, and a failure is the step's own (a crash before `start` is a
    crash, charged as one);
  - missing, srun having failed: srun started no task. It could not reach slurmctld (it gives up
    after about 20 s: "Unable to confirm allocation for job N: Socket timed out on send/recv
    operation", seen on the dev cluster with slurmctld stopped), or Slurm refused the step.
    Nothing of the run failed: hpctrain.recovery.decide launches the step again, charged to no
    budget, once Slurm answers.
The mark is read only by the control step of the life that launched the step, named by the
moment of its own launch: no other life ever reads it, so it needs no fencing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# The moment the batch shell launched the step (`date +%s.%N`), exported for its tasks; the
# start-up clock (hpctrain.process.startup_clock) times a task's launch from it too.
LAUNCHED_AT_ENV = "HPCTRAIN_LAUNCHED_AT"
# "1" when the step is a relaunch within the life (onto a spare, after a lost node), empty on the
# life's first launch: only that one has the batch script's set-up before it to time.
RELAUNCHED_ENV = "HPCTRAIN_RELAUNCHED"
PREFIX = ".launched-"


def mark_path(run_dir: Path, launched_at: str | float) -> Path:
    """The mark of the step launched at `launched_at` (UNIX seconds, as the batch shell wrote them)."""
    return Path(run_dir) / f"{PREFIX}{float(launched_at):.6f}"


def leave(run_dir: Path, env: Mapping[str, str]) -> None:
    """The first task on its node of a step the batch shell launched: the mark. Anywhere else (a
    local run, a user's own srun: no HPCTRAIN_LAUNCHED_AT) nothing. A mark that cannot be written
    is left out: the control step then takes a failed step for one that never launched, at most
    twice in a row."""
    launched_at = env.get(LAUNCHED_AT_ENV, "")
    if env.get("SLURM_LOCALID", env.get("SLURM_PROCID", "0")) != "0" or not launched_at:
        return
    try:
        mark_path(run_dir, launched_at).touch()
    except (OSError, ValueError):
        pass


def began(run_dir: Path, launched_at: float) -> bool:
    return mark_path(run_dir, launched_at).exists()


def forget(run_dir: Path, launched_at: float) -> None:
    mark_path(run_dir, launched_at).unlink(missing_ok=True)
