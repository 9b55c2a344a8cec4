"""Which points a cancel or a retry takes, and why: pure functions of what status knows.

tests/test_sweep_pick.py is their table. The rules a user reads in docs/sweeps.md:
  - a retry never takes a point whose job is still queued or running (two jobs would train in
    one run dir), whether named or not, nor any point when squeue could not be asked;
  - a retry takes a point whose job ended without finishing: Slurm says FAILED, CANCELLED,
    TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE or PREEMPTED, or COMPLETED without a
    `finish`, or Slurm no longer knows the job and its journal has no `finish`;
  - a finished point (a `finish` in its journal) is never retried, even when named: it would
    resume at its last step and stop at once. To train it again, submit it anew;
  - a cancel takes every point whose job is queued or running; one that has ended is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.slurm.states import LIVE_STATES, UNFINISHED_STATES
from hpctrain.sweep.points import PointFacts


@dataclass(frozen=True)
class Verdict:
    point: PointFacts
    chosen: bool
    why: str  # one line for the user: how the job stands, and what to do if it is left out


def retry_verdict(point: PointFacts, squeue_answered: bool) -> Verdict:
    job = f"job {point.job_id}"
    if point.job_id is None:
        return Verdict(point, False, "never submitted (no job id in submission.json): submit it with hpctrain-submit")
    if point.state in LIVE_STATES:
        return Verdict(
            point, False, f"{job} is {point.state}: still queued or running; cancel it first (hpctrain-cancel)"
        )
    if not squeue_answered:
        return Verdict(point, False, f"{job}: squeue did not answer, so it may still be queued or running; try again")
    if point.ending == "finish":
        return Verdict(point, False, f"{job} finished (step {point.last_step}): nothing to retry")
    if point.state in UNFINISHED_STATES:
        return Verdict(point, True, f"{job} ended {point.state}{_cause(point)}")
    if point.state == "COMPLETED":
        return Verdict(point, True, f"{job} ended COMPLETED without a finish in its journal{_cause(point)}")
    if point.state is None:
        said = f" (its journal's last word: {point.ending}{_cause(point)})" if point.ending else ""
        return Verdict(point, True, f"{job} is gone from Slurm without a finish{said}")
    return Verdict(point, False, f"{job} is {point.state}: not a state a retry takes; see scontrol show job")


def cancel_verdict(point: PointFacts, squeue_answered: bool) -> Verdict:
    job = f"job {point.job_id}"
    if point.job_id is None:
        return Verdict(point, False, "never submitted (no job id in submission.json)")
    if point.state in LIVE_STATES:
        return Verdict(point, True, f"{job} ({point.state})")
    if not squeue_answered:
        return Verdict(point, True, f"{job} (state unknown: squeue did not answer; scancel will tell)")
    ended = point.state or (f"journal: {point.ending}" if point.ending else "gone from Slurm")
    return Verdict(point, False, f"{job} already ended ({ended})")


def pick(points: list[PointFacts], squeue_answered: bool, retry: bool) -> list[Verdict]:
    judge = retry_verdict if retry else cancel_verdict
    return [judge(point, squeue_answered) for point in points]


def _cause(point: PointFacts) -> str:
    return f" ({point.cause})" if point.ending == "failure" and point.cause else ""
