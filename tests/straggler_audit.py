"""No false `straggler` anywhere in the suite: a rank is named slow only where a test
slowed it on purpose.

The suite's training runs go through every phase that looks like a slow rank from afar: a first
step that compiles, a checkpoint written, an evaluation, a rank descheduled on a machine running
more processes than it has cores, a relaunch's first steps. At the end of each pytest worker's
session every journal the worker's tests left (its temporary folders, the shared training runs and
the reference runs) is read, and a `straggler` in one that no test marked `stragglers` wrote is an
error naming the journal and the ranks. A test that slows a rank on purpose is marked
`@pytest.mark.stragglers`; its folder is left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

STRAGGLER = "straggler"
JOURNAL = "events.jsonl"


def named_stragglers(journal: Path) -> list[dict]:
    """The `straggler` records of one events.jsonl (a torn last line is skipped: a run may still be
    writing it)."""
    try:
        text = journal.read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if f'"{STRAGGLER}"' not in line:  # most lines: no parse
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("event") == STRAGGLER:
            found.append(record)
    return found


def _journals(roots: Iterable[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_dir():
            yield from root.rglob(JOURNAL)


def false_stragglers(roots: Iterable[Path], expected: Iterable[Path]) -> list[str]:
    """One line per journal under `roots` that names a straggler, those under an `expected` folder
    (a test's that slowed a rank) left out."""
    allowed = [folder.resolve() for folder in expected]
    lines = []
    for journal in sorted(set(_journals(roots))):
        where = journal.resolve()
        if any(where.is_relative_to(folder) for folder in allowed):
            continue
        for record in named_stragglers(journal):
            lines.append(
                f"{journal}: straggler at step {record.get('step')}: ranks {record.get('ranks')} "
                f"on {record.get('nodes')}, slowdown {record.get('slowdown')}"
            )
    return lines
