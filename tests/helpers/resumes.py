"""Which step a resumed life must start from, read from the run's own journal (events.jsonl).

When a fault strikes decides which checkpoint is the newest complete one: a periodic write may
still be under way in the background, a save forced by the signal may or may not end before
Slurm's SIGKILL. So the tests on real Slurm assert the contract, not a step a run usually
reaches: a life resumes from the newest checkpoint complete before it started. The journal
records a checkpoint once it is complete, so a kill between the two leaves one newer than the
journal's newest, never an older one: a life resumes from `newest_checkpoint_before` or later,
and final weights equal to an uninterrupted run's show that the state it resumed was whole.
"""

from __future__ import annotations

from typing import Any


def newest_checkpoint_before(journal: list[dict[str, Any]], life: int) -> int:
    """The newest checkpoint step recorded before the `start` of life `life` (an index into the
    journal's starts, -1 for the last one); 0 when there is none."""
    start = [i for i, event in enumerate(journal) if event["event"] == "start"][life]
    return max((event["step"] for event in journal[:start] if event["event"] == "checkpoint"), default=0)
