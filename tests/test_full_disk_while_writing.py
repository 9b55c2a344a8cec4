"""The checkpoint filesystem filling up while a forced save or a checkpoint's rename pair is in
flight: the newest complete checkpoint stays usable and nothing of the failed one is left.

The run dir lies on a tmpfs of its own (8 MB, helpers/disks.py). The write is held at its fault
point's gate (hpctrain.faults, gate:S) while the test fills every byte left, then let go, so the
rest of the write meets ENOSPC at exactly that moment. One run dir, one single-process MLP run
started three times:

1. `trainer.step=term@8,checkpoint.forced_in_flight=gate`: a SIGTERM after step 8, the stop
   journaled, its forced save held half-written, the disk filled: the save fails, its partial
   file is removed, a `failure` (`user_error`: the same disk would fail again) names the fix,
   and step 5 stays the newest complete checkpoint.
2. `checkpoint.between_renames=gate`: the step-10 write's `.pt` renamed into place, the disk
   filled before its `.json`: the `.json` cannot be written, the `.pt` is removed as well (a
   checkpoint is whole with its `.json` or not there at all), the same `failure`, step 5 stands.
3. The filler removed (a user freeing space), unarmed: resumes from step 5 and trains to the end,
   bit-identical to an uninterrupted run (test_trainer.py's `mlp-1x64`, shared).

Cells of the phase-by-fault matrix (docs/fault-matrix.md): the checkpoint disk full during a
forced save and between the two renames. On Slurm a `user_error` stops the run
(tests/test_decide.py, "user's mistake"), and `hpctrain-submit --retry` resumes it as step 3 does
(tests/test_slurm_full_disk.py, for the periodic write).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, TrainRuns, assert_ok, describe, events, load_weights, train_command, train_env
from helpers.disks import fill, small_tmpfs
from test_fault_points_run import CHAIN, REFERENCE

from hpctrain import faults
from hpctrain.checkpoint import store
from hpctrain.run.exitcodes import CLI_USER_ERROR

pytestmark = pytest.mark.slow

DISK = "8m"
GATE_S = 120


def _start(run_dir: Path, gates: Path, arming: str) -> subprocess.Popen[str]:
    # No bytecode written beside the run dir: the disk is for the run's own files.
    env = {**train_env(), faults.ENV: arming, faults.GATES_ENV: str(gates), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        train_command(run_dir, CHAIN),
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _filled_at(run_dir: Path, gates: Path, arming: str, point: str) -> subprocess.CompletedProcess[str]:
    """The run with `arming`, the disk filled while it is held at `point`'s gate, then let go."""
    running = _start(run_dir, gates, arming)
    reached, opened = faults.gate_files(gates, point)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not reached.exists():
        assert running.poll() is None, f"ended {running.returncode} before {point}: {running.communicate()}"
        assert time.monotonic() < deadline, f"{point} not reached"
        time.sleep(0.1)
    fill(run_dir.parent)
    opened.touch()
    stdout, stderr = running.communicate(timeout=RUN_TIMEOUT_S)
    return subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)


def _no_room(done: subprocess.CompletedProcess[str], run_dir: Path, step: int) -> None:
    """The failed write of `step` reported as the user's to fix, nothing of it left, step 5 whole."""
    assert done.returncode == CLI_USER_ERROR, describe(done)  # hpctrain-train's exit for a user's error
    failure = events(run_dir, "failure")[-1]
    assert failure["cause"] == "user_error", failure
    assert f"checkpoint at step {step}: No space left on device" in failure["message"], failure
    assert "the checkpoint of step 5 is intact" in done.stderr, describe(done)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000005.json", "step_00000005.pt"]
    assert [e.step for e in store.entries(run_dir / "checkpoints")] == [5]


def test_a_full_disk_during_a_forced_save_or_between_the_renames_keeps_the_newest_checkpoint(
    tmp_path: Path, train_run: TrainRuns
) -> None:
    with small_tmpfs(tmp_path / "disk", DISK) as disk:
        run_dir = disk / "run"
        filler = disk / "filler"

        # 1. The stop's forced save of step 8, held half-written while the disk fills.
        forced = _filled_at(
            run_dir,
            tmp_path / "gates1",
            "trainer.step=term@8,checkpoint.forced_in_flight=gate:120",
            "checkpoint.forced_in_flight",
        )
        assert [(e["step"], e["reason"]) for e in events(run_dir, "stop")] == [(8, "preempt")], describe(forced)
        _no_room(forced, run_dir, 8)
        filler.unlink()

        # 2. The step-10 write between its renames: the `.pt` in place, no room for its `.json`.
        renames = _filled_at(
            run_dir, tmp_path / "gates2", "checkpoint.between_renames=gate:120", "checkpoint.between_renames"
        )
        _no_room(renames, run_dir, 10)
        filler.unlink()

        # 3. Room again: from step 5 to the end.
        done = subprocess.run(
            train_command(run_dir, CHAIN),
            cwd=run_dir.parent,
            env={**train_env(), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert_ok(done)
        assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 5, 5], describe(done)
        ours = load_weights(run_dir)
    proc, reference = train_run(REFERENCE.label, *REFERENCE.overrides)
    assert_ok(proc)
    theirs = load_weights(reference)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs), "the resumed run differs from the uninterrupted one"


def test_a_full_disk_when_the_journal_is_first_written_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """The disk filled while the process waits to join its group: its `start` cannot be
    journaled. Before, an OSError traceback and exit 1 (in a Slurm job: a crash, charged and
    retried on the same full disk); now the user's error in one line, naming the run dir and
    the fix."""
    with small_tmpfs(tmp_path / "disk", DISK) as disk:
        run_dir = disk / "run"
        done = _filled_at(run_dir, tmp_path / "gates", "worker.before_rendezvous=gate:120", "worker.before_rendezvous")
    assert done.returncode == CLI_USER_ERROR, describe(done)
    assert "Traceback" not in done.stderr, describe(done)
    (told,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"the run dir {run_dir} has no room (No space left on device)" in told, told
    assert f"hpctrain-submit --retry {run_dir}" in told, told
