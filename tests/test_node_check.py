"""A relaunch's node check (hpctrain.recovery.node_check) on real processes of this machine: it
ends the training processes of its job on its node, whichever way they were started, and leaves
every other process alone (the job's warm standby, another node's ranks, another job's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.recovery.check_nodes import check_nodes
from hpctrain.recovery.node_check import NodeCheck, check
from hpctrain.run.rank_processes import training_processes, worker_name

JOB, NODE = "88123", "node7"


def _sleeper(job: str, node: str, *, module: str | None = None, name: str | None = None) -> subprocess.Popen:
    """A process that sleeps as one of the job's processes would look: started as `python -m
    MODULE` (its command line), or renamed NAME (comm) as a standby's forked worker is."""
    rename = f"open('/proc/self/comm', 'w').write({name!r});" if name else ""
    code = f"import time;{rename}time.sleep(120)"
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": node}
    # `-c CODE -m MODULE`: Python runs CODE; the words are in the command line as a task's are.
    command = [sys.executable, "-c", code, *(["-m", module, "/run/dir"] if module else [])]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the rename took (the interpreter has started)
        comm = Path(f"/proc/{process.pid}/comm").read_text().strip()
        if not name or comm == name:
            return process
        time.sleep(0.02)
    raise AssertionError(f"{process.pid} never took the name {name}")


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_the_check_ends_the_jobs_ranks_on_its_node_and_nothing_else(processes: list) -> None:
    cold = _sleeper(JOB, NODE, module="hpctrain.worker")
    handed = _sleeper(JOB, NODE, module="hpctrain.process.handoff")
    warm = _sleeper(JOB, NODE, name=worker_name(3))
    standby = _sleeper(JOB, NODE, module="hpctrain.process.standby")  # the standby server itself
    other_node = _sleeper(JOB, "node8", module="hpctrain.worker")
    other_job = _sleeper("88124", NODE, name=worker_name(0))
    not_a_rank = _sleeper(JOB, NODE, name="hpctrain-rx")
    launcher = _sleeper(JOB, NODE, module="hpctrain.worker", name="srun")  # the batch shell's srun
    processes.extend([cold, handed, warm, standby, other_node, other_job, not_a_rank, launcher])
    assert training_processes(JOB, NODE) == sorted([cold.pid, handed.pid, warm.pid])
    found = check(JOB, NODE)
    assert (found.node, found.ended, found.lingering) == (NODE, 3, ())
    for ended in (cold, handed, warm):
        assert ended.wait(timeout=5) == -9
    for spared in (standby, other_node, other_job, not_a_rank, launcher):
        assert spared.poll() is None
    # Nothing left: a second check finds nothing to end.
    assert check(JOB, NODE) == NodeCheck(NODE, 0, ())


def test_a_process_that_will_not_end_is_reported_lingering(processes: list, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process in uninterruptible sleep (stuck in a driver call) cannot be made here: a kill
    # that does not take stands in for it. The check waits, then names it.
    rank = _sleeper(JOB, NODE, module="hpctrain.worker")
    processes.append(rank)
    monkeypatch.setattr("hpctrain.recovery.node_check.os.kill", lambda pid, signum: None)
    began = time.monotonic()
    assert check(JOB, NODE, wait_s=0.5) == NodeCheck(NODE, 0, (rank.pid,))
    assert time.monotonic() - began >= 0.5
    assert rank.poll() is None


def test_the_answer_line_reads_back_only_for_its_node() -> None:
    answer = NodeCheck("node3", 1, (4242, 4343))
    assert NodeCheck.parse(f"srun: warning\n{answer.line()}\n", "node3") == answer
    assert NodeCheck.parse(answer.line(), "node4") is None  # another node's line
    assert NodeCheck.parse("hpctrain-node-check node3 ended=x lingering=", "node3") is None
    assert NodeCheck.parse("", "node3") is None


def test_without_srun_nothing_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun on it: an image without Slurm's commands
    assert check_nodes(JOB, ["node1", "node2"], sys.executable) is None


def test_the_check_runs_as_a_module_and_prints_its_line(processes: list) -> None:
    rank = _sleeper(JOB, NODE, name=worker_name(0))
    processes.append(rank)
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.recovery.node_check", JOB, NODE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert NodeCheck.parse(done.stdout, NODE) == NodeCheck(NODE, 1, ())
    assert rank.wait(timeout=5) == -9
