"""What hpctrain-cancel and hpctrain-submit --retry both do first: find the sweep's points, ask
Slurm where they stand, pick the ones the command takes (hpctrain/sweep/pick.py) and say which
were skipped and why."""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain.run.exitcodes import CLI_USER_ERROR
from hpctrain.sweep import pick
from hpctrain.sweep.points import PointError, gather


def choose(target: Path, names: list[str], retry: bool) -> list[pick.Verdict] | int:
    """The chosen points' verdicts, or the exit code when the sweep or a point does not exist."""
    try:
        survey = gather(target, names)
    except PointError as error:
        print(f"error: {error}", file=sys.stderr)
        return CLI_USER_ERROR
    for note in survey.notes:
        print(f"note: {note}", file=sys.stderr)
    verdicts = pick.pick(survey.points, survey.squeue_answered, retry=retry)
    for verdict in verdicts:
        if not verdict.chosen:
            print(f"skipped {verdict.point.name}: {verdict.why}")
    return [v for v in verdicts if v.chosen]
