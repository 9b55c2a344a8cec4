"""Optimizers that get parameters by name (hpctrain.trainer.param_groups): the usual no-decay
rule as a table on the GPT, and `optim=adamw_no_decay` trained and resumed exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hpctrain.models.gpt import GPT
from hpctrain.trainer.param_groups import adamw, split_by_decay

BIN = Path(sys.executable).parent


def names(model: torch.nn.Module, chosen: list[torch.nn.Parameter]) -> set[str]:
    ids = {id(p) for p in chosen}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def test_biases_and_norms_are_not_decayed() -> None:
    model = GPT(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
    decayed, kept = split_by_decay(model.named_parameters())
    assert all(p.dim() >= 2 for p in decayed) and all(p.dim() < 2 for p in kept)
    assert any(name.endswith("bias") for name in names(model, kept))
    assert any("ln" in name for name in names(model, kept))
    assert len(decayed) + len(kept) == len(list(model.parameters()))
    # Embeddings listed by name are kept out of the decay too.
    _, kept_wte = split_by_decay(model.named_parameters(), no_decay=["wte"])
    assert any("wte" in name for name in names(model, kept_wte))
    optimizer = adamw(model.named_parameters(), weight_decay=0.1)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_optim_adamw_no_decay_trains_and_resumes_exactly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    common = ["optim=adamw_no_decay", "trainer.eval_every=0", "trainer.log_every=4", "trainer.ckpt_every=4"]

    def train(run: str, steps: int) -> None:
        done = subprocess.run(
            [str(BIN / "hpctrain-train"), f"hydra.run.dir={tmp_path / run}", *common, f"trainer.max_steps={steps}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    train("through", 8)
    train("resumed", 4)
    train("resumed", 8)
    a, b = (torch.load(tmp_path / run / "model.pt", weights_only=True) for run in ("through", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = (tmp_path / "through" / "config.yaml").read_text()
    assert "hpctrain.trainer.param_groups.adamw" in config
    assert json.loads((tmp_path / "through" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 8
