"""Trials whose job died without telling the study: told FAIL, their slots filled (hpctrain/tune/reap.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("optuna")
from optuna.trial import TrialState  # noqa: E402
from test_tune_study import make_study, queued  # noqa: E402

from hpctrain.run.jsonlines import read_jsonl  # noqa: E402
from hpctrain.run.paths import RunDir  # noqa: E402
from hpctrain.tune import study as studies  # noqa: E402
from hpctrain.tune.launch import fill  # noqa: E402
from hpctrain.tune.reap import lost, trial_jobs  # noqa: E402
from hpctrain.tune.trials import StudySetup  # noqa: E402

RUNNING = {0: ("40",), 1: ("41_3",), 2: ("42",), 3: ("43",)}
# Trial 1's run has a guardian (51); trial 2's job was submitted again by its guardian (62, guarded by 63).
GUARDED = {0: ("40",), 1: ("41_3", "51"), 2: ("62", "63")}


@pytest.mark.parametrize(
    "running, states, answered, lost_trials",
    [
        # Queued, running, requeued or finishing: the job will tell the study itself.
        (RUNNING, {"40": "PENDING", "41_3": "RUNNING", "42": "COMPLETING", "43": "REQUEUED"}, True, {}),
        # Ended without telling (a killed batch shell), or purged from Slurm altogether.
        (RUNNING, {"40": "FAILED", "41_3": "RUNNING", "42": "NODE_FAIL", "43": "CANCELLED"}, True, {0, 2, 3}),
        (RUNNING, {"40": "RUNNING", "41_3": "PENDING", "42": "RUNNING"}, True, {3}),
        (RUNNING, {"40": "COMPLETED", "41_3": "RUNNING", "42": "RUNNING", "43": "RUNNING"}, True, {0}),
        # A job ended, its guardian queued or running: it is deciding whether the run goes on.
        (GUARDED, {"40": "RUNNING", "41_3": "FAILED", "51": "PENDING", "62": "RUNNING", "63": "PENDING"}, True, {}),
        (GUARDED, {"40": "RUNNING", "41_3": "FAILED", "51": "RUNNING", "62": "PENDING", "63": "PENDING"}, True, {}),
        # The guardian ended too (it found nothing to do, or could not submit): lost.
        (GUARDED, {"40": "RUNNING", "41_3": "FAILED", "51": "COMPLETED", "62": "RUNNING", "63": "PENDING"}, True, {1}),
        # The resubmitted job ended and its guardian is gone from Slurm: lost, named by the new job.
        (GUARDED, {"40": "RUNNING", "41_3": "RUNNING", "51": "PENDING", "62": "FAILED"}, True, {2}),
        # squeue gave no answer: nothing is known, nothing is told.
        (RUNNING, {}, False, {}),
        (RUNNING, {"40": "FAILED"}, False, {}),
    ],
)
def test_a_trial_is_lost_only_when_slurm_answered_that_its_job_is_gone(
    running: dict[int, tuple[str, ...]], states: dict[str, str], answered: bool, lost_trials: set[int]
) -> None:
    why = lost(running, states, answered)
    assert set(why) == set(lost_trials)
    for number, reason in why.items():
        assert running[number][0] in reason and "without telling the study" in reason


def test_a_trials_jobs_follow_its_run_dirs_submission(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert trial_jobs(run, "40") == ("40",)  # no submission.json (yet): the study's record
    run.write_submission({"job_id": "40", "guardian_job_id": "41"})
    assert trial_jobs(run, "40") == ("40", "41")
    run.record_resubmission("62")
    run.update_submission(guardian_job_id="63")
    assert trial_jobs(run, "40") == ("62", "63")


@pytest.mark.slurm
def test_a_trial_whose_job_ended_without_telling_is_told_fail_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmtools import start_cluster, wait_finished

    env = start_cluster()
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])

    def sbatch(*args: str) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", f"--chdir={tmp_path}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    tune = make_study(
        tmp_path / "sweep", "+tune.params={optim.lr: 'float(1e-4,1e-1,log)'}", "tune.n_trials=4", "tune.parallel=2"
    )
    with studies.study_lock(tune):
        first = fill(StudySetup.read(tune), submit=queued)
    assert len(first.points) == 2
    # Trial 0's job ends without its report (as a SIGKILLed batch shell would); trial 1's is held.
    dead, alive = sbatch("--wrap", "true"), sbatch("--hold", "--wrap", "true")
    try:
        assert wait_finished(env, dead, 120) == "COMPLETED"
        study = studies.load(tune, StudySetup.read(tune).settings)
        for trial, job_id in zip(study.get_trials(deepcopy=False), (dead, alive)):
            study._storage.set_trial_user_attr(trial._trial_id, "job_id", job_id)
        with studies.study_lock(tune):
            filled = fill(StudySetup.read(tune), by_job="99", submit=queued)
    finally:
        subprocess.run(["scancel", alive], env=env, capture_output=True, timeout=60)
    assert filled.errors == [f"trial 0 told FAIL: its job {dead} ended COMPLETED without telling the study"]
    assert [p.run.root.name for p in filled.points] == ["2"]  # its slot filled, the held one kept
    states = [t.state for t in studies.load(tune, StudySetup.read(tune).settings).get_trials()]
    assert states == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]
    told = [r for r in read_jsonl(tune.root / "0" / "events.jsonl") if r["event"] == "trial"]
    assert [(r["state"], r["by_job"]) for r in told] == [("FAIL", "99")]
