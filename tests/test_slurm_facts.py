"""Slurm's own text, captured from the dev cluster (tests/fixtures/slurm), parsed into the facts
recovery decides on: a drained node is not a failed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.recovery.facts import ClusterView, Service, parse_sinfo_nodes, parse_time_left

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def nodes(name: str) -> dict:
    return parse_sinfo_nodes((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("sinfo_idle.txt", {"node1": Service.UP, "node2": Service.UP, "node3": Service.UP}),
        # An administrator drains node2 while a job holds it; node3 is set down.
        ("sinfo_drain_down_while_held.txt", {"node1": Service.UP, "node2": Service.DRAINED, "node3": Service.FAILED}),
        # node3's slurmd killed: `idle*` within SlurmdTimeout, then `down*` "Not responding".
        ("sinfo_not_responding.txt", {"node1": Service.UP, "node2": Service.DRAINED, "node3": Service.FAILED}),
        ("sinfo_down_not_responding.txt", {"node1": Service.UP, "node2": Service.DRAINED, "node3": Service.FAILED}),
        ("sinfo_node_down_while_held.txt", {"node1": Service.UP, "node2": Service.FAILED, "node3": Service.UP}),
        ("sinfo_spare_draining.txt", {"node1": Service.UP, "node2": Service.UP, "node3": Service.DRAINED}),
    ],
)
def test_node_states_tell_failed_from_drained(fixture: str, expected: dict) -> None:
    parsed = nodes(fixture)
    assert {name: state.service for name, state in parsed.items()} == expected


def test_reasons_and_raw_states_are_kept() -> None:
    parsed = nodes("sinfo_drain_down_while_held.txt")
    assert (parsed["node2"].state, parsed["node2"].reason) == ("draining", "maintenance window")
    assert parsed["node3"].reason == "bad dimm"
    assert nodes("sinfo_down_not_responding.txt")["node3"].state == "down*"


def test_a_line_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="NODE|STATE|REASON"):
        parse_sinfo_nodes("node1 idle\n")


def test_time_left_forms() -> None:
    assert parse_time_left((FIXTURES / "squeue_timeleft.txt").read_text()) == 4 * 60 + 58
    # The forms squeue documents for %L: [days-]hours:minutes:seconds, UNLIMITED, NOT_SET, INVALID.
    assert parse_time_left("1-02:03:04\n") == ((24 + 2) * 60 + 3) * 60 + 4
    assert parse_time_left("2:03:04") == (2 * 60 + 3) * 60 + 4
    assert parse_time_left("UNLIMITED") == float("inf")
    assert parse_time_left("NOT_SET") is None and parse_time_left("INVALID") is None
    with pytest.raises(ValueError, match="not a time left"):
        parse_time_left("soon")


def test_a_view_without_sinfo_counts_every_node_up_and_an_unlisted_node_as_gone() -> None:
    assert ClusterView().service("node1") is Service.UP  # sinfo could not run: a crash stays a crash
    view = ClusterView(nodes=nodes("sinfo_idle.txt"))
    assert view.service("node9") is Service.FAILED
