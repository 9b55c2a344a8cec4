"""Values the optimizer, schedule, model and data refuse only once built, and whether the model fits
the data (hpctrain.config.fits): refused on the login node, naming the key and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from hpctrain.config import fits, register
from hpctrain.run.exitcodes import CLI_USER_ERROR

BIN = Path(sys.executable).parent


def plain(*overrides: str) -> dict:
    register()
    with initialize_config_module("hpctrain.conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    tree = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(tree, dict)
    return tree


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["optim.lr=abc"], "optim.lr='abc': must be a number >= 0"),
        (["optim.lr=-0.1"], "optim.lr=-0.1: must be a number >= 0"),
        (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]: must be two numbers in [0, 1)"),
        (["optim=sgd", "optim.momentum=-1"], "optim.momentum=-1: must be a number >= 0"),
        (["sched.warmup_steps=-5"], "sched.warmup_steps=-5: must be an integer >= 0"),
        (["sched.min_lr_ratio=2"], "sched.min_lr_ratio=2: must be a number in [0, 1]"),
        (["model.dropout1=1.5"], "model.dropout1=1.5: must be a number in [0, 1)"),
        (["model=gpt", "data=tokens", "model.n_head=0"], "model.n_head=0: must be an integer >= 1"),
        (["data=tokens", "model=gpt", "data.dataset.seq_len=0"], "data.dataset.seq_len=0: must be an integer >= 1"),
    ],
)
def test_a_value_out_of_range_is_named(overrides: list[str], said: str) -> None:
    assert fits.check_values(plain(*overrides)) == said


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["data=tokens"], "model: model=convnet takes images, and data=tokens gives token sequences: set model=gpt"),
        (
            ["model.num_classes=5"],
            "model.num_classes=5: data=digits has 10 classes (targets 0 to 9); set model.num_classes=10",
        ),
        (
            ["model=mlp", "model.in_features=32"],
            "model.in_features=32: data=digits images have 64 values (1x8x8); set model.in_features=64",
        ),
        (["model.image_size=28"], "model.image_size=28: data=digits images are 8x8; set it to 8"),
        (
            ["model=gpt", "data=tokens", "model.vocab_size=100"],
            "model.vocab_size=100: data=tokens has token ids up to 511 (data.dataset.vocab_size=512); "
            "set model.vocab_size=512",
        ),
        (
            ["model=gpt", "data=tokens", "model.block_size=64"],
            "model.block_size=64: data=tokens samples are 128 tokens (data.dataset.seq_len); set model.block_size=128",
        ),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_named(overrides: list[str], said: str) -> None:
    assert fits.check_fit(plain(*overrides)) == said


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=mlp"],
        ["model=gpt", "data=tokens"],
        ["model.num_classes=12"],  # more outputs than classes trains (unused logits)
        ["optim=sgd", "optim.momentum=0.9", "sched=constant"],
        ["model._target_=torch.nn.Identity"],  # a user's own model: theirs to check
    ],
)
def test_what_fits_passes(overrides: list[str]) -> None:
    tree = plain(*overrides)
    assert fits.check_values(tree) is None and fits.check_fit(tree) is None


def test_hpctrain_train_refuses_before_writing_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for wrong in (["optim.lr=abc"], ["data=tokens"], ["model.num_classes=5"]):
        done = subprocess.run(
            [str(BIN / "hpctrain-train"), *wrong], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == CLI_USER_ERROR, done.stderr
        assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("config.yaml"))
