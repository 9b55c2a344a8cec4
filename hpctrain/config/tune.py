"""The `tune` section of a config: what hpctrain-tune searches and how (hpctrain/tune/).

Every run carries it (a plain run ignores it); only hpctrain-tune and a trial's job read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpctrain.config.checks import require, single_line
from hpctrain.config.search_space import parse_space

DIRECTIONS = ("minimize", "maximize")
SAMPLERS = ("tpe", "random")
PRUNERS = ("none", "median")


@dataclass
class TuneConfig:
    # The objective: a name logged in metrics.jsonl (eval_loss, eval_accuracy, loss, ...); its
    # value at the end of a trial (the final step, always evaluated) is what the study is told.
    metric: str = "eval_loss"
    # minimize (a loss) or maximize (an accuracy).
    direction: str = "minimize"
    # The search space: config key -> `float(1e-5,1e-1,log)`, `int(16,128)`, `choice(a,b)` or
    # a dict {type, low, high, log, step, choices} (hpctrain/config/search_space.py).
    params: dict[str, Any] = field(default_factory=dict)
    # Trials in all, submitted, running and ended (failed ones count too).
    n_trials: int = 10
    # Trials queued or running at once: hpctrain-tune submits this many, each ending trial refills.
    parallel: int = 2
    # tpe (Optuna's default; its first 10 trials are random) or random.
    sampler: str = "tpe"
    # Seeds the sampler: trial n is asked with seed + n, so a study is repeatable.
    seed: int = 0
    # none, or median: stop a trial at an evaluation step whose value is worse than the median
    # of earlier trials at that step (needs trainer.eval_every > 0).
    pruner: str = "none"
    # The median pruner prunes nothing before this many trials have completed...
    pruner_startup_trials: int = 5
    # ...nor before this step of a trial.
    pruner_warmup_steps: int = 0
    # The Optuna study's name inside the sweep dir's journal.
    study_name: str = "hpctrain"

    def __post_init__(self) -> None:
        require(bool(self.metric), "tune.metric", "must name a metric of metrics.jsonl, like eval_loss")
        single_line("tune.metric", self.metric)
        single_line("tune.study_name", self.study_name)
        require(bool(self.study_name), "tune.study_name", "must not be empty")
        for key, allowed in (("direction", DIRECTIONS), ("sampler", SAMPLERS), ("pruner", PRUNERS)):
            value = getattr(self, key)
            require(value in allowed, f"tune.{key}", f"must be {' or '.join(allowed)} (got {value!r})")
        for key in ("n_trials", "parallel"):
            value = getattr(self, key)
            require(value >= 1, f"tune.{key}", f"must be >= 1 (got {value})")
        for key in ("pruner_startup_trials", "pruner_warmup_steps"):
            value = getattr(self, key)
            require(value >= 0, f"tune.{key}", f"must be >= 0 (got {value})")
        parse_space(self.params)  # ValueError naming tune.params.<key>
