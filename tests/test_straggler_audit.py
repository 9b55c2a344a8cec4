"""The suite's check for false stragglers (tests/straggler_audit.py), on journals written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import straggler_audit

# Its journals name stragglers on purpose: its folders are left out of the suite's own check.
pytestmark = pytest.mark.stragglers

STRAGGLER = {
    "event": "straggler",
    "time": 1.0,
    "life": 0,
    "step": 40,
    "ranks": [1],
    "nodes": ["node2"],
    "slowdown": [1.9],
    "window_steps": 20,
}
CLEARED = {
    "event": "straggler_cleared",
    "time": 2.0,
    "life": 0,
    "step": 80,
    "ranks": [1],
    "nodes": ["node2"],
    "window_steps": 20,
}
START = {"event": "start", "time": 0.5, "life": 0, "step": 0}


def journal(folder: Path, *records: dict, torn: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn)
    return path


def test_a_journal_naming_a_straggler_is_reported_with_its_ranks(tmp_path: Path) -> None:
    path = journal(tmp_path / "test_resume0" / "run", START, STRAGGLER, CLEARED)
    assert straggler_audit.false_stragglers([tmp_path], expected=[]) == [
        f"{path}: straggler at step 40: ranks [1] on ['node2'], slowdown [1.9]"
    ]


def test_a_cleared_episode_alone_a_torn_line_and_other_events_are_not_stragglers(tmp_path: Path) -> None:
    journal(tmp_path / "a", START, CLEARED, torn='{"event": "straggler", "ti')
    journal(tmp_path / "b", {"event": "failure", "time": 1.0, "life": 0, "detail": "no straggler here"})
    assert straggler_audit.false_stragglers([tmp_path], expected=[]) == []


def test_a_folder_of_a_test_that_slowed_a_rank_on_purpose_is_left_out(tmp_path: Path) -> None:
    journal(tmp_path / "test_slowed0" / "run", STRAGGLER)
    other = journal(tmp_path / "test_other0" / "run", STRAGGLER)
    assert straggler_audit.false_stragglers([tmp_path], expected=[tmp_path / "test_slowed0"]) == [
        f"{other}: straggler at step 40: ranks [1] on ['node2'], slowdown [1.9]"
    ]


def test_roots_that_do_not_exist_or_overlap_report_each_journal_once(tmp_path: Path) -> None:
    journal(tmp_path / "run", STRAGGLER)
    lines = straggler_audit.false_stragglers([tmp_path, tmp_path / "run", tmp_path / "gone"], expected=[])
    assert len(lines) == 1
