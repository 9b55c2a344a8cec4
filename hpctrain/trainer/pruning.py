"""The trainer's pruning hook: at evaluation steps of a trial, ask the study whether to stop.

Rank 0 reports the objective's value at the step to its trial and asks the study's pruner
(hpctrain.tune.prune); its answer is broadcast so every rank stops after the same step (an
evaluation step is already a collective, so one more small broadcast there costs nothing
measurable). The signal stop vote is not used: it is asynchronous by design (acted on an interval
later), while a pruned trial should stop at the very step it was judged on, the step whose value
the study holds.

`TrialPruner.for_run` is None for a run that is not a trial, or has no pruner: neither tuning nor
optuna is then imported. A study that cannot be reached (a full disk, a removed sweep dir) never
stops training: the trial goes on unpruned and the warning says why.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.config.schema import Config
from hpctrain.dist.context import DistContext
from hpctrain.run.paths import RunDir, TuneDir

log = logging.getLogger(__name__)


class TrialPruner:
    def __init__(self, run: RunDir, config: Config, ctx: DistContext, trial: dict[str, Any]) -> None:
        self.run = run
        self.settings = config.tune
        self.ctx = ctx
        self.number = int(trial["number"])
        self.trial_id = int(trial["trial_id"])
        self._judge: Any = None  # rank 0's hpctrain.tune.prune.TrialJudge, opened at the first evaluation

    @classmethod
    def for_run(cls, run: RunDir, config: Config, ctx: DistContext) -> TrialPruner | None:
        if config.tune.pruner == "none" or not run.trial.is_file():
            return None
        return cls(run, config, ctx, json.loads(run.trial.read_text()))

    @property
    def metric(self) -> str:
        return self.settings.metric

    def should_prune(self, step: int, record: dict[str, Any]) -> bool:
        """Collective: every rank calls it at the same evaluation step, all get one answer."""
        answer = self._ask(step, record.get(self.metric)) if self.ctx.is_main else False
        if self.ctx.distributed:
            flag = torch.tensor([int(answer)], dtype=torch.int32, device=self.ctx.device)
            dist.broadcast(flag, src=0)
            answer = bool(flag.item())
        return answer

    def _ask(self, step: int, value: Any) -> bool:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False  # nothing to judge on (a NaN is told as FAIL at the end, not pruned here)
        try:
            pruned = self._open().should_prune(step, float(value))
        except Exception as error:  # the study is out of reach: train on, unpruned
            log.warning("trial %d: could not ask the study whether to prune (%r); going on", self.number, error)
            return False
        if pruned:
            log.info("trial %d pruned at step %d (%s %g)", self.number, step, self.metric, value)
        return pruned

    def _open(self) -> Any:
        if self._judge is None:
            # The study is tuning's (optuna): imported by rank 0 of a trial with a pruner only.
            from hpctrain.tune.prune import TrialJudge

            self._judge = TrialJudge(TuneDir(self.run.root.parent), self.settings, self.trial_id)
        return self._judge
