"""Where a training process's start-up goes: a few moments marked, journaled with `start`.

The batch shell exports HPCTRAIN_ALLOCATED_AT (when Slurm started it) and HPCTRAIN_LAUNCHED_AT
(when it launched this srun); the worker marks its own first moment and the end of its imports,
the training process the end of the rendezvous, and the trainer reads them all when it journals
`start` (rank 0's view), as seconds per phase:

- setup_s: the batch script started -> it launched the step (slurm.setup, the heartbeat watcher,
  the control step's begin; the life's first launch only: a relaunch's step follows training);
- launch_s: srun launched -> this process runs (the step created, slurmstepd, Python started);
- imports_s: -> torch and the trainer imported;
- rendezvous_s: -> the process group formed (the config read, the peers met);
- resume_s: -> ready to train (the model and data built, the newest checkpoint loaded).

A relaunch's cost is these plus the decision before it (the `relaunch` event's time after the
step's end). Standard library only: the worker imports this before torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from hpctrain.run.launch_marks import LAUNCHED_AT_ENV, RELAUNCHED_ENV
from hpctrain.run.life import ALLOCATED_AT_ENV

# The phases in order: each is the time from the moment before it to its own.
PHASES = (
    ("setup_s", "launched"),
    ("launch_s", "began"),
    ("imports_s", "imported"),
    ("rendezvous_s", "joined"),
    ("resume_s", "ready"),
)

_marks: dict[str, float] = {}


def mark(moment: str, at: float | None = None) -> None:
    """This process reached `moment` (the first time counts), now or `at` (a warm standby's
    worker begins when its task did: hpctrain.process.standby)."""
    _marks.setdefault(moment, time.time() if at is None else at)


def phases(environ: Mapping[str, str] | None = None, marks: Mapping[str, float] | None = None) -> dict[str, float]:
    """Seconds per phase, for the phases whose two ends were marked (none outside a batch
    script's srun for launch_s)."""
    env = os.environ if environ is None else environ
    moments = dict(_marks if marks is None else marks)
    for moment, name in (("allocated", ALLOCATED_AT_ENV), ("launched", LAUNCHED_AT_ENV)):
        try:
            moments[moment] = float(env.get(name, ""))
        except ValueError:
            pass
    if env.get(RELAUNCHED_ENV):
        moments.pop("allocated", None)  # the life's set-up came before an earlier step
    before, out = "allocated", {}
    for name, moment in PHASES:
        if before in moments and moment in moments:
            out[name] = round(max(0.0, moments[moment] - moments[before]), 3)
        before = moment
    return out
