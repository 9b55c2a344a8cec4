"""events.jsonl / metrics.jsonl: one strict-JSON object a line, appended, readable while torn."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from hpctrain.run.events import Journal
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
    Journal(tmp_path / "events.jsonl", enabled=False).event("start")
    assert not path.exists() and not (tmp_path / "events.jsonl").exists()


def test_journal_events_carry_event_and_time(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    before = time.time()
    journal.event("start", world_size=2, nodes=["a", "b"], job_id=None)
    journal.event("finish", step=10, eval_accuracy=0.5)
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
    Journal(tmp_path / "events.jsonl").event("finish", loss=value)
    assert _strict_lines(path) == [{"step": 3, "loss": None, "lr": 0.1}]
    assert _strict_lines(tmp_path / "events.jsonl")[0]["loss"] is None


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.event("start", world_size=1)
    journal.event("checkpoint", step=5)
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"event": "finish", "time": 17, "st')  # the writer was killed mid-line
    records = read_jsonl(path)
    assert [r["event"] for r in records] == ["start", "checkpoint"]
    # The next life of the job appends after the torn line; its records are read again.
    with open(path, "a", encoding="utf-8") as file:
        file.write("\n")
    journal.event("start", world_size=1)
    assert [r["event"] for r in read_jsonl(path)] == ["start", "checkpoint", "start"]


def test_reading_a_missing_file_gives_nothing(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_the_first_record_after_a_torn_line_is_not_lost(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal = Journal(path)
    journal.event("start", world_size=1)
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"event": "checkpoint", "st')  # killed mid-line, no newline
    Journal(path).event("start", world_size=1, restart=1)  # the requeued job
    assert [r.get("restart") for r in read_jsonl(path)] == [None, 1]
