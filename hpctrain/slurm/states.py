"""Slurm's job states, sorted once for every question hpctrain asks about a job.

squeue(1) lists 24 JOB STATE CODES (Slurm 22.05, quoted in tests/fixtures/slurm/
squeue_job_state_codes.txt). Each is either live (queued, running, held, or on its way back to
the queue: the job still owns its run dir and a second job must not train there) or ended (it
will not run again by itself). tests/test_slurm_states.py checks that the two sets split the
documented codes exactly.

PREEMPTED is ended. squeue(1): "Job terminated due to preemption". A job preempted with
PreemptMode=REQUEUE never shows it: on Slurm 22.05 it goes RUNNING -> COMPLETING (Restarts
+1) -> PENDING (Reason=BeginTime), and only sacct's record of the earlier life says PREEMPTED.
A job whose state is PREEMPTED now was preempted with PreemptMode=CANCEL (or a requeue that
was refused) and stays ended.
"""

from __future__ import annotations

# Waiting to start or to start again, by itself.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED"})
# Held until someone releases it; then it runs again in the same run dir.
# SPECIAL_EXIT: "requeued in a special state" (held) after a chosen exit code.
HELD_STATES = frozenset({"REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
# Holding an allocation: running, or about to, or still cleaning up after its processes.
ALLOCATED_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SUSPENDED"}
)
# The job still owns its run dir (hpctrain-submit's check, hpctrain-cancel, --retry,
# hpctrain-tune's lost trials).
LIVE_STATES = WAITING_STATES | HELD_STATES | ALLOCATED_STATES

# Will not run again by itself (hpctrain-follow stops following).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
# Ended without its run finishing, for certain: a retry takes these. Not COMPLETED (the
# journal tells whether the run finished), not REVOKED (a federation started the job on
# another cluster: it is running there).
UNFINISHED_STATES = ENDED_STATES - {"COMPLETED", "REVOKED"}
# Ended by a failure: hpctrain-status counts the run failed whatever its journal says.
FAILED_STATES = frozenset({"BOOT_FAIL", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"})
# Ended by someone's decision (scancel, a preemption without requeue): failed unless the run
# had finished before.
STOPPED_STATES = frozenset({"CANCELLED", "PREEMPTED"})


def base_state(word: str) -> str:
    """The state in a word Slurm may have decorated: sacct's `CANCELLED by 1000` -> CANCELLED."""
    parts = word.split()
    return parts[0] if parts else ""
