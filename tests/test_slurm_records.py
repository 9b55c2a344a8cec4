"""`scontrol show job -o` records captured on the dev cluster, parsed once (hpctrain.slurm.records),
and Slurm's job states sorted once (hpctrain.slurm.states), against squeue(1)'s own list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.slurm import states
from hpctrain.slurm.records import JobRecord, parse_job_record, parse_job_records, parse_partition

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def record(name: str) -> JobRecord:
    found = parse_job_records((FIXTURES / "scontrol" / name).read_text())
    assert len(found) == 1
    return found[0]


RECORDS = {
    "running.txt": JobRecord(
        "1", "RUNNING", None, 0, partition="batch", node_list="node1", batch_host="node1", num_nodes="1"
    ),
    # Preempted with PreemptMode=REQUEUE: back in the queue, held ~2 minutes.
    "requeued_pending.txt": JobRecord("4", "PENDING", "BeginTime", 1, partition="batch", num_nodes="1"),
    "completed.txt": JobRecord(
        "5", "COMPLETED", None, 0, partition="urgent", node_list="node1", batch_host="node1", num_nodes="1"
    ),
    # JobName holds `JobState=COMPLETED Reason=None`, Account `$(id)`, Comment `JobState=FAILED Restarts=9`.
    "hostile_held.txt": JobRecord("6", "PENDING", "JobHeldUser", 0, partition="batch", num_nodes="1"),
    # A SIGTERM's records (README_stop.md): only a preemption shows a PreemptTime.
    "stop_preempted.txt": JobRecord(
        "25817000",
        "RUNNING",
        None,
        0,
        partition="batch",
        node_list="node[1-2]",
        batch_host="node1",
        preempt_time="2026-11-24T11:16:56",
        num_nodes="2",
    ),
    "stop_cancelled.txt": JobRecord(
        "25817002", "COMPLETING", None, 0, partition="batch", node_list="node2", batch_host="node2", num_nodes="1"
    ),
    "stop_admin_requeued.txt": JobRecord(
        "25817003", "COMPLETING", None, 1, partition="batch", node_list="node1", batch_host="node1", num_nodes="1"
    ),
    # sbatch -N 2 --constraint='fast&ib' (node1 and node2 given the features): Features= holds it.
    "running_constrained.txt": JobRecord(
        "22000006",
        "RUNNING",
        None,
        0,
        partition="batch",
        node_list="node[1-2]",
        batch_host="node1",
        features="fast&ib",
        qos="normal",
        num_nodes="2",
    ),
}


@pytest.mark.parametrize("name, expected", RECORDS.items(), ids=RECORDS.keys())
def test_records_captured_on_the_dev_cluster(name: str, expected: JobRecord) -> None:
    assert record(name) == expected


def test_array_tasks_answer_for_their_ids() -> None:
    found = parse_job_records((FIXTURES / "arrays" / "scontrol_tasks.txt").read_text())
    assert [(r.job_id, r.names, r.state) for r in found] == [
        ("5", ["5", "4_0"], "RUNNING"),
        ("4", ["4", "4_1"], "PENDING"),
        ("4", ["4", "4_2"], "PENDING"),
    ]
    assert (found[1].reason, found[1].array_job_id, found[1].array_task_id) == ("JobArrayTaskLimit", "4", "1")


def test_a_shrunken_allocation_and_excluded_nodes() -> None:
    """With --no-kill a failed node leaves NodeList (slurm-dev-cluster.md); ExcNodeList after a requeue."""
    line = (FIXTURES / "scontrol" / "running.txt").read_text()
    line = line.replace("ExcNodeList=(null) NodeList=node1", "ExcNodeList=node2 NodeList=node[1,3]")
    parsed = parse_job_record(line)
    assert parsed is not None and (parsed.node_list, parsed.exc_node_list) == ("node[1,3]", "node2")


def test_a_job_name_that_imitates_a_preemption_is_not_one() -> None:
    line = (FIXTURES / "scontrol" / "stop_running.txt").read_text()
    line = line.replace(
        "JobName=low.sh",
        "JobName=x Deadline=N/A PreemptEligibleTime=N/A PreemptTime=2026-01-01T00:00:00 SuspendTime=None",
    )
    parsed = parse_job_record(line)
    assert parsed is not None and parsed.preempt_time is None and parsed.job_id == "25817000"


def test_another_order_of_fields_is_read_loosely_and_other_lines_are_not_records() -> None:
    loose = parse_job_record("JobId=9 JobName=x JobState=FAILED Restarts=2 Partition=p NodeList=n1 BatchHost=n1")
    assert loose == JobRecord("9", "FAILED", None, 2, partition="p", node_list="n1", batch_host="n1")
    assert parse_job_record("scontrol: show job 9") is None
    assert parse_job_record("JobId=9 JobName=x") is None
    assert parse_job_records("slurm_load_jobs error: Invalid job id specified\n") == []


def test_partition_fields() -> None:
    fields = parse_partition((FIXTURES / "scontrol" / "partition_batch.txt").read_text())
    assert (fields["GraceTime"], fields["PreemptMode"], fields["PartitionName"]) == ("20", "REQUEUE", "batch")


# ---- job states -----------------------------------------------------------------------------------


def documented_states() -> set[str]:
    """squeue(1) JOB STATE CODES of Slurm 22.05: `PD  PENDING` lines."""
    text = (FIXTURES / "squeue_job_state_codes.txt").read_text()
    return set(re.findall(r"^[A-Z]{1,3} +([A-Z_]+)$", text, re.M))


def test_every_documented_state_is_live_or_ended_never_both() -> None:
    documented = documented_states()
    assert len(documented) == 24
    assert documented == states.LIVE_STATES | states.ENDED_STATES
    assert not states.LIVE_STATES & states.ENDED_STATES
    assert states.WAITING_STATES | states.HELD_STATES | states.ALLOCATED_STATES == states.LIVE_STATES
    assert states.UNFINISHED_STATES | states.FAILED_STATES | states.STOPPED_STATES <= states.ENDED_STATES


# state -> (live, retry takes it, status counts it failed whatever the journal says)
STATES = {
    "PENDING": (True, False, False),
    "REQUEUED": (True, False, False),
    "REQUEUE_HOLD": (True, False, False),
    "SPECIAL_EXIT": (True, False, False),  # requeued and held: released, it runs in its run dir
    "RUNNING": (True, False, False),
    "COMPLETING": (True, False, False),
    "SUSPENDED": (True, False, False),
    "COMPLETED": (False, False, False),  # the journal says whether the run finished
    "CANCELLED": (False, True, False),  # failed unless the run had finished (STOPPED_STATES)
    "PREEMPTED": (False, True, False),  # shown only when the preemption did not requeue
    "FAILED": (False, True, True),
    "TIMEOUT": (False, True, True),
    "NODE_FAIL": (False, True, True),
    "OUT_OF_MEMORY": (False, True, True),
    "BOOT_FAIL": (False, True, True),
    "DEADLINE": (False, True, True),
    "REVOKED": (False, False, False),  # a federation runs it on another cluster
}


@pytest.mark.parametrize("state, expected", STATES.items(), ids=STATES.keys())
def test_state_table(state: str, expected: tuple[bool, bool, bool]) -> None:
    live, retried, failed = expected
    assert state in documented_states()
    assert (state in states.LIVE_STATES, state in states.ENDED_STATES) == (live, not live)
    assert (state in states.UNFINISHED_STATES, state in states.FAILED_STATES) == (retried, failed)


def test_sacct_decorates_a_state() -> None:
    assert states.base_state("CANCELLED by 1000") == "CANCELLED" and states.base_state("RUNNING") == "RUNNING"
