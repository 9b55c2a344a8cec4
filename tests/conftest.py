"""Shared fixtures: run `hpctrain-train` as a real subprocess and read what it left behind.

Training runs are the slow part of the suite, so `train_run` caches them for the whole session
under a label: tests that need the same run (the default 2-process run, the 1 x 64 MLP run...)
share one subprocess instead of training twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from hpctrain.journal import read_jsonl

# Variables that would make the launcher take another path (torchrun, Slurm) or add threads.
_FOREIGN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_RESTART_COUNT",
)

RUN_TIMEOUT_S = 300


def train_env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    return env


def run_train(
    run_dir: Path, overrides: tuple[str, ...] | list[str], pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`hpctrain-train OVERRIDES hydra.run.dir=RUN_DIR`, from RUN_DIR's parent (nothing lands
    in the repository), with one intra-op thread per process."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "hpctrain.cli.train", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(
        command,
        cwd=run_dir.parent,
        env=train_env(pythonpath),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    """The end of a run's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, describe(proc)


def load_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True, map_location="cpu")


def events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == name]


def finish(run_dir: Path) -> dict:
    done = events(run_dir, "finish")
    assert len(done) == 1, f"expected one finish event in {run_dir}, got {done}"
    return done[0]


TrainRun = Callable[..., tuple[subprocess.CompletedProcess[str], Path]]


@pytest.fixture(scope="session")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> TrainRun:
    """`train_run(label, *overrides)` -> (CompletedProcess, run_dir), trained once per session.

    The label names the run: two labels with the same overrides train twice (the determinism
    test needs that), one label asked for again returns the first result. Asking for a label
    with other overrides than the first time is a test bug and fails."""
    cache: dict[str, tuple[tuple[str, ...], subprocess.CompletedProcess[str], Path]] = {}

    def run(label: str, *overrides: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        if label in cache:
            first, proc, run_dir = cache[label]
            assert first == overrides, f"run {label!r} was first asked for with {first}, now {overrides}"
            return proc, run_dir
        run_dir = tmp_path_factory.mktemp(label) / "run"
        proc = run_train(run_dir, overrides)
        cache[label] = (overrides, proc, run_dir)
        return proc, run_dir

    return run


@pytest.fixture(scope="session")
def default_run(train_run: TrainRun) -> Path:
    """The README quickstart on two processes: default config, `trainer.nprocs=2`."""
    proc, run_dir = train_run("default-2proc", "trainer.nprocs=2")
    assert_ok(proc)
    return run_dir


# A user's own model, outside hpctrain: plugged in with model._target_=mymod.Net.
USER_MODULE = '''
import torch
from torch import nn


class Net(nn.Module):
    """Takes no arguments: every argument of the default model must be dropped."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class WideNet(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.width = width
        self.hidden = nn.Linear(64, width)
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x.flatten(1))))
'''


@pytest.fixture
def user_module_dir(tmp_path: Path) -> Path:
    """A folder holding `mymod.py` (not importable until it is put on the path)."""
    folder = tmp_path / "usercode"
    folder.mkdir()
    (folder / "mymod.py").write_text(USER_MODULE)
    return folder
