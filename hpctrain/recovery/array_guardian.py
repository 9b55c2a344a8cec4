"""One guardian for a whole job array: a sweep of 1,000 points queues one array and one guardian,
not 1,000 guardians (sites cap the jobs a user may queue, and every sbatch costs the submitter).

A point's own guardian waits on `afternotok:JOB`. An array's waits on any of its tasks:

    sbatch --dependency=afternotok:A_0?afternotok:A_1?...?afternotok:A_999 array-K.guardian.sbatch A_[0-999]

(`?`: any one satisfied; seen on Slurm 22.05: it starts within a scheduling pass of the first task
that ends without completing, and Slurm cancels it, DependencyNeverSatisfied, once every task
completed.) When it starts it looks at the whole array once (`scontrol show job A`: every task's
record, the pending ones in one meta record), and for every watched task that is no longer
queued or running and did not complete, does what a point's own guardian does for its job
(hpctrain.recovery.guardian.Guardian.judge, on that task's run dir): the point is submitted again
as a job of its own, with a guardian of its own. Then it queues its successor, watching the tasks
still queued or running. A task judged twice is harmless: its run dir's generation has moved on
to the resubmission, and the second judge finds it taken over.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from hpctrain.recovery.guardian import Guardian
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.jobid import expand, split
from hpctrain.slurm.records import JobRecord
from hpctrain.slurm.states import LIVE_STATES
from hpctrain.submit.guardian_job import guard_array_tasks

# Slurm not answering the one look: asked again with these pauses, for at most LOOK_FOR_S of the
# guardian's 15 minutes; without an answer it cannot tell a task that ended from one still running.
LOOK_PAUSES_S = (10, 20, 30, 60, 120, 240)
LOOK_FOR_S = 420.0
# The tasks it judges, one after another, within JUDGE_FOR_S of its start; those left are handed to
# a guardian of their own (their dependency already satisfied, it starts at once).
JUDGE_FOR_S = 600.0
# Tasks whose `afternotok` may have fired already while Slurm still shows them so (ending,
# COMPLETING; a failed job held by its exit code, SPECIAL_EXIT): watched again, but the successor
# waits a minute before it may start, so it does not start over and over while they settle.
SETTLING_STATES = frozenset({"COMPLETING", "SPECIAL_EXIT"})
SETTLE_S = 60
_WATCHED = re.compile(r"^\d+_\[\d+(-\d+)?(,\d+(-\d+)?)*\]$")


def watched(tasks_arg: str) -> tuple[str, list[int]]:
    """`36_[0-3,7]` -> ("36", [0, 1, 2, 3, 7]); ValueError on anything else."""
    if _WATCHED.match(tasks_arg) is None:
        raise ValueError(f"not an array's tasks: {tasks_arg!r} (expected ARRAY_[TASKS], e.g. 36_[0-9])")
    parsed = [split(job_id) for job_id in expand(tasks_arg)]
    return parsed[0][0], sorted({task for _, task in parsed if task is not None})


def by_task(array_job: str, records: list[JobRecord]) -> dict[int, JobRecord]:
    """Each task's record, from one look at the array (a pending meta record stands for all its tasks)."""
    found: dict[int, JobRecord] = {}
    for record in records:
        for name in record.names:
            array, task = split(name)
            if array == array_job and task is not None:
                found[task] = record
    return found


def ended_tasks(tasks: list[int], records: dict[int, JobRecord]) -> tuple[list[int], list[int]]:
    """(the tasks to judge, the tasks still queued or running). A task Slurm no longer shows ended
    more than MinJobAge ago: judged on its run dir's journal alone, as a point's guardian does.
    A completed task asks for nothing."""
    to_judge, live = [], []
    for task in tasks:
        record = records.get(task)
        if record is not None and record.state in LIVE_STATES:
            live.append(task)
        elif record is None or record.state != "COMPLETED":
            to_judge.append(task)
    return to_judge, live


class ArrayGuardian:
    def __init__(self, links: Path, tasks_arg: str) -> None:
        self.links = links
        self.array_job, self.tasks = watched(tasks_arg)
        self.started = time.monotonic()

    def run_dir(self, task: int) -> Path:
        return (self.links / str(task)).resolve()

    def look(self) -> dict[int, JobRecord] | None:
        for pause in (*LOOK_PAUSES_S, None):
            done = client.show_jobs([self.array_job], Purpose.GUARDIAN_LOOK)
            if done.answered and done.value:
                return by_task(self.array_job, done.value)
            said = done.reply.stdout + done.reply.stderr
            if done.answered and "Invalid job id" in said:
                return {}  # Slurm has no record of the array at all: every task ended long ago
            # No answer, or an answer with no record it could read: never taken for "all ended".
            if pause is None or time.monotonic() + pause > self.started + LOOK_FOR_S:
                return None
            print(f"hpctrain guardian: no usable answer about array {self.array_job} ({done.why()})", file=sys.stderr)
            time.sleep(pause)
        return None

    def watch(self) -> int:
        records = self.look()
        if records is None:
            print(
                f"hpctrain guardian: Slurm did not answer about array {self.array_job}: its tasks are "
                "unguarded from now on (hpctrain-submit --retry SWEEP_DIR submits the unfinished points again)",
                file=sys.stderr,
            )
            return 1
        to_judge, live = ended_tasks(self.tasks, records)
        # The successor first: judging may take long, and a guardian killed at its time limit must
        # not leave the tasks still to end unguarded.
        if live:
            settling = any(records[task].state in SETTLING_STATES for task in live)
            self.guard(live, begin_in_s=SETTLE_S if settling else None)
        failed = 0
        for index, task in enumerate(to_judge):
            if time.monotonic() > self.started + JUDGE_FOR_S:
                left = to_judge[index:]
                print(f"hpctrain guardian: {len(left)} ended task(s) left to a guardian of their own", file=sys.stderr)
                self.guard(left)
                break
            failed |= self.judge(task, records.get(task))
        return failed

    def guard(self, tasks: list[int], begin_in_s: int | None = None) -> None:
        guard_array_tasks(self.links, self.array_job, tasks, env=os.environ.copy(), begin_in_s=begin_in_s)

    def judge(self, task: int, record: JobRecord | None) -> int:
        """A point guardian's judgement of one ended task; whatever goes wrong with one task (its
        run dir gone, a full disk) is said and the others are judged all the same."""
        run_dir = self.run_dir(task)
        if not (run_dir / "guardian.sbatch").is_file():  # this point has slurm.guardian=false
            return 0
        try:
            guardian = Guardian(run_dir, f"{self.array_job}_{task}")
            guardian.wait_for_a_submission_under_way()
            # A replacement that waits is not watched here: that would hold the others' judgement.
            return guardian.judge(record, watch_moved_on=False)
        except Exception as error:  # noqa: BLE001 - one task's trouble must not end the array's guardian
            print(f"hpctrain guardian: task {task} ({run_dir}): {type(error).__name__}: {error}", file=sys.stderr)
            return 1
