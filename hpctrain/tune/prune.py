"""The study's side of pruning: report a trial's value at an evaluation step, ask its pruner.

Rank 0 of a trial with a pruner comes here from its trainer (hpctrain.trainer.pruning, which
broadcasts the answer to the other ranks). Imports optuna; no torch.
"""

from __future__ import annotations

import optuna

from hpctrain.config.tune import TuneConfig
from hpctrain.run.paths import TuneDir
from hpctrain.tune import study as studies


class TrialJudge:
    """One trial of the study in `tune`, opened once: the study's journal is read at every ask."""

    def __init__(self, tune: TuneDir, settings: TuneConfig, trial_id: int) -> None:
        self.trial = optuna.trial.Trial(studies.load(tune, settings), trial_id)

    def should_prune(self, step: int, value: float) -> bool:
        """Report `value` at `step`, then ask the pruner (tune.pruner) whether the trial stops here."""
        self.trial.report(value, step)
        return bool(self.trial.should_prune())
