"""A run started again with a grown plan (hpctrain.cli.common.REPLANNABLE): a finished run trained
longer ends where a run planned that long from the start ends, bit for bit (with a schedule that
does not depend on the run's length); the change is journaled; anything else is still refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hpctrain.run.exitcodes import CLI_USER_ERROR

BIN = Path(sys.executable).parent
PLAN = ["sched=constant", "trainer.eval_every=0", "trainer.log_every=1", "trainer.ckpt_every=20"]


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_finished_run_trained_longer_ends_as_one_planned_that_long(tmp_path: Path) -> None:
    extended, planned = tmp_path / "extended", tmp_path / "planned"
    first = train(extended, *PLAN, "trainer.max_steps=40")
    assert first.returncode == 0, first.stderr[-3000:]
    longer = train(extended, *PLAN, "trainer.max_steps=80", "trainer.ckpt_every=40")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "goes on with a new plan (trainer.max_steps: 40 -> 80, trainer.ckpt_every: 20 -> 40)" in longer.stderr
    (replanned,) = [e for e in events(extended) if e["event"] == "replanned"]
    assert replanned["changes"] == {"trainer.max_steps": [40, 80], "trainer.ckpt_every": [20, 40]}
    starts = [e for e in events(extended) if e["event"] == "start"]
    assert [s["resumed_from_step"] for s in starts] == [0, 40]
    steps = [json.loads(line)["step"] for line in (extended / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 81))  # every step once
    reference = train(planned, *PLAN, "trainer.max_steps=80")
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert same_weights(extended, planned)


def test_what_is_trained_may_not_change_and_the_plan_may_not_shrink_below_what_was_trained(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert train(run_dir, *PLAN, "trainer.max_steps=40").returncode == 0
    before = (run_dir / "events.jsonl").read_text()
    other = train(run_dir, *PLAN, "trainer.max_steps=80", "optim.lr=0.01")
    assert other.returncode == CLI_USER_ERROR
    assert "already holds a run with another config (optim.lr: 0.001 -> 0.01)" in other.stderr, other.stderr
    assert "only its plan may change: trainer.max_steps" in other.stderr
    shorter = train(run_dir, *PLAN, "trainer.max_steps=30")
    assert shorter.returncode == CLI_USER_ERROR
    assert "trainer.max_steps=30 is below the 40 steps" in shorter.stderr, shorter.stderr
    assert (run_dir / "events.jsonl").read_text() == before  # nothing journaled for a refusal
    assert "max_steps: 40" in (run_dir / "config.yaml").read_text()
