"""Exit codes of a training process, read by the batch script (hpctrain/slurm/control.py)."""

FINISHED = 0
EXIT_REQUEUE = 75  # time limit near: saved; requeue me and I resume
EXIT_STOPPED = 76  # SIGTERM (preemption, scancel) or Ctrl-C: saved; the batch script decides
EXIT_HANG = 77  # no step finished within trainer.hang_timeout_s: the watchdog ended the process
EXIT_USER_ERROR = 78  # a bad value or file (sysexits EX_CONFIG), already told: do not retry, fix it
