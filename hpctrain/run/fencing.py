"""A process's own generation of a run dir, and the check before each of its writes.

Every process of a life (the control step, the watcher, the keeper, each rank) knows its life
from Slurm's environment; the generation that life took at its `control begin` is found once in
the run dir (hpctrain.run.lives.life_of) and kept. An act that takes a generation of its
own (a submission, a requeue) adopts it: from then on the process writes under that one. Before
each write (a journal line, metrics, a checkpoint's publication, a prune, model.pt,
submission.json) `check` stats the next generation's name; when it exists, this process is
fenced: `Fenced` is raised, and the process leaves without writing anything
(hpctrain.process.life exits WORKER_FENCED, the control step CONTROL_FENCED).

Within a life, the control step's relaunch of a failed step takes a `relaunch` generation before
the new step launches. The ranks of a step say which launch they belong to (`join_step`, the
moment the batch shell launched them): a rank of the old step, on a node that froze and thaws
after the relaunch, is fenced by it (it writes no `hang` of its own into the new step's journal,
no shard over the new step's); the new step's ranks, launched after it, write under it. The
life's processes that outlive its steps (the control step, the watcher, the keeper, the warm
standby) belong to no step and walk past its relaunches, as past its own requeue.

A process outside Slurm (hpctrain-train on a workstation, hpctrain-status, hpctrain-cancel on a
login node) and a life that took no generation (a user's own batch script, a run dir from
before generations) are not fenced: the run dir's lock (hpctrain.run.lock) and Slurm's record
keep those apart, as before.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctrain.run import generations, lives
from hpctrain.run.generations import Generation
from hpctrain.run.launch_marks import LAUNCHED_AT_ENV
from hpctrain.run.life import LifeStamp

# run dir (resolved) -> the generation this process writes under
_own: dict[str, int] = {}
# The launch moment of the step this process is a rank of (join_step); None: of no step.
_step_launched_at: float | None = None


class Fenced(Exception):
    """A newer generation than this process's exists: it must write nothing more."""

    def __init__(self, run_root: Path, own: int) -> None:
        self.run_root = run_root
        self.own = own
        newer = generations.read(run_root, own + 1)
        who = newer.describe() if newer else f"generation {own + 1}"
        super().__init__(
            f"this life (generation {own}) was replaced ({who}): it stops here and writes nothing more in {run_root}"
        )


def _key(run_root: Path) -> str:
    return os.path.abspath(run_root)


def adopt(run_root: Path, generation: Generation) -> None:
    """From now on this process writes in `run_root` under `generation` (one it took)."""
    _own[_key(run_root)] = generation.number


def withdraw(run_root: Path, generation: Generation) -> None:
    """This process's submission queued nothing (sbatch refused): withdrawn
    (hpctrain.run.generations.withdraw), and the process writes under the generation before it
    again when its file was removed (so that numbers never leave a gap)."""
    if generations.withdraw(run_root, generation):
        _own[_key(run_root)] = generation.number - 1


def join_step(env: Mapping[str, str]) -> None:
    """This process is a rank of the step the batch shell launched at LAUNCHED_AT_ENV (a task of
    srun, or a warm standby's fork taking one on): a relaunch decided after that moment fences
    it. Forgets what a forking parent had found (a standby belongs to no step)."""
    global _step_launched_at
    try:
        _step_launched_at = float(env.get(LAUNCHED_AT_ENV, ""))
    except ValueError:  # a local run, a user's own srun: no launch moment, fenced by lives alone
        _step_launched_at = None
    _own.clear()


def forget(run_root: Path) -> None:
    """For tests: this process knows no generation of `run_root` again."""
    _own.pop(_key(run_root), None)


def own(run_root: Path, env: Mapping[str, str] | None = None) -> int | None:
    """The generation this process writes `run_root` under: adopted, or its life's (looked up
    once found); None when it has none (not fenced)."""
    key = _key(run_root)
    if key in _own:
        return _own[key]
    life = LifeStamp.from_env(os.environ if env is None else env)
    if life.job_id is None or not os.path.isdir(generations.folder(run_root)):
        return None
    found = lives.life_of(run_root, (life.job_id, *life.aliases), life.restart)
    if found is None:
        return None
    _own[key] = _past_own_acts(run_root, found.number, life)
    return _own[key]


def _past_own_acts(run_root: Path, number: int, life: LifeStamp) -> int:
    """`number`, or the newest generation after it that is this life's own act for this process:
    its requeue (taken by an earlier control step of it, `control requeue`, before
    `requeue-refused` runs in a process of its own), and its relaunches, except for a rank of a
    step launched before the relaunch (the step it replaced)."""
    ids = (life.job_id or "", *life.aliases)
    while (after := generations.read(run_root, number + 1)) is not None:
        ours = after.restart == life.restart and after.names_job(ids)
        if not ours or after.kind not in (generations.REQUEUE, generations.RELAUNCH):
            break
        if after.kind == generations.RELAUNCH and _step_launched_at is not None and after.time > _step_launched_at:
            break  # this process is a rank of a step the relaunch replaced
        number = after.number
    return number


def check(run_root: Path) -> None:
    """Raise Fenced when a newer generation than this process's exists in `run_root` (and is not
    its own life's requeue or relaunch, taken since it looked: one stat() on the way there)."""
    number = own(run_root)
    if number is None or not generations.superseded(run_root, number):
        return
    life = LifeStamp.from_env(os.environ)
    if life.job_id is not None:
        number = _own[_key(run_root)] = _past_own_acts(run_root, number, life)
    if generations.superseded(run_root, number):
        raise Fenced(run_root, number)


def say(fenced: Fenced, speaker: str = "hpctrain") -> None:
    """One line on stderr (the job's output, not the run dir's journal): why this process stops."""
    print(f"{speaker}: {fenced}", file=sys.stderr, flush=True)
