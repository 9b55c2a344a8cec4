"""`hpctrain-train` end to end: what a finished run directory holds, and how a bad config fails.

The default 2-process run (conftest.default_run) is shared with test_trainer's accuracy test.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import DEFAULT_RUN, Spec, TrainRuns, assert_ok, describe, events, finish, load_weights
from omegaconf import OmegaConf

from hpctrain.config import load_run_config, targets
from hpctrain.data.digits import digits
from hpctrain.run.jsonlines import read_jsonl

pytestmark = pytest.mark.slow

RUN_FILES = ("config.yaml", "metrics.jsonl", "events.jsonl", "model.pt")

BAD = {"trainer.nprocs=0": "trainer.nprocs", "+model.foo=1": "model.foo"}
USER_RUN = ("model._target_=mymod.Net", "trainer.nprocs=2", "trainer.max_steps=12", "trainer.log_every=4")


def _specs(user_module_dir: Path) -> list[Spec]:
    return [
        DEFAULT_RUN,
        # mymod lives outside hpctrain and the working directory: only PYTHONPATH finds it, in
        # the launcher and in both spawned training processes.
        Spec("user-model", USER_RUN, user_module_dir),
        *(Spec(f"bad-{i}", (override,)) for i, override in enumerate(BAD)),
    ]


@pytest.fixture(scope="module")
def runs(train_run: TrainRuns, user_module_dir: Path) -> TrainRuns:
    """Every run of this module, started side by side."""
    train_run.prefetch(*_specs(user_module_dir))
    return train_run


@pytest.fixture(scope="module")
def default_run(runs: TrainRuns) -> Path:
    proc, run_dir = runs(DEFAULT_RUN.label, *DEFAULT_RUN.overrides)
    assert_ok(proc)
    return run_dir


def test_run_dir_holds_the_contract_files(default_run: Path) -> None:
    for name in RUN_FILES:
        assert (default_run / name).is_file(), f"{name} missing from {sorted(p.name for p in default_run.iterdir())}"
    assert not list(default_run.glob("*.tmp")), "a temporary file was left behind"


def test_config_yaml_is_fully_resolved_and_loads(default_run: Path) -> None:
    text = (default_run / "config.yaml").read_text()
    assert "${" not in text
    saved = OmegaConf.load(default_run / "config.yaml")
    assert "hydra" not in saved
    # Nothing left to resolve: the resolved and unresolved views are the same.
    assert OmegaConf.to_container(saved, resolve=False) == OmegaConf.to_container(saved, resolve=True)
    config = load_run_config(default_run)
    assert config.trainer.nprocs == 2  # the command-line override is in it
    assert config.model["_target_"] == "hpctrain.models.convnet.ConvNet"


def test_metrics_have_a_line_per_logged_step(default_run: Path) -> None:
    rows = read_jsonl(default_run / "metrics.jsonl")
    # log_every=10 over 220 steps, evaluation every 100 steps and at the end.
    assert [r["step"] for r in rows] == list(range(10, 221, 10))
    for row in rows:
        assert {"step", "loss", "lr", "samples_per_s"} <= row.keys()
        assert math.isfinite(row["loss"]) and row["loss"] > 0
        assert row["lr"] > 0 and row["samples_per_s"] > 0
        evaluated = row["step"] in (100, 200, 220)
        assert ("eval_loss" in row) == evaluated and ("eval_accuracy" in row) == evaluated, row
        if evaluated:
            assert 0.0 <= row["eval_accuracy"] <= 1.0
    # The cosine schedule (warmup 20, min_lr_ratio 0.1) ends at a tenth of the lr.
    assert rows[-1]["lr"] == pytest.approx(1e-4)
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_events_start_and_finish(default_run: Path) -> None:
    records = read_jsonl(default_run / "events.jsonl")
    now = time.time()
    for record in records:
        assert isinstance(record["event"], str)
        assert now - 600 < record["time"] <= now
    assert records[0]["event"] == "start" and records[-1]["event"] == "finish"
    (start,) = events(default_run, "start")
    assert start["world_size"] == 2
    assert start["restart"] == 0
    assert start["resumed_from_step"] == 0
    assert start["nodes"] == [socket.gethostname()]
    assert start["job_id"] is None  # not under Slurm
    done = finish(default_run)
    last_metrics = read_jsonl(default_run / "metrics.jsonl")[-1]
    assert done["step"] == 220
    # The finish event carries the final metrics line.
    for key in ("step", "loss", "lr", "eval_loss", "eval_accuracy"):
        assert done[key] == last_metrics[key], key


def test_model_pt_is_a_plain_state_dict_of_the_saved_models_class(default_run: Path) -> None:
    weights = load_weights(default_run)  # weights_only=True: plain tensors, no pickled objects
    assert weights and all(isinstance(v, torch.Tensor) for v in weights.values())
    assert not [k for k in weights if k.startswith("module.") or k.startswith("_orig_mod.")]
    assert all(v.device.type == "cpu" for v in weights.values())
    model = targets.build(load_run_config(default_run).model)
    model.load_state_dict(weights, strict=True)

    # They are the final weights: evaluated here on the held-out split, they score exactly what
    # the run reported at its end.
    model.eval()
    images, labels = digits().eval.tensors
    with torch.no_grad():
        accuracy = (model(images).argmax(dim=1) == labels).double().mean().item()
    assert accuracy == pytest.approx(finish(default_run)["eval_accuracy"], abs=1e-9)


@pytest.mark.parametrize("index, override", list(enumerate(BAD)))
def test_a_bad_value_exits_2_naming_the_key_and_leaves_no_run_dir(runs: TrainRuns, index: int, override: str) -> None:
    proc, run_dir = runs(f"bad-{index}", override)
    assert proc.returncode == 2, describe(proc)
    assert BAD[override] in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not run_dir.exists()
    # Nothing else was written in the working directory either (beside the captured output).
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["stderr.txt", "stdout.txt"]


def test_a_users_own_model_trains_to_the_end(runs: TrainRuns, user_module_dir: Path, monkeypatch) -> None:
    proc, run_dir = runs("user-model", *USER_RUN, pythonpath=user_module_dir)
    assert_ok(proc)
    assert finish(run_dir)["step"] == 12
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [4, 8, 12]
    config = load_run_config(run_dir)
    assert config.model == {"_target_": "mymod.Net"}  # the ConvNet's arguments were dropped

    monkeypatch.syspath_prepend(str(user_module_dir))
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    model = targets.build(config.model)
    model.load_state_dict(load_weights(run_dir), strict=True)
