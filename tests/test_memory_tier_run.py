"""The in-memory tier through the trainer, on this machine: real training processes copy their state
to a real memory holder every step, a rank is SIGKILLed (no save: the disk has no checkpoint),
and the run started again in its run dir resumes from memory, ending bit-identical to an
uninterrupted run.

Outside Slurm nothing starts holders; the test starts one as the batch script would (the life's
token in the environment, the holder named after this machine, where both ranks run).
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from conftest import assert_ok, run_train
from helpers import memory_holders
from slurmtools import same_weights
from test_fsdp import TINY_MODEL

from hpctrain import faults
from hpctrain.run.memory_wire import TOKEN_ENV

pytestmark = pytest.mark.slow

CONFIG = [
    "trainer.nprocs=2",
    "trainer.max_steps=60",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.ckpt_every=1000",  # no periodic checkpoint: only memory holds the state before the end
]


def starts(run_dir: Path) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "start"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert_ok(run_train(run_dir, CONFIG))
    return run_dir


def killed_and_resumed(run_dir: Path, tiered: list[str]) -> tuple[str, dict]:
    """Rank 1 SIGKILLed right after its 40th step, then the run started again in its run dir:
    the first run's output and the second `start`."""
    with memory_holders.holders(run_dir, nodes=(socket.gethostname(),)):
        env = {TOKEN_ENV: memory_holders.TOKEN}
        killed = run_train(run_dir, tiered, extra_env={**env, faults.ENV: "trainer.step=kill@40#1"})
        assert killed.returncode != 0, killed.stdout[-2000:]
        assert not list((run_dir / "checkpoints").glob("step_*")), "no checkpoint on disk before the end"
        assert_ok(run_train(run_dir, tiered, extra_env=env))
    first, second = starts(run_dir)
    assert first.get("resumed_from") is None
    assert second["resumed_from"] == "memory", second
    # Every step logged once: the step resumed from has its line (the copy is made after it).
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 61)), [r["step"] for r in lines]
    return killed.stdout + killed.stderr, second


def test_a_run_killed_without_a_save_resumes_from_memory_bit_identical(tmp_path: Path, reference: Path) -> None:
    run_dir = tmp_path / "run"
    # A copy every step (no overhead budget): the newest is step 39's or 40's.
    _, second = killed_and_resumed(run_dir, [*CONFIG, "trainer.memory_ckpt_every=1", "trainer.memory_ckpt_overhead=0"])
    assert 38 <= second["resumed_from_step"] <= 40, second
    assert same_weights(run_dir, reference), "not bit-identical to the uninterrupted run"


def test_the_ranks_widen_the_interval_to_the_overhead_and_still_resume_exactly(tmp_path: Path, reference: Path) -> None:
    run_dir = tmp_path / "run"
    # 2% of the time: on this machine a copy costs a good share of a small model's step, so the
    # ranks agree at step 20 on a wider interval than every step.
    output, second = killed_and_resumed(run_dir, [*CONFIG, "trainer.memory_ckpt_every=1"])
    (said,) = re.findall(r"memory tier: a copy every (\d+) steps", output)
    interval = int(said)
    assert interval > 1, output[-2000:]
    newest_copy = 40 // interval * interval if 40 // interval * interval > 20 else 20
    assert newest_copy - interval <= second["resumed_from_step"] <= 40, (second["resumed_from_step"], interval)
    assert same_weights(run_dir, reference), "not bit-identical to the uninterrupted run"


def test_without_the_lifes_holders_the_tier_is_off_and_the_run_trains_as_before(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_train(run_dir, [*CONFIG, "trainer.max_steps=5", "trainer.memory_ckpt_every=1"])
    assert_ok(proc)
    (start,) = starts(run_dir)
    assert start.get("resumed_from") is None and not (run_dir / "memory").exists()


# A GPT of two blocks sharded with FSDP2 on the two processes (tests/test_fsdp.py's tiny model).
FSDP = [*TINY_MODEL, "data.batch_size=6", "sched=constant", "trainer.strategy=fsdp", *CONFIG]


def test_a_sharded_run_resumes_each_rank_from_its_own_shards_in_memory(tmp_path: Path) -> None:
    """trainer.strategy=fsdp: each rank's copy is its shards of the parameters and of Adam's
    moments (hpctrain.checkpoint.local_shards), given back as DTensors on the same mesh."""
    reference = tmp_path / "reference"
    assert_ok(run_train(reference, FSDP))
    run_dir = tmp_path / "run"
    output, second = killed_and_resumed(
        run_dir, [*FSDP, "trainer.memory_ckpt_every=1", "trainer.memory_ckpt_overhead=0"]
    )
    assert 38 <= second["resumed_from_step"] <= 40, second
    assert same_weights(run_dir, reference), "not bit-identical to the uninterrupted run"
