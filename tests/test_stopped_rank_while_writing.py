"""A rank SIGSTOPped while a checkpoint is written: alive and silent, as a node whose power or NIC
went while it wrote, at each of a checkpoint's three moments.

Rank 0 writes the checkpoints; the point stops it (`stop#0`, the whole process, its writer thread
included) and rank 1 blocks in its next collective. Rank 1's watchdog reports a `hang` after
`trainer.hang_timeout_s` (5 s here, far below the collective timeout of 300 s), the launcher
kills the stopped rank (a SIGTERM cannot reach it), and nothing the stopped write left counts
for more than it is. One run dir, one 2-process ConvNet run started four times (the same command;
its steps paced to 50 ms, helpers/paced.py, so that the ranks' stop vote, every quarter second,
comes before the end):

1. `checkpoint.periodic_in_flight=stop@2#0`: the step-10 periodic write half-written: `hang`;
   step 5 stays the newest complete checkpoint, the `.pt.tmp` never counts.
2. `trainer.step=term@3,checkpoint.forced_in_flight=stop#0`: a SIGTERM after step 8, the stop
   agreed at the next vote and journaled, then rank 0 stopped in the middle of the forced save:
   `hang`, the stop already journaled, no checkpoint of its step.
3. `checkpoint.between_renames=stop#0`: the step-10 write's `.pt` renamed into place, its `.json`
   not yet: `hang`; the `.pt` without its `.json` is the newest usable checkpoint.
4. Unarmed: resumes from that step-10 `.pt` and trains to the end, bit-identical to an
   uninterrupted run of the same config (unpaced: the pause changes no number).

Cells of the phase-by-fault matrix (docs/fault-matrix.md): a rank stopped while a periodic
write, a forced save or the rename pair is in flight. On Slurm the `hang` is then trained again
in the same job (a relaunch; tests/test_decide.py's rows for a hang), resuming as step 4 does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, assert_ok, describe, events, load_weights, train_command, train_env
from helpers.paced import PAUSE_ENV

from hpctrain import faults
from hpctrain.checkpoint import store
from hpctrain.run.exitcodes import WORKER_HUNG

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
CONFIG = (
    "model._target_=helpers.paced.PacedConvNet",
    "trainer.nprocs=2",
    "trainer.max_steps=30",
    "trainer.ckpt_every=5",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.hang_timeout_s=5",
    "trainer.collective_timeout_s=300",
)
PAUSE_S = "0.05"


def _run(run_dir: Path, arming: str, pause_s: str = PAUSE_S) -> subprocess.CompletedProcess[str]:
    env = {**train_env(TESTS), PAUSE_ENV: pause_s}
    if arming:
        env[faults.ENV] = arming
    return subprocess.run(
        train_command(run_dir, CONFIG),
        cwd=run_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def _hung(run_dir: Path, arming: str) -> subprocess.CompletedProcess[str]:
    """The run with `arming`: it must end as a hang reported by rank 1, no process left behind."""
    done = _run(run_dir, arming)
    assert done.returncode == WORKER_HUNG, describe(done)
    assert [(e["cause"], e["rank"]) for e in events(run_dir, "failure")][-1] == ("hang", 1), describe(done)
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert left.stdout == "", f"processes left behind: {left.stdout}"
    return done


def _complete(run_dir: Path) -> list[int]:
    return [e.step for e in store.entries(run_dir / "checkpoints")]


def test_a_rank_stopped_while_a_checkpoint_is_written_is_a_hang_and_the_run_still_ends_exact(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    checkpoints = run_dir / "checkpoints"

    # 1. Stopped while the periodic write of step 10 is in flight.
    periodic = _hung(run_dir, "checkpoint.periodic_in_flight=stop@2#0")
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [5], describe(periodic)
    assert (checkpoints / "step_00000010.pt.tmp").exists(), "the write was not in flight"
    assert _complete(run_dir) == [5]

    # 2. SIGTERM after step 8: the stop agreed and journaled, then its forced save stopped mid-write.
    forced = _hung(run_dir, "trainer.step=term@3,checkpoint.forced_in_flight=stop#0")
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 5], describe(forced)
    (stop,) = events(run_dir, "stop")
    assert stop["reason"] == "preempt" and stop["step"] >= 8, describe(forced)
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [5], "the stopped forced save counts for nothing"
    assert _complete(run_dir) == [5]

    # 3. Stopped between the step-10 write's two renames: its `.pt` is whole, its `.json` missing.
    renames = _hung(run_dir, "checkpoint.between_renames=stop#0")
    assert (checkpoints / "step_00000010.pt").exists(), describe(renames)
    assert not (checkpoints / "step_00000010.json").exists(), describe(renames)

    # 4. Unarmed: from the step-10 `.pt` (nothing newer is usable) to the end, as if nothing happened.
    done = _run(run_dir, "")
    assert_ok(done)
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 5, 5, 10], describe(done)
    reference = tmp_path / "reference"
    assert_ok(_run(reference, "", pause_s="0"))
    ours, theirs = load_weights(run_dir), load_weights(reference)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "the resumed run differs from the uninterrupted one"
