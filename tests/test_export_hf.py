"""A Hugging Face model trained by hpctrain with no adapter (its `.logits` used, dict-free token
data), exported with `hpctrain-export --hf` and loaded back by `from_pretrained` with the same
weights. Skipped where transformers is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import library_env

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")

BIN = Path(sys.executable).parent
GPT2 = [
    "model._target_=transformers.GPT2LMHeadModel",
    "+model.config._target_=transformers.GPT2Config",
    "+model.config.n_layer=2",
    "+model.config.n_embd=32",
    "+model.config.n_head=2",
    "+model.config.vocab_size=64",
    "+model.config.n_positions=32",
    "data=tokens",
    "data.dataset.vocab_size=64",
    "data.dataset.seq_len=16",
    "trainer.eval_every=2",
    "trainer.log_every=2",
]


def run(*command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=library_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_hugging_face_model_trains_and_exports_to_its_own_format(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", *GPT2, "trainer.max_steps=4", cwd=tmp_path)
    out = tmp_path / "hf"
    run(str(BIN / "hpctrain-export"), str(run_dir), "--hf", str(out), cwd=tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    trained = torch.load(run_dir / "model.pt", weights_only=True)
    state = loaded.state_dict()
    assert all(torch.equal(state[k], trained[k]) for k in trained if k in state)
    assert set(trained) <= set(state)


def test_a_model_that_is_no_hugging_face_model_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", "model=mlp", "trainer.max_steps=2", cwd=tmp_path)
    done = subprocess.run(
        [str(BIN / "hpctrain-export"), str(run_dir), "--hf", str(tmp_path / "hf")],
        env=library_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "is not a Hugging Face model" in done.stderr, done.stderr
