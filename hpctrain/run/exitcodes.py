"""Every exit code hpctrain's processes use, in one table: which process exits with which code.

Three processes, three contracts:
  - a training process (`python -m hpctrain.worker`, or a rank spawned by hpctrain-train): read
    by the batch script's control step, never by a user directly;
  - the batch script of a job (sbatch_templates/ddp.sbatch.j2, which is rendered with this table:
    it types no code of its own) and its control step: what Slurm shows as the job's exit code;
  - the console scripts (hpctrain-train, hpctrain-submit, hpctrain-status, hpctrain-follow): what
    a user's shell sees. 2 for a user's mistake is the convention of argparse and of most CLIs.
"""

from __future__ import annotations

# ---- a training process ---------------------------------------------------------------------
# (which stop exits with which: hpctrain.run.causes.STOP_TABLE)
WORKER_FINISHED = 0
WORKER_SAVED_FOR_TIMELIMIT = 75  # the time limit is near: saved; requeue me and I resume
WORKER_SAVED_AND_STOPPED = 76  # SIGTERM (preemption, scancel) or Ctrl-C: saved; the batch script decides
WORKER_HUNG = 77  # no step finished within trainer.hang_timeout_s: the watchdog ended the process
WORKER_USER_ERROR = 78  # a bad value or file (sysexits EX_CONFIG), already told: do not retry, fix it
# A newer generation of the run dir exists (hpctrain.run.generations): this life was replaced
# (the keeper or the guardian submitted the run again, a user's --retry); it wrote nothing more.
WORKER_FENCED = 79
# This node failed a check at the start of the life (slurm.health): its `failure` is journaled;
# the control step counts the node as lost (a relaunch on a spare, or a requeue without it).
WORKER_NODE_UNHEALTHY = 80

# ---- the batch script and its control step -----------------------------------------------------
BATCH_FINISHED = 0
BATCH_REQUEUED = 0  # scontrol requeue accepted: Slurm starts the job again (same id, restart + 1)
BATCH_FAILED = 1  # the run cannot go on here: a `failure` event and the output say why
CONTROL_BUDGET_SPENT = 3  # `control begin`: a restart budget is spent; the job ends FAILED
BATCH_RESUBMITTED = 4  # scontrol refused the requeue; the run goes on in a new job (never COMPLETED)
# `control requeue` found no scontrol where it runs (through slurm.task_prefix, an image without
# Slurm's commands): the batch shell, on the node, asks for the requeue itself.
CONTROL_NO_SLURM = 5
# `control requeue` found the job cancelled (scancel) while the step ended: it asked for no
# requeue, which Slurm would have granted, bringing the cancelled job back.
BATCH_CANCELLED = 6
# `control begin` found the job inside a preemption's grace (its record shows a PreemptTime): the
# batch shell launches nothing, and after-step requeues it as the preemption it is. A step started
# now would be warned by nobody, and SIGTERMed as it starts at the grace's end.
CONTROL_PREEMPTING = 7
# A control step found its life replaced by a newer generation of the run dir (a frozen batch
# host that came back after the keeper submitted the run again, a stale requeue): it launched,
# requeued and wrote nothing; the job ends FAILED and its guardian finds the run gone on.
CONTROL_FENCED = 8
# `control requeue` got no answer from slurmctld until (almost) the job's time limit: the job
# ends without deciding (no second job, no `fail`); its guardian decides once Slurm is back.
BATCH_UNDECIDED = 9

# ---- console scripts ----------------------------------------------------------------------------
CLI_OK = 0
CLI_REFUSED = 1  # hpctrain-submit: sbatch refused; hpctrain-status: a listed run failed
CLI_USER_ERROR = 2  # a mistake in the command line or config, told as one `error:` line
