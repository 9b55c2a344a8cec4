"""Slurm job ids, plain (`36`) and array tasks (`36_7`), as hpctrain records and asks about them.

Inside an array task SLURM_JOB_ID is the task's own number, and one task (the last one left in
the array's meta record) has the array's own id as its number: `scontrol requeue 36` there
requeues every task of array 36 (seen on Slurm 22.05). So a life names itself `<array>_<task>`
(hpctrain.run.life), which squeue, sacct, scontrol and scancel all take with `-j` and which
survives a requeue.
"""

from __future__ import annotations

import re

# `36` or `36_7`: what hpctrain records in submission.json and in events.
JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
# A pending array's meta record as squeue and sacct print it: `36_[3-999%4]`, `36_[1,4-6]`.
_META = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")
_TASK_RANGE = re.compile(r"^(\d+)(?:-(\d+))?(?::(\d+))?$")


def array_id(array_job_id: str, task: int) -> str:
    return f"{array_job_id}_{task}"


def split(job_id: str) -> tuple[str, int | None]:
    """`36_7` -> ("36", 7); `36` -> ("36", None)."""
    job, _, task = job_id.partition("_")
    return job, int(task) if task else None


def sort_key(job_id: str) -> tuple[int, int]:
    job, task = split(job_id)
    return int(job), -1 if task is None else task


def expand(printed: str) -> list[str]:
    """The job ids one squeue/sacct id field stands for: `36_[3-5%2]` -> 36_3, 36_4, 36_5;
    a plain or single-task id stands for itself."""
    meta = _META.match(printed)
    if meta is None:
        return [printed]
    array, ranges = meta.groups()
    ids: list[str] = []
    for part in ranges.split(","):
        found = _TASK_RANGE.match(part)
        if found is None:
            return [printed]
        first, last, stride = int(found.group(1)), int(found.group(2) or found.group(1)), int(found.group(3) or 1)
        ids += [array_id(array, task) for task in range(first, last + 1, stride)]
    return ids


def task_ranges(tasks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> `0-2,5,7-8`: the tasks as Slurm writes an array's (expand reads it)."""
    ranges: list[str] = []
    ordered = sorted(set(tasks))
    start = 0
    for index in range(1, len(ordered) + 1):
        if index == len(ordered) or ordered[index] != ordered[index - 1] + 1:
            first, last = ordered[start], ordered[index - 1]
            ranges.append(str(first) if first == last else f"{first}-{last}")
            start = index
    return ",".join(ranges)


def tasks_in(printed: str) -> int:
    """How many jobs one `squeue -r`-less id field counts for (Slurm counts every task)."""
    return len(expand(printed))
