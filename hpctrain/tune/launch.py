"""Ask the study for as many trials as the budgets allow and queue them in one submit_all call.

Called with the study lock held, by hpctrain-tune (the first `parallel` trials) and by every
trial's job when its run has ended (the trials that keep `parallel` running). A trial whose
config is refused or whose submission fails is told FAIL with the reason (in the study, in
tune.jsonl and, when it has one, in its run dir's events.jsonl): it spends budget, so a search
whose submissions keep failing ends instead of looping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from hpctrain.run.events import Journal, Trial
from hpctrain.run.paths import RunDir
from hpctrain.submit import sbatch
from hpctrain.submit.submission import Point, submit_all
from hpctrain.tune import study as studies
from hpctrain.tune.budget import to_submit
from hpctrain.tune.reap import reap
from hpctrain.tune.trials import StudySetup, make_trial

log = logging.getLogger(__name__)


@dataclass
class Filled:
    points: list[Point] = field(default_factory=list)
    job_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per trial that could not be queued


def fill(
    setup: StudySetup, by_job: str | None = None, submit: Callable[[list[Point], int], list[str]] = submit_all
) -> Filled:
    """Submit what `to_submit` allows now (the caller holds studies.study_lock). `submit`:
    hpctrain.submit.submission.submit_all (all or nothing; one Slurm array once arrays land)."""
    settings = setup.settings
    filled = Filled()
    # Trials whose job died without telling free their slots first (hpctrain/tune/reap.py).
    filled.errors.extend(reap(setup, by_job))
    asked: list[optuna.Trial] = []
    points: list[Point] = []
    while True:
        trials = studies.load(setup.tune, settings).get_trials(deepcopy=False)
        if to_submit(studies.counts(trials), settings.n_trials, settings.parallel) <= 0:
            break
        trial = studies.ask(setup.tune, settings, setup.space)
        try:
            point = make_trial(setup, trial.number, trial._trial_id, trial.params)
        except (ValueError, OSError) as error:  # a combination of params the config refuses
            _fail(setup, trial, f"config refused: {error}", by_job, filled)
            continue
        asked.append(trial)
        points.append(point)
    if not points:
        return filled
    try:
        job_ids = submit(points, setup.submit_parallelism)
    except sbatch.SbatchError as error:
        for trial in asked:
            _fail(setup, trial, f"not submitted: {error}", by_job, filled)
        return filled
    for trial, point, job_id in zip(asked, points, job_ids):
        trial.set_user_attr("job_id", job_id)
        _record(
            setup,
            Trial(
                job_id=job_id,
                number=trial.number,
                state="RUNNING",
                params=trial.params,
                run_dir=str(point.run.root),
                by_job=by_job,
            ),
        )
    filled.points, filled.job_ids = points, job_ids
    return filled


def _fail(setup: StudySetup, trial: optuna.Trial, reason: str, by_job: str | None, filled: Filled) -> None:
    trial.set_user_attr("reason", reason)
    studies.load(setup.tune, setup.settings).tell(trial.number, state=TrialState.FAIL)
    run = RunDir(setup.tune.trial_dir(trial.number))
    record = Trial(
        number=trial.number, state="FAIL", params=trial.params, run_dir=str(run.root), reason=reason, by_job=by_job
    )
    _record(setup, record)
    if run.root.is_dir():
        Journal(run.events).write_event(record)
    filled.errors.append(f"trial {trial.number}: {reason}")
    log.error("trial %d: %s", trial.number, reason)


def _record(setup: StudySetup, event: Trial) -> None:
    Journal(setup.tune.events).write_event(event)
