"""hpctrain-tune's study on a real journal file: concurrent ends keep the budgets; the trainer
prunes a trial at an evaluation step (2 gloo processes) and the study records it PRUNED.

Queueing is the one part not real here (a recorder stands in for submit_all): the end-to-end
test on the Slurm dev cluster (tests/test_tune_slurm.py) submits for real.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch.multiprocessing as mp
from hydra import compose, initialize_config_module
from optuna.trial import TrialState

from hpctrain.cli.tune import write_study
from hpctrain.process import door
from hpctrain.run.events import Finish, Journal
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.listeners import read_listeners, tell_listeners
from hpctrain.run.paths import RunDir, TuneDir
from hpctrain.submit.submission import Point
from hpctrain.tune import study as studies
from hpctrain.tune.launch import fill
from hpctrain.tune.report import LISTENER, _tell
from hpctrain.tune.trials import StudySetup

TINY = ["trainer.max_steps=10", "trainer.log_every=5", "trainer.eval_every=5", "slurm.code_snapshot=false"]


def make_study(root: Path, *overrides: str) -> TuneDir:
    tune = TuneDir(root)
    root.mkdir(parents=True)
    with initialize_config_module("hpctrain.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, *overrides])
    write_study(tune, cfg, [*TINY, *overrides])
    return tune


def queued(points: list[Point], parallelism: int) -> list[str]:
    """Stands in for submit_all: the run dirs it was given, as fake job ids."""
    return [f"fake-{point.run.root.name}" for point in points]


def end_and_refill(root: str, number: int, start: multiprocessing.synchronize.Barrier) -> None:
    """What a trial's job does at its end (report._trial_ended), all processes at once."""
    tune = TuneDir(Path(root))
    start.wait()
    with studies.study_lock(tune):
        setup = StudySetup.read(tune)
        study = studies.load(tune, setup.settings)
        study.tell(number, 0.1 * number)
        fill(setup, by_job=f"ender-{number}", submit=queued)


def test_trials_ending_at_once_never_exceed_the_budgets(tmp_path: Path) -> None:
    tune = make_study(
        tmp_path / "sweep",
        "optim.lr=0.01",
        "+tune.params={optim.lr: 'float(1e-4,1e-1,log)'}",
        "tune.n_trials=6",
        "tune.parallel=4",
    )
    with studies.study_lock(tune):
        first = fill(StudySetup.read(tune), submit=queued)
    assert first.job_ids == ["fake-0", "fake-1", "fake-2", "fake-3"] and not first.errors
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(4)
    enders = [ctx.Process(target=end_and_refill, args=(str(tune.root), n, start)) for n in range(4)]
    for process in enders:
        process.start()
    for process in enders:
        process.join(120)
        assert process.exitcode == 0
    trials = studies.load(tune, StudySetup.read(tune).settings).get_trials()
    # 4 told, 2 more asked (the budget), never a 7th; never more than 4 running.
    assert len(trials) == 6
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 4
    assert [t.state for t in trials].count(TrialState.RUNNING) == 2
    assert sorted(p.name for p in tune.root.iterdir() if p.name.isdigit()) == [str(n) for n in range(6)]
    records = read_jsonl(tune.events)
    assert sorted(r["number"] for r in records if r["state"] == "RUNNING") == list(range(6))
    # Each trial drew its own params (trial n is asked with seed + n), all inside the space.
    lrs = [t.params["optim.lr"] for t in trials]
    assert len(set(lrs)) == 6 and all(1e-4 <= lr <= 1e-1 for lr in lrs)
    made = json.loads(RunDir(tune.trial_dir(5)).trial.read_text())
    assert made["number"] == 5 and made["params"] == trials[5].params


def test_a_refused_trial_config_is_told_fail_and_the_search_goes_on(tmp_path: Path) -> None:
    # A trial's config refused on the compute node (here: base.yaml's dataset made unimportable
    # after hpctrain-tune checked it) fails that trial, not the search.
    tune = make_study(
        tmp_path / "sweep", "+tune.params={data.batch_size: 'choice(8,16)'}", "tune.n_trials=3", "tune.parallel=2"
    )
    base = tune.base.read_text().replace("_target_: hpctrain.data.digits", "_target_: hpctrain.data.no_such_module")
    tune.base.write_text(base)
    with studies.study_lock(tune):
        filled = fill(StudySetup.read(tune), submit=queued)
    assert filled.job_ids == [] and len(filled.errors) == 3  # every trial refused: the budget ends the loop
    states = [t.state for t in studies.load(tune, StudySetup.read(tune).settings).get_trials()]
    assert states == [TrialState.FAIL] * 3
    assert all("config refused" in r["reason"] for r in read_jsonl(tune.events))


def test_a_trials_listener_tells_the_study_once_when_its_run_ends(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The trial's run dir names the study's report as its listener; the control step's ending
    # runs it (`python -m hpctrain.tune.report RUN_DIR finish`), a second ending tells nothing new.
    tune = make_study(
        tmp_path / "sweep", "+tune.params={optim.lr: 'float(1e-4,1e-1,log)'}", "tune.n_trials=2", "tune.parallel=2"
    )
    with studies.study_lock(tune):
        filled = fill(StudySetup.read(tune), submit=queued)
    run = filled.points[0].run
    assert read_listeners(run) == [LISTENER] and LISTENER.module == "hpctrain.tune.report"
    assert LISTENER.timeout_s > studies.STUDY_LOCK_GRACE_S  # a dead holder's lock is broken first
    Journal(run.events).write_event(Finish(step=10, extra={"eval_loss": 0.25}))
    tell_listeners(run, "finish")
    tell_listeners(run, "finish")
    capfd.readouterr()  # what the report said went to stderr
    settings = StudySetup.read(tune).settings
    trial = studies.load(tune, settings).get_trials()[0]
    assert trial.state == TrialState.COMPLETE and trial.value == 0.25
    told = [r for r in read_jsonl(tune.events) if r["state"] != "RUNNING"]
    assert [(r["number"], r["state"], r["value"]) for r in told] == [(0, "COMPLETE", 0.25)]
    assert json.loads(tune.summary.read_text())["best"]["value"] == 0.25


def test_the_trainer_prunes_a_trial_at_an_evaluation_step(tmp_path: Path) -> None:
    tune = make_study(
        tmp_path / "sweep",
        "+tune.params={optim.lr: 'float(1e-4,1e-3,log)'}",
        "tune.metric=eval_accuracy",
        "tune.direction=maximize",
        "tune.pruner=median",
        "tune.pruner_startup_trials=1",
    )
    settings = StudySetup.read(tune).settings
    # One earlier trial that did far better at every evaluation step: the median to beat.
    distribution = {"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-3, log=True)}
    studies.load(tune, settings).add_trial(
        optuna.trial.create_trial(
            params={"optim.lr": 1e-3}, distributions=distribution, value=0.99, intermediate_values={5: 0.99, 10: 0.99}
        )
    )
    with studies.study_lock(tune):
        filled = fill(StudySetup.read(tune), submit=queued)
    run = filled.points[0].run
    assert run.root.name == "1"
    mp.spawn(door.spawned, args=(2, str(tmp_path / "store"), str(run.root), os.getpid()), nprocs=2, join=True)
    events = read_jsonl(run.events)
    pruned = [e for e in events if e["event"] == "pruned"]
    assert len(pruned) == 1 and pruned[0]["step"] == 5 and pruned[0]["metric"] == "eval_accuracy"
    assert [e["reason"] for e in events if e["event"] == "checkpoint"] == ["pruned"]
    assert not any(e["event"] == "finish" for e in events)
    assert [m["step"] for m in read_jsonl(run.metrics)][-1] == 5  # no step after the prune
    trial = studies.load(tune, settings).get_trials()[1]
    assert trial.intermediate_values == {5: pruned[0]["value"]}
    # The job's end (control after-step: finish) tells the study PRUNED, once.
    setup = StudySetup.read(tune)
    _tell(run, setup, "finish", "fake-1")
    _tell(run, setup, "finish", "fake-1")
    assert studies.load(tune, settings).get_trials()[1].state == TrialState.PRUNED
    assert [e["state"] for e in read_jsonl(run.events) if e["event"] == "trial"] == ["PRUNED"]


def test_without_optuna_the_command_names_the_pip_command(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['optuna'] = None; "
        f"sys.argv = ['hpctrain-tune', 'hydra.sweep.dir={tmp_path / 'sweep'}', 'optim.lr=float(1e-4,1e-1)']; "
        "from hpctrain.cli.tune import main; main()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'hpctrain[tune]'" in done.stderr and done.stderr.startswith("error: hpctrain-tune needs Optuna")
    assert not (tmp_path / "sweep").exists()
