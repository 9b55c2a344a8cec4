"""A job's lives and the run dir's generations: whether a life may begin (`may_begin`, a table in
tests/test_generations.py), its generation taken at `control begin` (`begin_life`), and the
generation a life took, found again by its processes (`life_of`). The generations themselves,
their files and the compare-and-swap are hpctrain.run.generations's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.generations import (
    LIFE,
    PENDING_SUBMIT_S,
    RELAUNCH,
    SUBMIT,
    Generation,
    Superseded,
    newest,
    numbers,
    pending,
    read,
    standing,
    take,
)


@dataclass(frozen=True)
class LifeClaim:
    """What a life knows of itself when it begins (from hpctrain.run.life.LifeStamp and its token)."""

    job_id: str
    restart: int
    names: tuple[str, ...] = ()  # its other names (an array task's own number)
    token: str | None = None  # TOKEN_ENV: the submission that queued its job (None: sbatch by hand)

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.job_id, *self.names)


def may_begin(current: Generation | None, life: LifeClaim, began_before: bool = False) -> tuple[bool, str]:
    """Whether `life` may take the generation after `current`, and why (a pure rule, the table of
    tests/test_generations.py). It may after: nothing (a run dir's first act, or one from before
    generations); the submission that queued its job (its token, or its job named); its own job's
    requeue; its own job's earlier life (or a relaunch in it). Not after: its own job's same or
    later life or a relaunch in it (a stale shell's second start); any act for another job,
    unless it is the first life to begin of a job that carries no token (submitted by hand: the
    user's word takes the run over; requeued before it began, its restart may be past 0). A
    later life of it (`began_before`: a life of its job took a generation already), requeued
    after the run went on elsewhere, does not."""
    if current is None:
        return True, "the run's first generation"
    if current.kind == SUBMIT and life.token is not None and current.token == life.token:
        return True, f"after the submission that queued job {life.job_id}"
    if current.names_job(life.ids):
        # A relaunch is a step of a life that began: as much its life's as the life's own generation.
        if current.kind in (LIFE, RELAUNCH) and current.restart is not None and current.restart >= life.restart:
            return False, f"job {life.job_id} restart {current.restart} began already"
        return True, f"after job {life.job_id}'s own {current.kind}"
    if life.token is None and not began_before:
        return True, "a job submitted by hand (no token): its first life to begin takes the run over"
    return False, "a newer act than this job's"


# How long a life waits for the submission that queued it to finish its records (its journal
# lines, submission.json, its guardian) before it takes its own generation; a submitter that
# died after sbatch answered is waited for this long, then the token alone counts.
SUBMITTER_WAIT_S = PENDING_SUBMIT_S
_POLL_S = 0.1


def begin_life(run_root: Path, life: LifeClaim, by: str = "slurm", wait_s: float = SUBMITTER_WAIT_S) -> Generation:
    """This life's generation: taken after the newest when `may_begin` allows it, else raises
    Superseded. sbatch answers once Slurm queued the job, so a job can start before its
    submitter wrote what it decided: while the submission that queued this job (its token)
    names no job yet, the life waits (up to `wait_s`), so that nothing its submitter writes
    comes after this life began (the submitter's own writes are fenced by this generation)."""
    deadline = time.monotonic() + wait_s
    while True:
        # Any submission not answered yet is waited for: ours names this job soon; another
        # actor's queues its job (then this life is the stale one) or nothing (then it is not).
        current = newest(run_root)
        if current is None or not pending(current) or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    ours = current is not None and current.kind == SUBMIT and life.token is not None and current.token == life.token
    after = current.number if current else 0
    if ours and current is not None and current.abandoned:
        raise Superseded(after - 1, current)
    began_before = any_life_of(run_root, life.ids)
    allowed, _why = may_begin(current if ours else standing(run_root), life, began_before)
    if not allowed:
        raise Superseded(after - 1 if current else 0, current)
    return take(run_root, after, Generation(0, LIFE, by, job_id=life.job_id, restart=life.restart, names=life.names))


def any_life_of(run_root: Path, job_ids: Iterable[str]) -> bool:
    """A life of the job (any of `job_ids`, any restart) took a generation already."""
    ids = tuple(job_ids)
    for number in reversed(numbers(run_root)):
        found = read(run_root, number)
        if found is not None and found.kind == LIFE and found.names_job(ids):
            return True
    return False


def life_of(run_root: Path, job_ids: Iterable[str], restart: int) -> Generation | None:
    """The generation life `restart` of the job (any of `job_ids`) took at its begin, newest
    first; None when it took none (a job without hpctrain's batch script, a run dir from before)."""
    ids = tuple(job_ids)
    for number in reversed(numbers(run_root)):
        found = read(run_root, number)
        if found is not None and found.kind == LIFE and found.restart == restart and found.names_job(ids):
            return found
    return None
