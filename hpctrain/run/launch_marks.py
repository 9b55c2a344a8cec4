"""Whether a training step's tasks began at all: the mark its tasks leave as they start.

The batch shell launches each training step (srun) with HPCTRAIN_LAUNCHED_AT, the moment of that
launch. The first task of each node of the step to begin, as its first act (hpctrain.process.door:
before its imports and any fault point), touches one empty file `RUN_DIR/.launched-<moment>`: one
touch a node, not a rank. The first to begin, not SLURM_LOCALID 0: any task may be the first to
begin and the first to die (a rank killed as it starts takes the step down with it, srun's
--kill-on-bad-exit, before another has run a line; seen in CI, where rank 1 died at its imports
before rank 0 had touched the mark, and the crash was taken for a launch that never happened). The
tasks of a node tell the first by a name only one of them can hold: an abstract Unix socket of the
node's (its network namespace's), bound for the task's life, gone with it. The control step's
after-step reads the mark and removes it:
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

import errno
import hashlib
import socket
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
    """The first task to begin on its node of a step the batch shell launched: the mark. Anywhere
    else (a local run, a user's own srun: no HPCTRAIN_LAUNCHED_AT) nothing. A mark that cannot be
    written is left out: the control step then takes a failed step for one that never launched, at
    most twice in a row."""
    launched_at = env.get(LAUNCHED_AT_ENV, "")
    if not launched_at or not _first_on_node(run_dir, env, launched_at):
        return
    try:
        mark_path(run_dir, launched_at).touch()
    except (OSError, ValueError):
        pass


# The claim of the first task on its node, held for the process's life: the node's later tasks of
# the same step find the name taken. Never closed: it goes with the process.
_claims: list[socket.socket] = []


def _claim_name(run_dir: Path, env: Mapping[str, str], launched_at: str) -> str:
    """The abstract socket only the first task of this step on this node binds. Nodes may share a
    network namespace (the dev cluster's are processes of one machine): the node's name is in it,
    with the job, the run dir and the launch. Hashed: an abstract name holds 107 bytes."""
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    key = "\n".join((str(Path(run_dir).absolute()), env.get("SLURM_JOB_ID", ""), launched_at, node))
    return "\0hpctrain-launched." + hashlib.sha256(key.encode()).hexdigest()[:40]


def _first_on_node(run_dir: Path, env: Mapping[str, str], launched_at: str) -> bool:
    """Whether this task is the first of its step to begin on its node. Where the name cannot be
    bound for another reason than being taken (no abstract sockets), every task marks: a few
    touches of one file more, never a step taken for one that did not begin."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        claim.bind(_claim_name(run_dir, env, launched_at))
    except OSError as error:
        claim.close()
        return error.errno != errno.EADDRINUSE
    _claims.append(claim)
    return True


def began(run_dir: Path, launched_at: float) -> bool:
    return mark_path(run_dir, launched_at).exists()


def forget(run_dir: Path, launched_at: float) -> None:
    mark_path(run_dir, launched_at).unlink(missing_ok=True)
