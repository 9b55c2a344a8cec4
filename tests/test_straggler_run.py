"""A rank made slow in a real run is named: two training processes of a small GPT, and rank 1
stopped for 50 ms of every 100 ms (SIGSTOP, SIGCONT: it runs at about half speed) for 20 s.
Rank 0 journals one `straggler` naming rank 1 within 60 s of the slowdown, none before it, and
`straggler_cleared` once rank 1 runs at full speed again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import train_command, train_env

pytestmark = [pytest.mark.slow, pytest.mark.stragglers]

GPT = ["model=gpt", "data=tokens", "data.dataset.seq_len=64", "trainer.nprocs=2", "trainer.eval_every=0"]
SLOWED_S = 20.0  # two windows of the slowed steps, with room on a loaded machine


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def ranks_of(launcher: int) -> list[int]:
    """The launcher's ranks: the children of its forkserver."""

    def children(pid: int) -> list[int]:
        done = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    return sorted(rank for server in children(launcher) for rank in children(server))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_at_half_speed_is_named_and_cleared(strategy: str, tmp_path: Path) -> None:
    """With fsdp its peer waits for it in every unit's gather inside its forward: timed apart, so
    the slow rank is named, not the one that waits."""
    run_dir = tmp_path / "run"
    overrides = [*GPT, f"trainer.strategy={strategy}", "trainer.max_steps=100000", "trainer.log_every=10"]
    overrides.append("trainer.ckpt_every=0")
    with open(tmp_path / "out.log", "w") as out:
        launcher = subprocess.Popen(
            train_command(run_dir, overrides),
            cwd=tmp_path,
            env=train_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while steps_logged(run_dir) < 60:  # three windows at full speed first
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()[-3000:]
            time.sleep(0.2)
        ranks = ranks_of(launcher.pid)
        assert len(ranks) == 2, ranks
        # The forkserver forks rank 0 first: the higher pid is rank 1.
        slowed_at = time.time()
        while time.time() - slowed_at < SLOWED_S:
            os.kill(ranks[1], signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(ranks[1], signal.SIGCONT)
            time.sleep(0.05)
        full_speed_at = time.time()
        while time.time() - full_speed_at < 20 and not _events(run_dir, "straggler_cleared"):
            time.sleep(0.5)
    finally:
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(120)
    named = _events(run_dir, "straggler")
    assert named, (tmp_path / "out.log").read_text()[-3000:]
    first = named[0]
    assert first["ranks"] == [1] and first["slowdown"][0] >= 1.3 and first["window_steps"] == 20, named
    assert slowed_at < first["time"] < slowed_at + 60, (first, slowed_at)
    cleared = [e for e in _events(run_dir, "straggler_cleared") if 1 in e["ranks"]]
    assert cleared and cleared[0]["time"] > first["time"], _events(run_dir, "straggler_cleared")


def _events(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == name]
