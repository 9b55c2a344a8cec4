"""The last look before the batch script asks for its requeue (hpctrain.recovery.before_requeue), on
`scontrol show job` records captured on the dev cluster (tests/fixtures/slurm/scontrol/,
README_stop.md says how each was made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.recovery.before_requeue import BeforeRequeue, before_requeue
from hpctrain.slurm.records import JobRecord, parse_job_record

SCONTROL = Path(__file__).parent / "fixtures" / "slurm" / "scontrol"


def captured(name: str) -> JobRecord:
    found = parse_job_record((SCONTROL / name).read_text().strip())
    assert found is not None, name
    return found


# (the record, this life's restart number, what the control step does)
ROWS = {
    "still running: ask": ("stop_running.txt", 0, BeforeRequeue.ASK),
    "a preemption's grace running (PreemptTime set): ask": ("stop_preempted.txt", 0, BeforeRequeue.ASK),
    # scancel: COMPLETING, no restart more. Asking would bring the cancelled job back.
    "scancelled meanwhile: record the cancel, ask nothing": ("stop_cancelled.txt", 0, BeforeRequeue.CANCELLED),
    # An admin's `scontrol requeue`: COMPLETING too, but Restarts=1 past this life's 0.
    "an admin requeued it meanwhile: requeued already": ("stop_admin_requeued.txt", 0, BeforeRequeue.REQUEUED_ALREADY),
    # The same fields in a second life (Restarts=1 is its own count): COMPLETING without a restart
    # more is what a scancel of that life shows.
    "a second life scancelled meanwhile": ("stop_admin_requeued.txt", 1, BeforeRequeue.CANCELLED),
    # The time limit ended it (Reason=TimeLimit): no cancel; asked, Slurm refuses, the guardian
    # submits the run again.
    "the time limit ended it: ask": ("stop_timelimit.txt", 0, BeforeRequeue.ASK),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_before_requeue(row: tuple[str, int, BeforeRequeue]) -> None:
    name, restart, expected = row
    record = captured(name)
    assert before_requeue(record.restarts, record.being_ended, restart) is expected


def test_without_a_record_the_requeue_is_asked() -> None:
    # slurmctld did not answer the look: asking is what may still save the run.
    assert before_requeue(None, False, 0) is BeforeRequeue.ASK
