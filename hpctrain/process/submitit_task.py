"""hpctrain's trainer as the task of hydra-submitit-launcher (`hydra/launcher=submitit_slurm`).

submitit runs the Hydra task function in every task of the job (`srun python -m
submitit.core._submit FOLDER`), each task one rank of one DDP world (SLURM_PROCID and friends,
as in any srun step: hpctrain.process.steprun). Before the task function starts, submitit installs its
own signal handlers in every task:
- its signal (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise), sent by Slurm
  `signal_delay_s` before the time limit (or at a preemption where the site sets
  PreemptParameters=send_user_signal): task 0 pickles the callable for the next life and runs
  `scontrol requeue` (a time limit only while `max_num_timeout` allows), then exits; the other
  tasks ignore it and are killed by the requeue;
- SIGTERM and SIGCONT: ignored ("bypassed").

Once hpctrain's ranks train, its stop handlers take those signals over (hpctrain.process.signals): every
rank agrees on one stop step and a checkpoint of that step is written, whatever the signal. Then
this module gives the stop back to submitit: for submitit's signal, task 0 runs submitit's own
handler (so submitit's requeue, its timeout count and its message are what a submitit user
knows); for SIGTERM (Slurm's preemption with PreemptMode=REQUEUE, an admin's requeue, scancel)
Slurm itself requeues or ends the job. The next life runs the same task function: the same run
dir (Hydra's sweep dir, cached in the pickled config), resumed from that checkpoint.
A signal that lands before the ranks train (while torch imports) is submitit's alone: task 0
requeues at once, nothing trained in that life, the newest checkpoint stands.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from hpctrain.process import ending as process_end

log = logging.getLogger("hpctrain")

EXECUTOR_ENV = "SUBMITIT_EXECUTOR"  # set by submitit in the job's script: "slurm"
SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # submitit's signal, without "SIG"; USR2 by default

Handler = Callable[[int, "FrameType | None"], Any]


@dataclass(frozen=True)
class SubmititTask:
    """This process is one task of a job submitit submitted to Slurm."""

    signal_name: str  # submitit's signal without "SIG": what the time-limit warning is here
    handler: Handler | None  # submitit's handler of it, saved before hpctrain's replace it

    @classmethod
    def here(cls, env: Mapping[str, str] | None = None) -> SubmititTask | None:
        """Read in the task function, before anything installs hpctrain's handlers."""
        env = os.environ if env is None else env
        if env.get(EXECUTOR_ENV) != "slurm":
            return None
        name = env.get(SIGNAL_ENV, "USR2").upper().removeprefix("SIG")
        number = getattr(signal, f"SIG{name}", None)
        if not isinstance(number, int):
            raise ValueError(f"{SIGNAL_ENV}={env.get(SIGNAL_ENV)}: no such signal")
        handler = signal.getsignal(number)
        return cls(name, handler if callable(handler) else None)

    def config_error(self, slurm_signal: str) -> str | None:
        """hpctrain's time-limit signal (slurm.signal) must be the one Slurm sends this job."""
        if slurm_signal.upper().removeprefix("SIG") == self.signal_name:
            return None
        return (
            f"slurm.signal={slurm_signal}: under hydra-submitit-launcher the time-limit warning is "
            f"SIG{self.signal_name} ({SIGNAL_ENV}); set slurm.signal={self.signal_name}"
        )

    def after_stop(self, signum: int, rank: int) -> NoReturn:
        """The ranks stopped at a signal, a checkpoint of the stop step written: hand over."""
        if signum == getattr(signal, f"SIG{self.signal_name}") and rank == 0 and self.handler is not None:
            # submitit's own: pickles the callable, `scontrol requeue`s and exits, or raises
            # when it will not requeue (timed out max_num_timeout times), which submitit
            # reports as the job's result.
            self.handler(signum, None)
        # Everything else waits for Slurm to end the job, as submitit's tasks do. A task that
        # left now would end the job early: after a preemption's SIGTERM, a job whose tasks
        # all exit within the GraceTime ends COMPLETED and is never requeued (seen on Slurm
        # 22.05); on a site with KillOnBadExit, an early exit of another task would kill
        # task 0 before its requeue. Slurm ends this wait: the requeue (submitit's, or the
        # preemption's when the grace ends), scancel, or the time limit, by SIGKILL after
        # KillWait.
        log.info("checkpoint saved at the signal; waiting for Slurm to requeue or end the job")
        while True:
            time.sleep(60)

    @staticmethod
    def after_finish() -> None:
        """Finished: once submitit has written the result, leave without torch's teardown
        (hpctrain.process.ending): a finished rank must not end as a crash."""
        atexit.register(process_end.leave, 0)
