"""A stop signal that lands while a training process is still starting (torch importing, the
config not read): held, then honoured without a step or a save, and told as the stop it was.

Real processes: `python -m hpctrain.worker RUN_DIR` (what srun starts on every task) with the
signal sent at an exact moment by a fault point (hpctrain.faults)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_ok, events, run_train, train_env

from hpctrain import faults
from hpctrain.process.early_signals import EarlySignals
from hpctrain.run.exitcodes import WORKER_SAVED_AND_STOPPED, WORKER_SAVED_FOR_TIMELIMIT

TRAINED = ("model=mlp", "trainer.max_steps=20", "trainer.ckpt_every=10", "trainer.eval_every=0")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with checkpoints of steps 10 and 20 (finished: the worker would start and end)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert_ok(run_train(run_dir, TRAINED))
    return run_dir


def start_worker(
    trained: Path, tmp_path: Path, arming: str, hup: signal.Handlers = signal.SIG_DFL
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`python -m hpctrain.worker` on a copy of `trained`, armed; SIGHUP's disposition set to
    `hup` before the exec (whatever the suite inherited: under nohup it is ignored)."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    env = {**train_env(), faults.ENV: arming}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.worker", str(run_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, hup),  # kept across exec: SIG_DFL or SIG_IGN
    )
    return done, run_dir


@pytest.mark.parametrize(
    ("arming", "code", "reason"),
    [
        # A preemption while torch imports: before, Python's default action killed it (-15:
        # srun says 143, a crash).
        ("worker.before_imports=term", WORKER_SAVED_AND_STOPPED, "preempt"),
        ("worker.after_imports=term", WORKER_SAVED_AND_STOPPED, "preempt"),
        # The time-limit warning (slurm.signal, USR2) passed on by the batch shell at a start.
        ("worker.before_imports=signal:USR2", WORKER_SAVED_FOR_TIMELIMIT, "timelimit"),
    ],
)
def test_a_stop_at_start_up_leaves_at_once_saying_why(
    trained: Path, tmp_path: Path, arming: str, code: int, reason: str
) -> None:
    before = sorted(p.name for p in (trained / "checkpoints").iterdir())
    done, run_dir = start_worker(trained, tmp_path, arming)
    assert done.returncode == code, done.stderr[-3000:]
    (stop,) = events(run_dir, "stop")
    assert (stop["reason"], stop["step"], stop["deadline_s"]) == (reason, 20, 0.0)
    assert stop["since_signal_s"] >= 0
    # Nothing trained, nothing written but the record: no start, no checkpoint.
    assert events(run_dir, "start") == events(trained, "start")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


@pytest.mark.parametrize("hup", [signal.SIG_DFL, signal.SIG_IGN], ids=["hup-default", "hup-ignored"])
def test_a_held_signal_that_is_no_stop_acts_as_it_would_have(
    trained: Path, tmp_path: Path, hup: signal.Handlers
) -> None:
    """HUP is not this run's time-limit signal (USR2): given back the disposition the process
    started with, it acts as it always would. By default it ends the process; ignored (as under
    nohup) the run trains on. Either way nothing is recorded as a stop."""
    done, run_dir = start_worker(trained, tmp_path, "worker.before_imports=signal:HUP", hup)
    if hup == signal.SIG_DFL:
        assert done.returncode == -signal.SIGHUP, done.stderr[-3000:]
    else:
        assert done.returncode == 0, done.stderr[-3000:]
        assert events(run_dir, "start")[-1]["resumed_from_step"] == 20
    assert events(run_dir, "stop") == []


def test_without_a_signal_the_worker_trains_as_before(trained: Path, tmp_path: Path) -> None:
    done, run_dir = start_worker(trained, tmp_path, "")
    assert done.returncode == 0, done.stderr[-3000:]
    starts = events(run_dir, "start")
    assert len(starts) == len(events(trained, "start")) + 1 and starts[-1]["resumed_from_step"] == 20


def test_held_signals_go_to_the_stop_flag_in_order_of_arrival() -> None:
    """The pure part: a handled signal is handed over with its arrival time, the others raised
    again (here to a recording handler standing in for their defaults)."""
    code = """
import json, os, signal
from hpctrain.process.early_signals import EarlySignals
raised = []
signal.signal(signal.SIGURG, lambda s, f: raised.append(s))
early = EarlySignals().hold()
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGURG)
os.kill(os.getpid(), signal.SIGTERM)
handed = []
early.hand_over({signal.SIGTERM, signal.SIGUSR2}, lambda s, t: handed.append((s, t)))
print(json.dumps({"handed": [s for s, _ in handed], "ordered": handed[0][1] <= handed[1][1], "raised": raised}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {"handed": [signal.SIGUSR2, signal.SIGTERM], "ordered": True, "raised": [signal.SIGURG]}
    assert EarlySignals().received == []


@pytest.mark.parametrize("nprocs", [1, 2])
def test_hpctrain_train_holds_a_stop_that_comes_while_it_composes_its_config(tmp_path: Path, nprocs: int) -> None:
    """`hpctrain-train` itself (what `srun hpctrain-train` runs on every task, or a terminal):
    a SIGTERM once the config is composed, before any training process exists, is held and
    honoured as the preemption it is (before: Python's default action, 143 with nothing said),
    before torch is imported: a loaded node took more than Slurm's GraceTime (20 s) to import it
    in a submitit task, which was killed before it could say why. With 2 processes no rank is
    started at all."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "hpctrain.cli.train",
        *TRAINED,
        f"trainer.nprocs={nprocs}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**train_env(), faults.ENV: "train.before_launch=term"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    stops = events(run_dir, "stop")
    assert [(s["reason"], s["step"], s["deadline_s"]) for s in stops] == [("preempt", 0, 0.0)], stops
    assert events(run_dir, "start") == [] and not list((run_dir / "checkpoints").glob("*.pt"))
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "hpctrain.process.early_stop" in imported and "torch" not in imported
