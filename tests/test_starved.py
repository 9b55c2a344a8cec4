"""hpctrain.recovery.starved: which of a waiting replacement's excluded nodes to let back in, as a
table over Slurm's own records (captured on the dev cluster: tests/fixtures/slurm/scontrol/
pending_starved_by_exclusion.txt is a 2-node job submitted with --exclude=node1 while node3 was
drained "Kill task failed", pending `ReqNodeNotAvail,_UnavailableNodes:node3`, NumNodes=2-2)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.recovery.facts import parse_sinfo_nodes
from hpctrain.recovery.starved import nodes_needed, reason_word, to_release
from hpctrain.slurm.records import parse_job_record

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
STARVED = parse_job_record((FIXTURES / "scontrol" / "pending_starved_by_exclusion.txt").read_text())


def sinfo(name: str) -> dict:
    return parse_sinfo_nodes((FIXTURES / f"sinfo_{name}.txt").read_text())


def test_the_captured_record_reads_as_a_job_waiting_for_nodes() -> None:
    assert STARVED is not None
    assert (STARVED.state, reason_word(STARVED.reason), STARVED.exc_node_list) == (
        "PENDING",
        "ReqNodeNotAvail",
        "node1",
    )
    assert nodes_needed(STARVED) == 2


ROWS = {
    # node1 (excluded: the keeper's silent batch host) is back; node3 drained: node2 alone is too
    # few for the 2 nodes it needs. node1 is let back in.
    "starved: the excluded node is back in service": (STARVED, "node3_drained", (), ["node1"]),
    # Every node in service: node2 and node3 can serve it; it waits for its turn, node1 stays out.
    "the nodes it may use can serve it: left alone": (STARVED, "idle", (), []),
    # node1 is the user's own slurm.exclude: never let in.
    "the user's own exclusion stays": (STARVED, "node3_drained", ("node1",), []),
    # Not waiting for nodes: its BeginTime (a requeue's hold), a dependency, its priority.
    "waiting for its BeginTime": (replace(STARVED, reason="BeginTime"), "node3_drained", (), []),
    "waiting for its turn": (replace(STARVED, reason="Priority"), "node3_drained", (), []),
    "running already": (replace(STARVED, state="RUNNING", reason=None), "node3_drained", (), []),
    "nothing excluded": (replace(STARVED, exc_node_list=None), "node3_drained", (), []),
    "a plain count of nodes reads too": (replace(STARVED, num_nodes="2"), "node3_drained", (), ["node1"]),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_to_release(row: tuple) -> None:
    record, nodes, user_exclude, expected = row
    assert to_release(record, user_exclude, sinfo(nodes), ()) == expected


def test_only_the_jobs_partition_counts() -> None:
    # Its partition holds node1 and node2 only: node2 alone is too few, node1 comes back.
    assert to_release(STARVED, (), sinfo("idle"), ("node1", "node2")) == ["node1"]
    # node2 down in a partition of node1 and node2: even with node1 back it cannot start, and
    # nothing is gained by letting it in now.
    assert to_release(STARVED, (), sinfo("node_down_while_held"), ("node1", "node2")) == []


def test_status_names_a_starved_job_with_the_command_that_lets_it_start() -> None:
    from hpctrain.status.starved_note import note, waits_for_nodes

    assert STARVED is not None
    line = note(STARVED, (), sinfo("node3_drained"), ())
    assert line == (
        "job 26817026 waits (ReqNodeNotAvail,_UnavailableNodes:node3) for nodes it excludes itself: node1 is back "
        "in service; `scontrol update JobId=26817026 ExcNodeList=` lets it start"
    )
    assert note(STARVED, (), sinfo("idle"), ()) is None  # it waits for its turn
    # The user's own exclusion stays in the command.
    both = replace(STARVED, exc_node_list="node1,node4")
    assert note(both, ("node4",), sinfo("node3_drained"), ()) == line.replace("ExcNodeList=", "ExcNodeList=node4")
    assert waits_for_nodes("PENDING", "ReqNodeNotAvail, UnavailableNodes:node3")
    assert not waits_for_nodes("PENDING", "BeginTime") and not waits_for_nodes("RUNNING", None)
