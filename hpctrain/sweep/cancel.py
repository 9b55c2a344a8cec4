"""Cancel chosen points with one scancel, and record each as `cancelled` at once.

The record is written by this command, not left to the job: a pending job never runs the batch
shell's SIGTERM trap. A running job's trap records the same cancel; both take the journal's
lock before they look, so whichever comes second sees the other's line (one cancel per life).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from hpctrain.run.events import CANCELLED_BY_COMMAND, Cancelled, Journal, last_checkpoint_step, read_events
from hpctrain.run.jsonlines import locked
from hpctrain.run.paths import RunDir
from hpctrain.slurm import client
from hpctrain.slurm.client import Kind, Purpose
from hpctrain.sweep.points import PointFacts

# `scancel -v` tells which jobs it could not end (exit status 0 all the same; without -v it
# says nothing): tests/fixtures/slurm/scancel_verbose_mixed.txt.
_KILL_ERROR = re.compile(r"Kill job error on job id (\S+): (.+)$")
# A trap's line written this long before our scancel returned is still ours (clocks of the
# batch node and this one may differ a little).
_CLOCK_SLACK_S = 2.0


class ScancelError(RuntimeError):
    """scancel is missing or failed as a whole; nothing was recorded."""


@dataclass(frozen=True)
class Outcome:
    cancelled: list[PointFacts]
    ended: dict[str, str]  # job id -> Slurm's words: it ended (or vanished) before the scancel


def scancel_command(job_ids: list[str], guardian_ids: list[str] | None = None) -> list[str]:
    """The one scancel `cancel` runs (hpctrain-cancel --dry-run prints it): verbose, so it says
    which jobs it could not end."""
    return client.cancel_command([*job_ids, *(guardian_ids or [])], verbose=True)


def guardians_of(points: list[PointFacts]) -> list[str]:
    """The guardian jobs of the points' runs (submission.json's guardian_job_id): a cancelled job
    satisfies its guardian's dependency, so the guardian goes in the same scancel. It would find
    the cancel and do nothing, but it would still start, and show in squeue until then."""
    found = []
    for point in points:
        guardian = RunDir(point.run).read_submission().get("guardian_job_id")
        if guardian:
            found.append(str(guardian))
    return found


def parse_scancel_errors(text: str) -> dict[str, str]:
    """`scancel -v` stderr -> {job id: Slurm's reason} for every job it could not end."""
    found = {}
    for line in text.splitlines():
        match = _KILL_ERROR.search(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def cancel(points: list[PointFacts]) -> Outcome:
    """One scancel for all `points` (each has a job id); raises ScancelError when it failed.
    Cancelling twice changes nothing, so a scancel without an answer is tried again (CANCEL)."""
    job_ids = [str(p.job_id) for p in points]
    began = time.time()
    done = client.cancel([*job_ids, *guardians_of(points)], Purpose.CANCEL, verbose=True)
    if done.kind is Kind.MISSING:
        raise ScancelError(f"{done.why()}; run this on a Slurm login node")
    if not done.answered:
        raise ScancelError(f"{done.why()}; the jobs may be cancelled or not (see squeue), nothing was recorded")
    if done.exit_code != 0:
        words = (done.stderr or done.stdout).strip().splitlines()
        raise ScancelError(
            f"scancel failed (exit {done.exit_code}): {words[-1] if words else 'no message'}; nothing was recorded"
        )
    # A guardian that already ended (its job completed, or it ran) is no news: only the points'.
    ended = {job: why for job, why in parse_scancel_errors(done.stderr).items() if job in job_ids}
    cancelled = [p for p in points if p.job_id not in ended]
    for point in cancelled:
        record(point, began - _CLOCK_SLACK_S)
    return Outcome(cancelled, ended)


def record(point: PointFacts, since: float) -> bool:
    """Write `cancelled` unless one was written since `since` (the job's trap was first).
    Any job's line counts: a run dir has one live job, and an array task's trap knows it by
    its own id (SLURM_JOB_ID), not by `36_7`."""
    run = RunDir(point.run)
    with locked(run.events):
        events = read_events(run.events)
        if any(isinstance(e, Cancelled) and e.time >= since for e in events):
            return False
        Journal(run.events).write_event(
            Cancelled(
                job_id=point.job_id,
                restart=point.restarts,
                step=last_checkpoint_step(events),
                by=CANCELLED_BY_COMMAND,
            )
        )
    return True
