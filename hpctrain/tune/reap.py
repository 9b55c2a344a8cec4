"""Trials whose job died without telling the study, told FAIL so the search goes on.

A trial's own job tells the study while Slurm still lists that job as running (the report is a
step of its batch script, hpctrain/tune/report.py). A job that is gone without telling (its
batch node lost with no requeue, a SIGKILL, a scancel that killed the shell mid-report) never
will: its trial would stay RUNNING for ever, holding one of `tune.parallel` slots, and the search
would stop short of `tune.n_trials`. Before every fill, under the study lock, the RUNNING trials'
jobs are looked up with one Slurm query (hpctrain-status's); those Slurm shows ended, or no
longer knows, are told FAIL with the reason. Nothing is decided when squeue gave no answer.

A trial's job is the one its run dir's submission.json names now, not the first: a guardian
(hpctrain.recovery.guardian) or the control step may have submitted the run again. While the run's
guardian is queued or running, a job that ended is not yet a lost trial: the guardian is about to
decide whether the run goes on (a lost batch node), and it records the new job before it ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from optuna.trial import TrialState

from hpctrain.run.events import Journal, Trial
from hpctrain.run.paths import RunDir
from hpctrain.slurm.states import LIVE_STATES
from hpctrain.status import slurm_query
from hpctrain.tune import study as studies
from hpctrain.tune.trials import StudySetup


def lost(running: Mapping[int, Sequence[str]], states: Mapping[str, str], squeue_answered: bool) -> dict[int, str]:
    """{trial number: why it is lost} among `running` ({number: its job id, then its guardian's
    if it has one}), given the states Slurm gave for those jobs (`states`, any of squeue, sacct or
    scontrol). A trial is lost when none of its jobs is live. Pure."""
    if not squeue_answered:  # no answer is not "not queued"
        return {}
    why = {}
    for number, (job_id, *guardians) in running.items():
        if any(states.get(j) in LIVE_STATES for j in (job_id, *guardians)):
            continue
        state = states.get(job_id)
        if state is None:
            why[number] = f"its job {job_id} is gone from Slurm without telling the study"
        else:
            why[number] = f"its job {job_id} ended {state} without telling the study"
    return why


def trial_jobs(run: RunDir, first_job_id: str) -> tuple[str, ...]:
    """The trial's job now (submission.json follows a resubmission; the study's record is the
    first) and its guardian's, if submission.json names one."""
    record = run.read_submission()
    job_id = str(record.get("job_id") or first_job_id)
    guardian = record.get("guardian_job_id")
    return (job_id, str(guardian)) if guardian else (job_id,)


def reap(setup: StudySetup, by_job: str | None) -> list[str]:
    """Tell FAIL the RUNNING trials whose job is gone (the caller holds the study lock); one
    line per trial told."""
    study = studies.load(setup.tune, setup.settings)
    running = {
        trial.number: trial_jobs(RunDir(setup.tune.trial_dir(trial.number)), str(trial.user_attrs["job_id"]))
        for trial in study.get_trials(deepcopy=False)
        if trial.state == TrialState.RUNNING and trial.user_attrs.get("job_id")
    }
    if not running:
        return []
    answer = slurm_query.query(sorted({job for jobs in running.values() for job in jobs}))
    states = {job_id: job.state for job_id, job in answer.jobs.items()}
    told = []
    trials = study.get_trials(deepcopy=False)
    for number, reason in sorted(lost(running, states, answer.squeue_answered).items()):
        trial = trials[number]
        study._storage.set_trial_user_attr(trial._trial_id, "reason", reason)
        study.tell(number, state=TrialState.FAIL)
        run = RunDir(setup.tune.trial_dir(number))
        record = Trial(
            job_id=running[number][0],
            number=number,
            state="FAIL",
            params=trial.params,
            run_dir=str(run.root),
            reason=reason,
            by_job=by_job,
        )
        Journal(setup.tune.events).write_event(record)
        if run.root.is_dir():
            Journal(run.events).write_event(record)
        told.append(f"trial {number} told FAIL: {reason}")
    return told
