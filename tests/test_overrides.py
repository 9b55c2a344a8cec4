"""The command line before Hydra (hpctrain.cli.overrides): a mistyped key named with the closest
keys and exit 2, -m anywhere, --version saying hpctrain's version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import __version__
from hpctrain.cli.overrides import mistyped_key, multirun_first
from hpctrain.run.exitcodes import CLI_USER_ERROR

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["optim.lrr=1"], "optim.lrr: no such key in optim=adamw; did you mean optim.lr"),
        (["optim=sgd", "optim.momentun=0.9"], "optim.momentun: no such key in optim=sgd; did you mean optim.momentum?"),
        (["trainer.max_step=3"], "trainer.max_step: no such key; did you mean trainer.max_steps"),
        (["data=tokens", "data.seq_len=64"], "data.seq_len: no such key; did you mean data.dataset.seq_len?"),
        (["model=gpt", "model.n_layers=2"], "model.n_layers: no such key in model=gpt; did you mean model.n_layer"),
        (["sched.warmup_step=3"], "sched.warmup_step: no such key in sched=cosine; did you mean sched.warmup_steps?"),
        (["slurm.spare_node=1"], "slurm.spare_node: no such key; did you mean slurm.spare_nodes"),
        (["-m", "optim.lr=1e-3,2e-3", "optim.wd=0.1"], "optim.wd: no such key in optim=adamw"),
        (["nonsense=1"], "nonsense: no such key"),
    ],
)
def test_a_mistyped_key_is_named_with_the_closest_keys(argv: list[str], said: str) -> None:
    told = mistyped_key(argv)
    assert told is not None and told.startswith(said), told


@pytest.mark.parametrize(
    "argv",
    [
        ["optim.lr=1e-3", "optim=sgd", "optim.momentum=0.9"],
        ["+optim.foo=1", "++model.bar=2", "~sched"],  # added or removed on purpose
        ["cluster=devcluster", "trainer=smoke", "data=tokens", "data.dataset.seq_len=64"],
        ["slurm.restart_budget.crash=3", "loss._target_=torch.nn.MSELoss", "hydra.run.dir=runs/x"],
        ["optim=sgd,adamw", "optim.momentum=0.9"],  # a sweep over options: its keys are not checked
        ["slurm.warm_standby=false", "metrics.tensorboard=true", "tune.n_trials=3", "dry_run=true"],
    ],
)
def test_keys_that_exist_or_are_added_on_purpose_pass(argv: list[str]) -> None:
    assert mistyped_key(argv) is None


def test_minus_m_anywhere_goes_first() -> None:
    assert multirun_first(["optim.lr=1e-3,2e-3", "-m", "trainer.max_steps=3"]) == [
        "-m",
        "optim.lr=1e-3,2e-3",
        "trainer.max_steps=3",
    ]
    assert multirun_first(["trainer.max_steps=3"]) == ["trainer.max_steps=3"]


def run(tmp_path: Path, program: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [str(BIN / program), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("program", ["hpctrain-train", "hpctrain-submit", "hpctrain-tune"])
def test_a_mistyped_key_exits_2_before_anything_is_written(tmp_path: Path, program: str) -> None:
    done = run(tmp_path, program, "optim.lrr=1")
    assert done.returncode == CLI_USER_ERROR, done.stderr
    assert done.stderr.startswith("error: optim.lrr: no such key in optim=adamw; did you mean optim.lr"), done.stderr
    assert "+optim.lrr" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_version_is_hpctrain_s(tmp_path: Path) -> None:
    done = run(tmp_path, "hpctrain-train", "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"hpctrain-train (hpctrain) {__version__}"


def test_minus_m_after_an_override_sweeps(tmp_path: Path) -> None:
    done = run(tmp_path, "hpctrain-submit", "dry_run=true", "slurm.array=false", "optim.lr=1e-3,2e-3", "-m")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "runs" / "multirun").glob("*/*/*/config.yaml"))) == 2
