"""Which pid is rank R of a Slurm job (scripts/job_processes.py), on real processes of this
machine carrying a task's environment, as the dev cluster's slurmstepd gives it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from job_processes import processes, rank_pid, rank_pids  # noqa: E402

from hpctrain.run.protocol import KEEPER_MODULE

JOB = "424242"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:  # with their children (a task's `sleep 60 &`), or they would be the next run's
        os.killpg(proc.pid, 9)
        proc.wait()


def task(started: list[subprocess.Popen[bytes]], step: str, rank: str, command: str, restart: str = "0") -> int:
    env = {**os.environ, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": step, "SLURM_PROCID": rank}
    env["SLURM_RESTART_COUNT"] = restart
    started.append(subprocess.Popen(["sh", "-c", command], env=env, start_new_session=True))
    return started[-1].pid


def settled(job: str, rank: int, count: int) -> list[int]:
    """rank_pids once the shells have started their children (or `count` were never seen)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        named = [p for p in processes() if p.environ.get("SLURM_JOB_ID") == job]
        if len(named) >= count:
            return rank_pids(job, rank, named)
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} processes of job {job}")


def test_a_task_is_the_newest_steps_process_whose_parent_is_not_a_task(started) -> None:
    # Rank 1 of step 0, with a child that inherits its environment (a data-loader worker).
    first = task(started, "0", "1", "sleep 60 & exec sleep 61")
    assert settled(JOB, 1, 2) == [first]
    assert rank_pid(JOB, 0) is None  # no such rank
    # The relaunch on a spare: step 1's rank 1, while step 0's is still ending.
    relaunched = task(started, "1", "1", "exec sleep 62")
    assert settled(JOB, 1, 3) == [relaunched]
    assert rank_pid(JOB, 1) == relaunched
    # The batch step's shell and srun carry the job's variables too: never a task.
    task(started, "batch", "0", "exec sleep 63")
    assert settled(JOB, 0, 4) == []


def test_a_requeued_lifes_step_0_is_newer_than_an_earlier_lifes_relaunch(started) -> None:
    """Step ids start again at 0 in each life: the earlier life's relaunched rank (step 3), still
    ending, is not the rank of the life that trains now."""
    task(started, "3", "0", "exec sleep 64", restart="1")
    requeued = task(started, "0", "0", "exec sleep 65", restart="2")
    assert settled(JOB, 0, 2) == [requeued]


def running(pid: int, last_word: str) -> bool:
    """The process runs its own program: its command line ends with `last_word`."""
    return any(p.pid == pid and p.argv[-1:] == (last_word,) for p in processes())


@pytest.mark.parametrize("module", ["hpctrain.recovery.memory_holder", KEEPER_MODULE])
def test_the_batch_script_s_helper_steps_are_never_a_rank(started, module: str) -> None:
    """The memory holders and the keeper are tasks of newer steps than the training step's, with
    SLURM_PROCID 0, 1, ... (one a node): a fault meant for a rank must not land on them."""
    rank = task(started, "0", "2", "exec sleep 66")
    # A command line holding the helper's, as srun runs it (python -m MODULE RUN_DIR); started
    # as itself, not through sh (whose command line, before its exec, would be one word).
    env = {**os.environ, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "2", "SLURM_PROCID": "2", "SLURM_RESTART_COUNT": "0"}
    sleeper = [sys.executable, "-c", "import time; time.sleep(67)", "-m", module, "run"]
    helper = subprocess.Popen(sleeper, env=env, start_new_session=True)
    started.append(helper)
    # Read until both are seen as they run (a process between its fork and its exec shows
    # its parent's command line and environment): the rank, never the newer helper step.
    deadline = time.monotonic() + 10
    while not (running(rank, "66") and running(helper.pid, "run")):
        assert time.monotonic() < deadline, "the two processes never showed their own command lines"
        time.sleep(0.02)
    assert rank_pids(JOB, 2) == [rank]
