"""The Optuna study in a sweep dir: storage, lock, ask, tell, counts and the summary file.

Storage is Optuna's JournalStorage on a file (`optuna.journal`) with JournalFileOpenLock, which
works on NFSv3+ and Lustre (O_CREAT|O_EXCL), unlike SQLite's fcntl locks. Every process that
touches the study (hpctrain-tune, each trial's job at its end, rank 0 of a trial when it reports
an intermediate value) opens it from the file; there is no server.

Telling a trial and submitting the next ones happen under one more lock of the same kind
(`study.lock`), so two trials ending at the same moment never both fill the same free slot.
Imports optuna: only hpctrain-tune and trials' jobs come here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, TrialState

from hpctrain.config.search_space import Param
from hpctrain.config.tune import TuneConfig
from hpctrain.run.paths import TuneDir
from hpctrain.tune.budget import Counts

# A holder of the study lock silent for this long is taken as dead (its node failed mid-way):
# longer than any tell plus a round of sbatch calls (each bounded to 120 s) should take.
STUDY_LOCK_GRACE_S = 600

optuna.logging.set_verbosity(optuna.logging.WARNING)  # no INFO line per trial in job outputs


def storage(tune: TuneDir) -> JournalStorage:
    path = str(tune.journal)
    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


@contextlib.contextmanager
def study_lock(tune: TuneDir) -> Iterator[None]:
    """One process at a time tells and submits (see the module's note)."""
    lock = JournalFileOpenLock(str(tune.lock), grace_period=STUDY_LOCK_GRACE_S)
    lock.acquire()
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # broken by another after the grace: it is theirs now
            lock.release()


def sampler(settings: TuneConfig, asked: int) -> optuna.samplers.BaseSampler:
    """The sampler for the next ask. Each ask happens in another process, so a sampler seeded
    alike every time would draw the same random trials: trial n gets seed + n."""
    seed = settings.seed + asked
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner(settings: TuneConfig) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=settings.pruner_startup_trials, n_warmup_steps=settings.pruner_warmup_steps
        )
    return optuna.pruners.NopPruner()


def create(tune: TuneDir, settings: TuneConfig) -> optuna.Study:
    return optuna.create_study(
        storage=storage(tune),
        study_name=settings.study_name,
        direction=optuna.study.StudyDirection[settings.direction.upper()],
        sampler=sampler(settings, 0),
        pruner=pruner(settings),
    )


def load(tune: TuneDir, settings: TuneConfig, asked: int = 0) -> optuna.Study:
    return optuna.load_study(
        study_name=settings.study_name,
        storage=storage(tune),
        sampler=sampler(settings, asked),
        pruner=pruner(settings),
    )


def counts(trials: list[FrozenTrial]) -> Counts:
    by_state = {state: sum(1 for t in trials if t.state == state) for state in TrialState}
    return Counts(
        running=by_state[TrialState.RUNNING] + by_state[TrialState.WAITING],
        complete=by_state[TrialState.COMPLETE],
        pruned=by_state[TrialState.PRUNED],
        failed=by_state[TrialState.FAIL],
    )


def distribution(param: Param) -> optuna.distributions.BaseDistribution:
    """Optuna's distribution for one dimension of tune.params."""
    if param.kind == "choice":
        return optuna.distributions.CategoricalDistribution(list(param.choices))
    assert param.low is not None and param.high is not None
    if param.kind == "int":
        return optuna.distributions.IntDistribution(
            int(param.low), int(param.high), log=param.log, step=int(param.step or 1)
        )
    return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log, step=param.step)


def ask(tune: TuneDir, settings: TuneConfig, space: list[Param]) -> optuna.Trial:
    """A new trial with its params drawn (the sampler seeded for its number)."""
    asked = len(load(tune, settings).get_trials(deepcopy=False))
    study = load(tune, settings, asked)
    return study.ask({p.key: distribution(p) for p in space})


def best(trials: list[FrozenTrial], direction: str) -> FrozenTrial | None:
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
    if not done:
        return None
    pick = min if direction == "minimize" else max
    return pick(done, key=lambda t: t.value)  # type: ignore[arg-type,return-value]


def write_summary(tune: TuneDir, settings: TuneConfig, trials: list[FrozenTrial]) -> dict[str, Any]:
    """tune.json: what hpctrain-status shows without importing optuna."""
    found = counts(trials)
    top = best(trials, settings.direction)
    summary = {
        "study_name": settings.study_name,
        "metric": settings.metric,
        "direction": settings.direction,
        "n_trials": settings.n_trials,
        "parallel": settings.parallel,
        "counts": {
            "complete": found.complete,
            "pruned": found.pruned,
            "failed": found.failed,
            "running": found.running,
        },
        "best": None
        if top is None
        else {
            "number": top.number,
            "value": top.value,
            "params": top.params,
            "run_dir": str(tune.trial_dir(top.number)),
        },
        "trials": [trial_row(tune, t) for t in trials],
        "updated_at": round(time.time(), 3),
    }
    tmp = tune.summary.with_name(f"{tune.summary.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, tune.summary)
    return summary


def trial_row(tune: TuneDir, trial: FrozenTrial) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value if trial.state == TrialState.COMPLETE else _last_intermediate(trial),
        "params": trial.params,
        "job_id": trial.user_attrs.get("job_id"),
        "run_dir": str(tune.trial_dir(trial.number)),
        "reason": trial.user_attrs.get("reason"),
    }


def _last_intermediate(trial: FrozenTrial) -> float | None:
    if trial.state == TrialState.PRUNED and trial.value is not None:
        return trial.value
    steps = sorted(trial.intermediate_values)
    return trial.intermediate_values[steps[-1]] if steps else None
