"""What a trial's job does once its run has ended: tell the study, then submit the next trials.

    python -m hpctrain.tune.report RUN_DIR ACTION

A trial's run dir names this module as its listener (hpctrain.run.listeners, written with the
trial by hpctrain.tune.trials), so the control step (or the guardian) runs it once it has decided
the run is over: ACTION is finish, fail, or stop after a scancel. Under the study lock it:
  1. tells the study how the trial ended, unless it was told already (a job requeued many
     times, or a control step run twice, tells once: the trial's state in the study decides);
  2. unless the trial was cancelled, submits as many new trials as keep `tune.parallel`
     running without exceeding `tune.n_trials` (hpctrain.tune.launch);
  3. rewrites tune.json, the summary hpctrain-status reads.
Nothing here may break the job's own ending: every error is said on stderr (exit status 1), and
the listener's runner bounds its time (REPORT_TIMEOUT_S).

The objective is the metric's value at the end of the run, i.e. in the `finish` event (the
final step is always evaluated): the value of the weights the trial leaves in model.pt. The
best value seen during the run would reward weights nobody kept.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.run.events import Event, Failure, Finish, Journal, Pruned, Trial, read_events
from hpctrain.run.listeners import Listener
from hpctrain.run.paths import RunDir, TuneDir
from hpctrain.submit.outside_job import outside_the_job

if TYPE_CHECKING:
    from hpctrain.tune.trials import StudySetup

# How long a trial's job waits for its report: the study lock waited out up to its grace
# (hpctrain.tune.study.STUDY_LOCK_GRACE_S, 600 s: a dead holder's lock is broken then), then a
# tell and a round of sbatch calls, each bounded by the Slurm client. Past it the report is
# killed and the job ends all the same; the trial, never told, is then reaped as lost by the next
# report that fills the study (hpctrain.tune.reap). Not imported from study.py: that imports
# optuna, and judging a trial (tests, hpctrain-status) needs none.
REPORT_TIMEOUT_S = 1200.0
# What a trial's listeners.json names (hpctrain.tune.trials writes it with the trial).
LISTENER = Listener(module=__name__, timeout_s=REPORT_TIMEOUT_S)


@dataclass(frozen=True)
class Verdict:
    state: str  # COMPLETE, PRUNED or FAIL
    value: float | None = None
    reason: str | None = None


def judge(events: Sequence[Event], action: str, metric: str) -> Verdict:
    """How a trial ended, from its run's journal and the control step's action (pure)."""
    pruned = [e for e in events if isinstance(e, Pruned)]
    if pruned:
        return Verdict("PRUNED", pruned[-1].value)
    finish = [e for e in events if isinstance(e, Finish)]
    if action == "finish" and finish:
        final = finish[-1].extra
        value = final.get(metric)
        if value is None:
            logged = ", ".join(sorted(k for k in final if k != "step")) or "nothing"
            return Verdict("FAIL", reason=f"tune.metric {metric!r} is not among the final metrics ({logged})")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return Verdict("FAIL", reason=f"{metric} ended as {value!r}, not a finite number")
        return Verdict("COMPLETE", float(value))
    if action == "stop":
        return Verdict("FAIL", reason="cancelled (scancel)")
    failures = [e for e in events if isinstance(e, Failure)]
    if failures:
        last = failures[-1]
        return Verdict(
            "FAIL",
            reason=f"the run failed: {last.cause}"
            + (f" ({last.message or last.reason})" if last.message or last.reason else ""),
        )
    return Verdict("FAIL", reason=f"the run ended ({action}) without finishing")


def _trial_ended(run: RunDir, action: str) -> None:
    from hpctrain.run.life import LifeStamp
    from hpctrain.tune import study as studies
    from hpctrain.tune.launch import fill
    from hpctrain.tune.trials import StudySetup

    tune = TuneDir(run.root.parent)
    job = LifeStamp.from_env().job_id  # `<array>_<task>` for a trial queued in an array
    if action == "stop":
        # scancel: Slurm kills this shell KillWait seconds after its SIGTERM, maybe mid-way, so
        # no lock is taken (a killed holder would stall every other trial's report). Telling
        # alone is safe unlocked: it only ends a running trial, so a concurrent fill sees one
        # more running than there is and submits fewer, never more. Nothing new is submitted.
        setup = StudySetup.read(tune)
        _tell(run, setup, action, job)
        studies.write_summary(tune, setup.settings, studies.load(tune, setup.settings).get_trials(deepcopy=False))
        return
    with studies.study_lock(tune):
        setup = StudySetup.read(tune)
        _tell(run, setup, action, job)
        with outside_the_job():
            filled = fill(setup, by_job=job)
        for point, job_id in zip(filled.points, filled.job_ids):
            print(f"hpctrain-tune: submitted trial {point.run.root.name} as job {job_id}")
        for error in filled.errors:
            print(f"hpctrain-tune: {error}")
        studies.write_summary(tune, setup.settings, studies.load(tune, setup.settings).get_trials(deepcopy=False))


def _tell(run: RunDir, setup: StudySetup, action: str, job: str | None) -> None:
    """Tell the study how the trial ended, once: a trial no longer RUNNING was told already."""
    from optuna.trial import TrialState

    from hpctrain.tune import study as studies
    from hpctrain.tune.trials import read_trial

    number = int(read_trial(run)["number"])
    study = studies.load(setup.tune, setup.settings)
    trial = study.get_trials(deepcopy=False)[number]
    if trial.state != TrialState.RUNNING:
        return
    verdict = judge(read_events(run.events), action, setup.settings.metric)
    if verdict.reason:
        study._storage.set_trial_user_attr(trial._trial_id, "reason", verdict.reason)
    if verdict.state == "COMPLETE":
        study.tell(number, verdict.value)
    else:
        study.tell(number, state=TrialState[verdict.state])
    told = Trial(
        job_id=job,
        number=number,
        state=verdict.state,
        value=verdict.value,
        params=trial.params,
        run_dir=str(run.root),
        reason=verdict.reason,
        by_job=job,
    )
    Journal(setup.tune.events).write_event(told)
    Journal(run.events).write_event(told)
    value = f" {setup.settings.metric}={verdict.value:g}" if verdict.value is not None else ""
    print(
        f"hpctrain-tune: trial {number} told {verdict.state}{value}" + (f": {verdict.reason}" if verdict.reason else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The trial's listener. An error is said on stderr with exit status 1: the listener's runner
    says so too, and the trial's job ends as decided all the same."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2:
        print("usage: python -m hpctrain.tune.report RUN_DIR ACTION", file=sys.stderr)
        return 2
    run_dir, action = Path(args[0]), args[1]
    try:
        _trial_ended(RunDir(run_dir), action)
    except Exception as error:
        print(f"hpctrain-tune: could not report trial {run_dir} to its study: {error!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
