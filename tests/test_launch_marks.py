"""The mark that a step's tasks began (hpctrain.run.launch_marks), left by the worker's door as its
first act by the first task to begin on each node: the control step tells a step srun never
launched from one that crashed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpctrain.process.startup_clock import LAUNCHED_AT_ENV
from hpctrain.run import launch_marks

LAUNCHED_AT = "1796215044.523456789"  # as the batch shell's `date +%s.%N` writes it


def _worker(run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    # An empty run dir: the worker refuses it (no config.yaml) after its door has run.
    environ = {k: v for k, v in os.environ.items() if k not in ("SLURM_PROCID", "SLURM_LOCALID", LAUNCHED_AT_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.worker", str(run_dir)],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_first_task_of_a_node_leaves_the_mark_before_anything_can_fail(tmp_path: Path) -> None:
    # Rank 3, the first task of its node: any node's first task began, the step did.
    done = _worker(tmp_path, SLURM_PROCID="3", SLURM_LOCALID="0", **{LAUNCHED_AT_ENV: LAUNCHED_AT})
    assert done.returncode != 0  # it failed, and still it began: the mark says so
    assert launch_marks.began(tmp_path, float(LAUNCHED_AT))
    launch_marks.forget(tmp_path, float(LAUNCHED_AT))
    assert not launch_marks.began(tmp_path, float(LAUNCHED_AT))
    assert not list(tmp_path.glob(f"{launch_marks.PREFIX}*"))


def test_a_node_s_first_task_to_begin_marks_whatever_its_local_id(tmp_path: Path) -> None:
    # Rank 1 began first and died at its imports; rank 0 was ended by srun before it ran a line
    # (seen in CI): the step did begin, and its crash is a crash, not a launch that never happened.
    _worker(tmp_path, SLURM_PROCID="1", SLURM_LOCALID="1", **{LAUNCHED_AT_ENV: LAUNCHED_AT})
    assert launch_marks.began(tmp_path, float(LAUNCHED_AT))


def test_a_user_s_own_srun_leaves_no_mark(tmp_path: Path) -> None:
    _worker(tmp_path, SLURM_PROCID="0", SLURM_LOCALID="0")  # no launch moment: not the batch shell's step
    assert not list(tmp_path.glob(f"{launch_marks.PREFIX}*"))


def test_one_touch_a_node_while_its_first_task_lives(tmp_path: Path) -> None:
    node = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1", LAUNCHED_AT_ENV: LAUNCHED_AT}
    launch_marks.leave(tmp_path, {**node, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})  # this process: the first
    assert launch_marks.began(tmp_path, float(LAUNCHED_AT))
    launch_marks.forget(tmp_path, float(LAUNCHED_AT))
    # The node's second task finds the name held by the first, alive: it does not touch the file.
    _worker(tmp_path, SLURM_PROCID="1", SLURM_LOCALID="1", **node)
    assert not launch_marks.began(tmp_path, float(LAUNCHED_AT))
    # Another node's first task (nodes share this machine's network namespace on the dev cluster).
    _worker(tmp_path, SLURM_PROCID="2", SLURM_LOCALID="0", **{**node, "SLURMD_NODENAME": "node2"})
    assert launch_marks.began(tmp_path, float(LAUNCHED_AT))


def test_the_mark_of_a_launch_is_its_own(tmp_path: Path) -> None:
    launch_marks.leave(tmp_path, {"SLURM_PROCID": "0", LAUNCHED_AT_ENV: LAUNCHED_AT})
    assert launch_marks.began(tmp_path, 1796215044.523457)  # the after-step's float, rounded alike
    assert not launch_marks.began(tmp_path, 1796215050.0)  # another launch's
    launch_marks.leave(tmp_path / "missing", {"SLURM_PROCID": "0", LAUNCHED_AT_ENV: LAUNCHED_AT})  # no error
