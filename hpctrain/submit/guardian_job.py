"""Queue a run's guardian beside its training job (hpctrain.recovery.guardian says what the
guardian does once it starts): at submission, and again for every job the run goes on in. A sweep
queued as job arrays gets one guardian per array instead (hpctrain.recovery.array_guardian)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpctrain.faults import ENV as FAULTS_ENV
from hpctrain.run.paths import RunDir, array_guardian_script
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.jobid import task_ranges
from hpctrain.submit.outside_job import outside_job_env


def submit_guardian(run: RunDir, job_id: str, env: dict[str, str] | None = None) -> str | None:
    """Queue the guardian of `job_id` and record its id in submission.json (`guardian_job_id`).
    None when the run has no guardian.sbatch (slurm.guardian=false) or sbatch failed: said on
    stderr, and the run trains on, unguarded, as before guardians existed."""
    if not run.guardian_script.is_file():
        return None
    done = client.submit(
        run.guardian_script,
        job_id,
        purpose=Purpose.GUARDIAN_SUBMIT,
        dependency=f"afternotok:{job_id}",
        env=_guardian_env(env),
    )
    guardian = done.value
    if guardian is None:
        print(
            f"hpctrain: no guardian for job {job_id} ({done.why()}): if its batch node is lost, "
            f"submit {run.root} again with hpctrain-submit --retry",
            file=sys.stderr,
        )
        return None
    # The new job's own guardian, written for it (it may have begun meanwhile: not fenced).
    run.update_submission(fenced=False, guardian_job_id=guardian)
    return guardian


def submit_array_guardian(
    links: Path, array_job: str, tasks: list[int], env: dict[str, str] | None = None, begin_in_s: int | None = None
) -> list[tuple[str | None, list[int]]]:
    """Queue the guardians of `tasks` of array `array_job` (their run dirs: `links`/TASK), one for
    every ARRAY_GUARDIAN_TASKS of them (the dependency names each task, and one argument may not
    exceed 128 KiB); each with the tasks it watches, its id None when sbatch failed (said on
    stderr). `env`: as for submit_guardian; `begin_in_s`: not before that many seconds."""
    ordered = sorted(tasks)
    chunks = [ordered[i : i + ARRAY_GUARDIAN_TASKS] for i in range(0, len(ordered), ARRAY_GUARDIAN_TASKS)]
    queued: list[tuple[str | None, list[int]]] = []
    for chunk in chunks:
        done = client.submit(
            array_guardian_script(links),
            array_watch_argument(array_job, chunk),
            purpose=Purpose.GUARDIAN_SUBMIT,
            dependency=array_dependency(array_job, chunk),
            begin=f"now+{begin_in_s}" if begin_in_s else None,
            env=_guardian_env(env),
        )
        if done.value is None:
            print(
                f"hpctrain: no guardian for tasks {task_ranges(chunk)} of array {array_job} ({done.why()}): if a "
                "task's batch node is lost, submit its run dir again with hpctrain-submit --retry",
                file=sys.stderr,
            )
        queued.append((done.value, chunk))
    return queued


def guard_array_tasks(
    links: Path, array_job: str, tasks: list[int], env: dict[str, str] | None = None, begin_in_s: int | None = None
) -> None:
    """Queue the guardians of `tasks` (submit_array_guardian) and name each in its point's
    submission.json as `array_guardian_job_id` (not `guardian_job_id`, which hpctrain-cancel cancels
    with a point's job), where that still names the task: a run that went on in a job of its own
    keeps its own guardian. By an array's guardian for its successor; a sweep's submission names
    them with the rest of its points' records (hpctrain.submit.submission)."""
    for guardian, chunk in submit_array_guardian(links, array_job, tasks, env=env, begin_in_s=begin_in_s):
        if guardian is None:
            continue
        for task in chunk:
            name_array_guardian(links, array_job, task, guardian)


def name_array_guardian(links: Path, array_job: str, task: int, guardian: str) -> None:
    """Task `task`'s submission.json names its array's guardian, if it still names the task."""
    run = RunDir((links / str(task)).resolve())
    try:
        if run.read_submission().get("job_id") == f"{array_job}_{task}":
            run.update_submission(fenced=False, array_guardian_job_id=guardian)
    except (OSError, ValueError) as error:
        print(f"hpctrain: task {task} of array {array_job}: submission.json: {error}", file=sys.stderr)


def array_watch_argument(array_job: str, tasks: list[int]) -> str:
    """The guardian's argument: `36_[0-3,7]` (hpctrain.recovery.array_guardian.watched reads it)."""
    return f"{array_job}_[{task_ranges(tasks)}]"


# Tasks one array guardian watches: `afternotok:36000_4999?` is about 25 bytes a task.
ARRAY_GUARDIAN_TASKS = 4000


def array_dependency(array_job: str, tasks: list[int]) -> str:
    """Satisfied as soon as any one of the tasks ends without completing (`?`: any of them)."""
    return "?".join(f"afternotok:{array_job}_{task}" for task in sorted(tasks))


def _guardian_env(env: dict[str, str] | None) -> dict[str, str]:
    """Inside a job (`env` given): the job's own settings left out. At submission (hpctrain-submit,
    `env` None): the submitter's environment, armed fault points included, so a test can hold
    the guardian at its own points (guardian.*); the jobs it submits get none."""
    if env is not None:
        return outside_job_env(env)
    armed = {FAULTS_ENV: os.environ[FAULTS_ENV]} if FAULTS_ENV in os.environ else {}
    return {**outside_job_env(os.environ), **armed}
