"""A node's checks at the start of a life (slurm.health, hpctrain.process.node_health): the
judgments as a table, the checks run on real folders, files and commands, and what the control
step decides after a node failed one (tests/test_slurm_node_health.py runs it on the dev cluster).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_decide import DEFAULTS, EARLIER, JOB, failure, out, sinfo, start

from hpctrain.config.health import HealthConfig
from hpctrain.process import node_health
from hpctrain.process.node_health import (
    NodeUnhealthy,
    check_node,
    expected_gpus,
    judge_command,
    judge_gpus,
    judge_memory,
    judge_scratch,
)
from hpctrain.recovery.decide import History, decide
from hpctrain.recovery.facts import Budgets, ClusterView
from hpctrain.recovery.history import nodes_failing_in_a_row
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import DETECTED_BY_HEALTH, Failure, Journal, Relaunch, Requeue, read_events
from hpctrain.run.exitcodes import WORKER_NODE_UNHEALTHY
from hpctrain.run.life import LifeStamp
from hpctrain.run.node_memory import memory_available_kb
from hpctrain.status.diagnosis import diagnosis_lines

GB = 1024**3

JUDGMENTS = {
    "scratch with room": (judge_scratch("/tmp", 5 * GB, 1.0), True, "5.0 GB free in /tmp"),
    "scratch full": (judge_scratch("/tmp", GB // 10, 1.0), False, "0.1 GB free in /tmp"),
    "scratch exactly at the floor": (judge_scratch("/scratch", GB, 1.0), True, "1.0 GB free"),
    "scratch folder missing": (judge_scratch("/nope", None, 1.0), False, "/nope cannot be read"),
    "memory with room": (judge_memory(8 * 1024 * 1024, 1.0), True, "8.0 GB available"),
    "memory short": (judge_memory(512 * 1024, 1.0), False, "0.5 GB available"),
    "memory not shown: not judged": (judge_memory(None, 1.0), True, "not checked"),
    "no GPU asked for": (judge_gpus(0, 0), True, "no GPU asked for"),
    "all GPUs seen": (judge_gpus(8, 8), True, "8 of the 8 GPUs"),
    "a GPU fell off the bus": (judge_gpus(8, 7), False, "7 of the 8 GPUs"),
    "the driver sees none": (judge_gpus(4, 0), False, "0 of the 4 GPUs"),
    "site command passes": (judge_command("true", 0, "", 5.0), True, "`true` exited 0"),
    "site command fails, its words kept": (
        judge_command("dcgmi diag -r 1", 226, "GPU 3: ECC errors\n", 5.0),
        False,
        "`dcgmi diag -r 1` exited 226: GPU 3: ECC errors",
    ),
    "site command never ends": (judge_command("sleep 60", None, "", 5.0), False, "did not end within 5 s"),
}


@pytest.mark.parametrize("name", list(JUDGMENTS))
def test_a_check_judges_what_it_read(name: str) -> None:
    (ok, said), expected_ok, words = JUDGMENTS[name]
    assert ok is expected_ok
    assert words in said


@pytest.mark.parametrize(
    ("gpus_per_node", "visible", "expected"),
    [(0, "0,1", 0), (4, "0,1,2,3", 4), (4, "2", 1), (4, None, 4), (8, "", 8), (2, "0, 1,", 2)],
)
def test_the_gpus_a_task_should_see(gpus_per_node: int, visible: str | None, expected: int) -> None:
    assert expected_gpus(gpus_per_node, visible) == expected


def test_memavailable_is_read_from_the_kernels_own_words() -> None:
    assert (memory_available_kb(Path("/proc/meminfo").read_text()) or 0) > 0  # this machine's kernel
    assert memory_available_kb("MemTotal: 100 kB\nMemFree: 50 kB\n") is None  # before Linux 3.14
    assert memory_available_kb("MemAvailable:   24576 kB\n") == 24576


def test_allreduce_bandwidth_is_the_bus_bandwidth() -> None:
    # 4 MiB among 8 ranks in 1 ms: 2 * 7/8 * 4 MiB / 1 ms = 7.34 GB/s; one rank moves nothing.
    assert node_health.allreduce_gbps(8, 0.001) == pytest.approx(7.34, abs=0.01)
    assert node_health.allreduce_gbps(1, 0.001) == 0.0


def test_a_healthy_node_passes_every_check_in_milliseconds(tmp_path: Path) -> None:
    health = HealthConfig(command='test -d "$HPCTRAIN_RUN_DIR"', min_scratch_gb=0.0, min_memory_gb=0.0)
    results = check_node(health, tmp_path, "node1", 0, lambda: 0, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert [r.check for r in results] == ["run_dir", "scratch", "memory", "gpus", "command"]
    assert all(r.ok for r in results), results
    assert sum(r.seconds for r in results) < 5.0  # the budget per life
    assert list(tmp_path.iterdir()) == []  # the run dir's probe file is gone


def test_a_run_dir_that_takes_no_file_fails_its_node(tmp_path: Path) -> None:
    # A run dir whose mount went away: the path is there no more (root writes anywhere, so a
    # mode would not stop CI's tests; a missing folder stops everyone).
    gone = tmp_path / "unmounted"
    results = check_node(HealthConfig(checks=["run_dir", "memory"]), gone, "node2", 0, lambda: 0)
    assert [(r.check, r.ok) for r in results] == [("run_dir", False)]  # stops at the first failure
    assert f"{gone} takes no file" in results[0].result


def test_a_full_scratch_and_missing_gpus_fail_their_node(tmp_path: Path) -> None:
    # More than this machine's disk: the floor a full local disk misses.
    full = HealthConfig(checks=["scratch"], scratch_dir=str(tmp_path), min_scratch_gb=1e9)
    assert not check_node(full, tmp_path, "node2", 0, lambda: 0)[0].ok
    gpus = check_node(HealthConfig(checks=["gpus"]), tmp_path, "node2", 4, lambda: 3, env={})
    assert (gpus[0].ok, gpus[0].result) == (False, "3 of the 4 GPUs this task should see")


def test_a_site_command_that_hangs_is_ended_within_its_timeout(tmp_path: Path) -> None:
    health = HealthConfig(checks=[], command="echo checking; sleep 30", timeout_s=1.0)
    began = time.monotonic()
    results = check_node(health, tmp_path, "node2", 0, lambda: 0)
    assert time.monotonic() - began < 5.0
    assert (results[0].check, results[0].ok) == ("command", False)
    assert "did not end within 1 s" in results[0].result


def test_a_check_that_blocks_is_failed_at_its_timeout() -> None:
    # A stale network mount blocks statvfs for ever: the thread is left, the node named.
    def blocked() -> tuple[bool, str]:
        time.sleep(5)
        return True, "never"

    said = node_health._within(0.2, blocked)
    assert said[0] is False and "no answer within 0.2 s" in said[1]


def test_a_failed_check_journals_the_node_the_check_and_what_it_found(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "events.jsonl")
    health = HealthConfig(checks=["run_dir"], command="echo 'GPU 3: ECC errors'; exit 3")
    with pytest.raises(NodeUnhealthy, match="node2 failed its command check"):
        node_health.gate(health, tmp_path, "node2", 0, lambda: 0, journal, LifeStamp(JOB, 1))
    (written,) = read_events(tmp_path / "events.jsonl")
    assert isinstance(written, Failure)
    assert (written.cause, written.nodes, written.check, written.job_id, written.restart) == (
        Cause.NODE_HEALTH,
        ["node2"],
        "command",
        JOB,
        1,
    )
    assert written.result and "exited 3: GPU 3: ECC errors" in written.result
    passed = node_health.gate(
        HealthConfig(checks=["run_dir"]), tmp_path, "node1", 0, lambda: 0, journal, LifeStamp(JOB, 1)
    )
    assert set(passed) == {"run_dir_s"}


def test_an_unknown_check_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"slurm.health.checks\[1\]: unknown check 'disk'.*slurm.health.command"):
        HealthConfig(checks=["run_dir", "disk"])


# ---- what the control step makes of it ---------------------------------------------------------

UNHEALTHY = failure("node_health", t=105.0, nodes=["node2"], check="scratch", result="0.1 GB free in /tmp")
SPARE = ("node1", "node2", "node3")


def _decide(since: tuple, allocated: tuple, before: tuple = EARLIER, keep_out_after: int = 2, restart: int = 0):
    cluster = ClusterView(sinfo("idle"), allocated, allocated, 3000.0)
    history = History(JOB, restart, (*before, *since), since)
    budgets = Budgets(DEFAULTS, keep_out_after_lives=keep_out_after)
    return decide(history, out(WORKER_NODE_UNHEALTHY), cluster, budgets)


def test_a_node_that_failed_its_checks_is_replaced_by_a_spare() -> None:
    decision = _decide((UNHEALTHY,), SPARE)
    assert decision.action is Action.RELAUNCH
    lost, relaunch = decision.events
    assert isinstance(lost, Failure) and (lost.cause, lost.nodes, lost.detected_by) == (
        Cause.NODE_FAILURE,
        ["node2"],
        DETECTED_BY_HEALTH,
    )
    assert isinstance(relaunch, Relaunch) and (relaunch.nodes, relaunch.excluded) == (["node1", "node3"], ["node2"])


def test_without_a_spare_the_life_is_requeued_without_the_node() -> None:
    decision = _decide((UNHEALTHY,), ("node1", "node2"))
    assert decision.action is Action.REQUEUE
    assert decision.excluded == ("node2",)
    requeue = decision.events[-1]
    assert isinstance(requeue, Requeue) and requeue.cause == Cause.NODE_FAILURE


def life_failing(restart: int, *nodes: str, cause: str = "node_failure") -> tuple:
    t = 1000.0 * (restart + 1)
    return (
        start("node1", "node2", t=t, restart=restart),
        Failure(time=t + 1, job_id=JOB, restart=restart, cause=Cause(cause), nodes=list(nodes)),
    )


ROW_OF_LIVES = {
    "one life: not yet": ((life_failing(0, "node2"),), 2, set()),
    "two lives in a row": ((life_failing(0, "node2"), life_failing(1, "node2", cause="node_health")), 2, {"node2"}),
    "two lives apart": ((life_failing(0, "node2"), life_failing(1, "node3"), life_failing(2, "node2")), 2, set()),
    "a good life between": (
        (life_failing(0, "node2"), (start("node2", t=1500.0, restart=1),), life_failing(2, "node2")),
        2,
        set(),
    ),
    "three asked, two given": ((life_failing(0, "node2"), life_failing(1, "node2")), 3, set()),
    "off": ((life_failing(0, "node2"), life_failing(1, "node2")), 0, set()),
    "each named twice, by different causes": (
        (life_failing(0, "node2", "node3"), life_failing(1, "node3", "node2", cause="node_health")),
        2,
        {"node2", "node3"},
    ),
}


@pytest.mark.parametrize("name", list(ROW_OF_LIVES))
def test_nodes_failing_lives_in_a_row(name: str) -> None:
    lives, keep_out_after, kept = ROW_OF_LIVES[name]
    events = [e for one in lives for e in one]
    assert nodes_failing_in_a_row(events, keep_out_after) == kept


def test_a_node_that_broke_two_lives_stays_out_though_slurm_lists_it_idle() -> None:
    # node3 failed life 1 (Slurm's NODE_FAIL), then its checks as life 2 started; Slurm lists it
    # idle. Life 2 is requeued (no spare): node3 stays out of the requeued job, and of the next
    # lives, while a node lost only once would be let back once in service.
    before = (*EARLIER, *life_failing(1, "node3"))
    since = (
        Failure(
            time=3000.0,
            job_id=JOB,
            restart=2,
            cause=Cause.NODE_HEALTH,
            nodes=["node3"],
            check="gpus",
            result="7 of the 8 GPUs this task should see",
        ),
    )
    decision = _decide(since, ("node1", "node3"), before=before, restart=2)
    assert decision.action is Action.REQUEUE and decision.excluded == ("node3",)
    later = (*before, *since, *decision.events, start("node1", "node2", t=4000.0, restart=3))
    crash = (Failure(time=4100.0, job_id=JOB, restart=3, cause=Cause.CRASH),)
    kept = _decide(crash, ("node1", "node2"), before=later, restart=3)
    assert "node3" in kept.excluded
    let_back = _decide(crash, ("node1", "node2"), before=later, restart=3, keep_out_after=0)
    assert "node3" not in let_back.excluded
    lines = diagnosis_lines([*later, *crash], 2)
    assert "node_health: node3 failed its gpus check in job 41 restart 2: 7 of the 8 GPUs this task should see" in lines
    assert any(line.startswith("kept out: node3 (named by the failures of 2 lives in a row") for line in lines)
