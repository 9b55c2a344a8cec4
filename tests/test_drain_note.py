"""hpctrain-status on a running job whose node an administrator drains: one line, from sinfo's own
words (tests/fixtures/slurm/sinfo_spare_draining.txt: node3 draining, Reason hpctrain-test) and a
reservation as scontrol prints it."""

from __future__ import annotations

from pathlib import Path

from hpctrain.recovery.facts import parse_sinfo_nodes
from hpctrain.slurm.records import parse_reservations
from hpctrain.status.drain_note import drain_notes

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
STATES = parse_sinfo_nodes((FIXTURES / "sinfo_spare_draining.txt").read_text())


def test_a_job_on_a_draining_node_is_told_and_the_others_are_not() -> None:
    running = [("41", ["node1", "node3"]), ("42", ["node1", "node2"])]
    assert drain_notes(running, STATES) == [
        "job 41 trains on node3, which Slurm shows draining (hpctrain-test): the run trains on there, "
        "and its next life is placed elsewhere"
    ]
    assert drain_notes([("42", ["node1", "node2"])], STATES) == []
    assert drain_notes(running, {}) == []  # sinfo did not answer: nothing said


def test_the_reservation_that_takes_the_node_is_named() -> None:
    reservations = parse_reservations((FIXTURES / "scontrol" / "reservations.txt").read_text())
    assert reservations and all("ReservationName" in r for r in reservations)
    (line,) = drain_notes([("41", ["node3"])], STATES, reservations)
    name, start = reservations[0]["ReservationName"], reservations[0]["StartTime"]
    assert line.endswith(f"; reservation {name} takes it from {start}"), line
    assert parse_reservations("No reservations in the system\n") == []
