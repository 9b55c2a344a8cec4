"""events.jsonl / metrics.jsonl: one strict-JSON object a line, appended, readable while torn."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path

import pytest

from hpctrain.run.causes import Cause, CheckpointReason, StopReason
from hpctrain.run.events import Checkpoint, Failure, Finish, Journal, Requeue, Start, Stop, read_events
from hpctrain.run.jsonlines import JsonLines, read_jsonl


def _strict_lines(path: Path) -> list[dict]:
    """Parse every line as strict JSON: NaN / Infinity tokens are not JSON and fail here."""

    def refuse(token: str) -> None:
        raise AssertionError(f"{path} holds {token}, which is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_jsonlines_writes_one_object_a_line_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "loss": 2.5, "lr": 1e-3}, {"step": 2, "loss": 2.25, "lr": 5e-4, "note": "ünï"}]
    out = JsonLines(path)
    for record in records:
        out.write(record)
    assert path.read_text(encoding="utf-8").count("\n") == 2
    assert _strict_lines(path) == records
    assert read_jsonl(path) == records


def test_a_second_writer_appends(tmp_path: Path) -> None:
    # A requeued job opens the same files again: earlier lines stay.
    path = tmp_path / "metrics.jsonl"
    JsonLines(path).write({"step": 1})
    JsonLines(path).write({"step": 2})
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_disabled_writer_writes_nothing(tmp_path: Path) -> None:
    # Ranks > 0 hold disabled writers.
    path = tmp_path / "metrics.jsonl"
    JsonLines(path, enabled=False).write({"step": 1})
    Journal(tmp_path / "events.jsonl", enabled=False).write_event(Start())
    assert not path.exists() and not (tmp_path / "events.jsonl").exists()


def test_journal_events_carry_event_and_time(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    before = time.time()
    journal.write_event(Start(world_size=2, nodes=["a", "b"], job_id=None))
    journal.write_event(Finish(step=10, extra={"eval_accuracy": 0.5}))
    after = time.time()
    start, finish = _strict_lines(path)
    assert start["event"] == "start" and finish["event"] == "finish"
    assert start["world_size"] == 2 and start["nodes"] == ["a", "b"] and start["job_id"] is None
    assert finish["step"] == 10 and finish["eval_accuracy"] == 0.5
    for record in (start, finish):
        assert before - 0.01 <= record["time"] <= after + 0.01
    assert read_jsonl(path) == [start, finish]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_written_as_null(tmp_path: Path, value: float) -> None:
    path = tmp_path / "metrics.jsonl"
    JsonLines(path).write({"step": 3, "loss": value, "lr": 0.1})
    Journal(tmp_path / "events.jsonl").write_event(Finish(step=3, extra={"loss": value}))
    assert _strict_lines(path) == [{"step": 3, "loss": None, "lr": 0.1}]
    assert _strict_lines(tmp_path / "events.jsonl")[0]["loss"] is None


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.write_event(Start(world_size=1))
    journal.write_event(Checkpoint(step=5))
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"event": "finish", "time": 17, "st')  # the writer was killed mid-line
    records = read_jsonl(path)
    assert [r["event"] for r in records] == ["start", "checkpoint"]
    # The next life of the job appends after the torn line; its records are read again.
    with open(path, "a", encoding="utf-8") as file:
        file.write("\n")
    journal.write_event(Start(world_size=1))
    assert [r["event"] for r in read_jsonl(path)] == ["start", "checkpoint", "start"]


def test_reading_a_missing_file_gives_nothing(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_the_first_record_after_a_torn_line_is_not_lost(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.write_event(Start(world_size=1))
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"event": "checkpoint", "st')  # killed mid-line, no newline
    Journal(path).write_event(Start(world_size=1, restart=1))  # the requeued job
    assert [r.get("restart") for r in read_jsonl(path)] == [None, 1]


# ---- typed records: the words on disk, the enums in memory --------------------------------------


def test_causes_and_reasons_are_written_as_their_words_and_read_back_as_enums(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.write_event(Stop(time=10.0, job_id="36_7", restart=2, step=40, reason=StopReason.PREEMPT, deadline_s=None))
    journal.write_event(Checkpoint(time=11.0, step=40, reason=CheckpointReason.PREEMPT, blocking_s=0.1, write_s=0.2))
    journal.write_event(Requeue(time=12.0, job_id="36_7", restart=2, cause=Cause.PREEMPT, excluded=[]))
    # The contract on disk: plain words, the fields the docs name, a stop's null deadline too.
    assert path.read_text().splitlines() == [
        '{"event": "stop", "time": 10.0, "job_id": "36_7", "restart": 2, "step": 40, "reason": "preempt", '
        '"deadline_s": null}',
        '{"event": "checkpoint", "time": 11.0, "step": 40, "reason": "preempt", "blocking_s": 0.1, "write_s": 0.2}',
        '{"event": "requeue", "time": 12.0, "job_id": "36_7", "restart": 2, "cause": "preempt", "excluded": []}',
    ]
    stop, checkpoint, requeue = read_events(path)
    assert isinstance(stop, Stop) and stop.reason is StopReason.PREEMPT
    assert isinstance(checkpoint, Checkpoint) and checkpoint.reason is CheckpointReason.PREEMPT
    assert isinstance(requeue, Requeue) and requeue.cause is Cause.PREEMPT


def test_a_forced_saves_checkpoint_keeps_its_null_deadline(tmp_path: Path) -> None:
    # Ctrl-C gives no deadline: the forced checkpoint still says so (null), a periodic one never.
    path = tmp_path / "events.jsonl"
    Journal(path).write_event(Checkpoint(time=1.0, step=7, reason=CheckpointReason.INTERRUPT, forced_save="written"))
    Journal(path).write_event(Checkpoint(time=2.0, step=8))
    forced, periodic = _strict_lines(path)
    assert forced["deadline_s"] is None and forced["forced_save"] == "written"
    assert "deadline_s" not in periodic and periodic["reason"] == "periodic"


def test_a_word_from_a_newer_hpctrain_reads_and_writes_back_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    line = '{"event": "failure", "time": 5.0, "job_id": "9", "restart": 0, "cause": "solar_flare", "nodes": ["n1"]}'
    path.write_text(line + "\n" + '{"event": "checkpoint", "time": 6.0, "step": 3, "reason": "hourly"}\n')
    failure, checkpoint = read_events(path)
    assert isinstance(failure, Failure) and isinstance(checkpoint, Checkpoint)
    # Readable as the word it is, and none of the causes this hpctrain acts on.
    assert failure.cause == "solar_flare" and str(failure.cause) == "solar_flare"
    assert isinstance(failure.cause, Cause) and failure.cause not in list(Cause)
    assert checkpoint.reason == "hourly" and checkpoint.reason != CheckpointReason.PERIODIC
    copy = tmp_path / "copy.jsonl"
    Journal(copy).write_event(failure)
    assert copy.read_text() == line + "\n"


def test_a_record_without_a_field_its_event_needs_is_skipped_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "requeue", "time": 1.0}\n{"event": "finish", "time": 2.0, "step": 4}\n')
    assert [e.name for e in read_events(path)] == ["finish"]


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_filesystem_without_flock_leaves_the_journal_unlocked_not_unwritable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """flock on some NFS and Lustre mounts fails (ENOLCK, ENOSYS): a control step's requeue reads
    the journal under this lock and must still requeue; any other error is not swallowed."""
    from hpctrain.run import jsonlines

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(jsonlines.fcntl, "flock", no_locks)
    events = tmp_path / "events.jsonl"
    with jsonlines.locked(events):
        JsonLines(events).write({"event": "cancelled"})
    assert [line["event"] for line in read_jsonl(events)] == ["cancelled"]

    def broken(fd: int, operation: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(jsonlines.fcntl, "flock", broken)
    with pytest.raises(OSError), jsonlines.locked(events):
        pass
