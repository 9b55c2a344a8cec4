"""The trainer's and the checkpoint writer's fault points, each reached in a real run and acting at
its exact moment, and a run that went through all of them still ends bit-identical.

One run dir, one single-process MLP run started four times (the same command each time):
1. `checkpoint.periodic_in_flight=kill@2`: SIGKILL while the second periodic checkpoint (step 10)
   is being written: step 5 stays the newest complete one, step 10 never counts.
2. `trainer.resume_loading=exit:7`: the process leaves after reading step 5, before applying it:
   nothing is journaled, nothing is changed.
3. `trainer.step=term@3,checkpoint.forced_in_flight=kill`: SIGTERM right after the third step of
   this process (step 8), so the ranks agree to stop at 8 and journal it; the forced save is then
   killed mid-write. The `stop` record is there, no checkpoint of step 8 is.
4. Unarmed: resumes from step 5 and trains to the end, equal bit for bit to an uninterrupted run
   (the `mlp-1x64` run of test_trainer.py, shared: checkpoints change nothing).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, TrainRuns, assert_ok, describe, events, load_weights, train_command, train_env
from test_trainer import RUNS

from hpctrain import faults
from hpctrain.checkpoint import store

pytestmark = pytest.mark.slow

REFERENCE = RUNS["mlp-1x64"]
CHAIN = (*REFERENCE.overrides, "trainer.ckpt_every=5", "trainer.log_every=1", "trainer.eval_every=0")


def _run(run_dir: Path, arming: str) -> subprocess.CompletedProcess[str]:
    env = {**train_env(), faults.ENV: arming} if arming else train_env()
    return subprocess.run(
        train_command(run_dir, CHAIN),
        cwd=run_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _complete(run_dir: Path) -> list[int]:
    return [e.step for e in store.entries(run_dir / "checkpoints")]


def test_each_fault_point_acts_at_its_moment_and_the_run_still_ends_exact(tmp_path: Path, train_run: TrainRuns) -> None:
    run_dir = tmp_path / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)

    # 1. Killed while the periodic checkpoint of step 10 is in flight.
    killed = _run(run_dir, "checkpoint.periodic_in_flight=kill@2")
    assert killed.returncode == -signal.SIGKILL, describe(killed)
    assert _complete(run_dir) == [5], describe(killed)
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [5]
    assert (run_dir / "checkpoints" / "step_00000010.pt.tmp").exists(), "the write was not in flight"
    journal = (run_dir / "events.jsonl").read_bytes()

    # 2. Gone between reading the checkpoint and applying it: nothing written, nothing lost.
    loading = _run(run_dir, "trainer.resume_loading=exit:7")
    assert loading.returncode == 7, describe(loading)
    assert (run_dir / "events.jsonl").read_bytes() == journal
    assert _complete(run_dir) == [5]

    # 3. SIGTERM right after step 8; the stop is agreed and journaled, then its save is killed.
    stopped = _run(run_dir, "trainer.step=term@3,checkpoint.forced_in_flight=kill")
    assert stopped.returncode == -signal.SIGKILL, describe(stopped)
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 5]
    assert [(e["step"], e["reason"]) for e in events(run_dir, "stop")] == [(8, "preempt")], describe(stopped)
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [5], "the killed forced save counts for nothing"
    assert _complete(run_dir) == [5]

    # 4. Unarmed: from step 5 to the end, as if nothing had happened.
    done = _run(run_dir, "")
    assert_ok(done)
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 5, 5]
    proc, reference = train_run(REFERENCE.label, *REFERENCE.overrides)
    assert_ok(proc)
    ours, theirs = load_weights(run_dir), load_weights(reference)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "the resumed run differs from the uninterrupted one"
