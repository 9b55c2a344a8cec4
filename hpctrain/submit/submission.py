"""Submit prepared run dirs: render job.sbatch, sbatch them, record and print what was queued.

A submission is all or nothing: when sbatch refuses any point of a sweep (or the command is
interrupted), the points already queued by this call are cancelled and every run dir it made is
removed, so a fixed command can simply be run again. A run dir that held a run before this
command is never removed.
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain.config import Config
from hpctrain.errors import UserError
from hpctrain.run import generations
from hpctrain.run.paths import RunDir, SweepArrays, array_guardian_script, remove_empty_parents
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.jobid import JOB_ID, array_id, split
from hpctrain.slurm.states import LIVE_STATES
from hpctrain.submit import forked, sbatch
from hpctrain.submit.arrays import free_number, header_of, plan_arrays, write_array
from hpctrain.submit.code_snapshot import CodeSnapshot, summary
from hpctrain.submit.guardian_job import submit_array_guardian, submit_guardian
from hpctrain.submit.limits import SlurmLimitsError, check, read_limits
from hpctrain.submit.render import render, render_guardian

log = logging.getLogger(__name__)

# What hpctrain-submit writes in a fresh run dir (besides Hydra's .hydra/): removable on failure.
_NAMES = RunDir(Path("."))
_OURS = {
    ".hydra",
    generations.FOLDER,  # this submission's own generation
    *(p.name for p in (_NAMES.config, _NAMES.job_script, _NAMES.guardian_script, _NAMES.submission, _NAMES.code)),
    _NAMES.lock.name,  # this command's own lock (hpctrain.run.lock)
}
# What Hydra writes in a fresh sweep dir besides the points' run dirs (and the shared code/),
# and its lock (hpctrain.run.lock.hold_sweep).
_SWEEP_FILES = {"multirun.yaml", _NAMES.code.name, _NAMES.lock.name}


@dataclass
class Point:
    """One run to submit: its checked config and its run dir (config.yaml already written)."""

    config: Config
    run: RunDir
    overrides: list[str]
    # The run dir held no run before this command: removing it on failure loses nothing.
    fresh: bool = True
    # The code the job imports first (slurm.code_snapshot), shared by a sweep's points.
    code: CodeSnapshot | None = None
    # Who submits (its run dir's generation says so: hpctrain.run.generations), and the
    # generation the submission is based on (a --retry: the ended job's); None: the newest,
    # refused while another actor's submission waits for its sbatch.
    by: str = "hpctrain-submit"
    after: int | None = None
    # job.sbatch's #SBATCH lines, as written (a sweep groups its points into arrays by them);
    # None: read from the script.
    header: tuple[str, ...] | None = None

    @property
    def script(self) -> Path:
        return self.run.job_script


def write_script(point: Point, submit_dir: Path) -> str:
    """job.sbatch, and guardian.sbatch unless slurm.guardian is false."""
    code = point.code.folder if point.code else None
    rendered = render(point.config, point.run.root, submit_dir, code)
    _write_executable(point.script, rendered.script)
    point.header = header_of(rendered.script)
    if point.config.slurm.guardian:
        _write_executable(point.run.guardian_script, render_guardian(point.config, point.run.root, submit_dir, code))
    return rendered.script


def _write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)


def live_job(run: RunDir) -> str | None:
    """`JOBID (STATE)` when the job last submitted from this run dir is still queued or
    running: a second job would train in the same run dir at the same time."""
    job_id = run.submitted_job_id()
    if job_id is None or not JOB_ID.match(job_id):
        return None
    state = client.job_state(job_id, Purpose.LOOK).value  # no answer: sbatch will say what is wrong
    return f"{job_id} ({state})" if state in LIVE_STATES else None


def submit_all(points: list[Point], parallelism: int, records: Callable[[list[str]], None] | None = None) -> list[str]:
    """sbatch every point; the first script alone (a wrong partition or account fails there,
    before any other job is queued), the rest `parallelism` at a time. A sweep (several points)
    is checked against the site's limits first and, with slurm.array, queued as job arrays
    (hpctrain.submit.arrays). Returns one job id per point, in order: `36`, or `36_7` for task 7
    of array 36."""
    if not points:
        return []
    batches: list[_Batch] = []
    job_ids: list[str | None] = []
    claims: dict[int, generations.Generation] = {}  # point index -> its generation, before its sbatch
    try:
        sbatch.require_sbatch()  # say "no sbatch" once, before anything else happens
        batches = _plan(points)
        job_ids = [None] * len(batches)
        job_ids[0] = _queue(batches[0], points, claims)
        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            futures = [pool.submit(_queue, b, points, claims) for b in batches[1:]]
            try:
                for index, future in enumerate(futures, start=1):
                    job_ids[index] = future.result()
            finally:
                _collect(futures, job_ids)  # every job queued before a failure, to cancel it
    except BaseException as error:  # a refusal, a timeout, Ctrl-C: undo what this call did
        unsure = error.script if isinstance(error, sbatch.SbatchError) and error.maybe_queued else None
        kept = [b for b in batches if b.script == unsure]
        kept_points = {i for b in kept for i in b.points}
        _undo([j for j in job_ids if j], [p for i, p in enumerate(points) if i not in kept_points])
        _remove_arrays([b for b in batches if b not in kept])
        for index, claim in claims.items():  # a run dir kept: its generation queued nothing
            if index not in kept_points and points[index].run.generations.is_dir():
                generations.withdraw(points[index].run.root, claim)
        raise
    ids = [""] * len(points)
    in_batch: list[tuple[_Batch, int]] = [(batches[0], 0)] * len(points)  # each point's batch, its task there
    for batch, job_id in zip(batches, job_ids):
        for task, index in enumerate(batch.points):
            ids[index] = str(job_id) if batch.links is None else array_id(str(job_id), task)
            in_batch[index] = (batch, task)
    # An array's guardian is queued before its points' records, so that each record is written
    # once, naming it: the guardian judges a task only once the submission named its job, the last
    # thing done here (hpctrain.recovery.guardian.wait_for_a_submission_under_way).
    array_guardian: dict[int, str] = {}  # a point of an array -> its guardian's job id
    for batch, job_id in zip(batches, job_ids):
        if batch.links is not None and array_guardian_script(batch.links).is_file():
            for guardian, tasks in submit_array_guardian(batch.links, str(job_id), list(range(len(batch.points)))):
                array_guardian.update({batch.points[task]: guardian for task in tasks if guardian is not None})
    alone = [index for batch in batches if batch.links is None for index in batch.points]
    # Named with their records where nothing comes between: the caller's own records come first.
    named_now = set() if records is not None else set(range(len(points))) - set(alone)

    def record(index: int) -> None:
        _record(points[index], ids[index], in_batch[index][0], array_guardian.get(index))
        if index in named_now and index in claims:
            generations.name_job(points[index].run.root, claims[index], ids[index])

    # A sweep's points' records are written by forked children where they are many
    # (hpctrain.submit.forked): thousands of small files, each a few system calls.
    forked.for_each(record, range(len(points)))
    # The guardian of each job of its own (hpctrain.recovery.guardian), once it is queued and
    # recorded. One that cannot be queued is said and its runs go on unguarded: their training
    # jobs are in the queue.
    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        list(pool.map(submit_guardian, [points[i].run for i in alone], [ids[i] for i in alone]))
    if records is not None:  # the caller's own records of the new jobs (a --retry's events)
        records(ids)
    # Last, each generation names its job: the job's first life begins only after that, so
    # nothing written here comes after it began.
    later = [index for index in claims if index not in named_now]
    forked.for_each(lambda index: generations.name_job(points[index].run.root, claims[index], ids[index]), later)
    return ids


def _queue(batch: _Batch, points: list[Point], claims: dict[int, generations.Generation]) -> str:
    """One sbatch call: each of its points' run dirs takes its generation first (raises UserError
    naming the run dir when another actor acted on it meanwhile), then sbatch with their token."""
    token = generations.new_token()
    for index in batch.points:
        point = points[index]
        try:
            if point.after is None:
                claim = generations.claim_submission(point.run.root, point.by, token)
            else:
                claim = generations.take(point.run.root, point.after, generations.submission(point.by, token))
        except generations.Superseded as lost:
            raise UserError(f"{point.run.root}: {lost}") from None
        claims[index] = claim
    return sbatch.submit(batch.script, env={**os.environ, generations.TOKEN_ENV: token})


@dataclass(frozen=True)
class _Batch:
    """One sbatch call: a point's own job.sbatch, or an array script for several points."""

    script: Path
    points: tuple[int, ...]
    links: Path | None = None  # an array's task -> run dir links


def _plan(points: list[Point]) -> list[_Batch]:
    """A sweep is checked against the site's limits (raising SbatchError with the numbers when
    it cannot fit), then grouped into arrays; a single point is its own job.sbatch."""
    if len(points) == 1:
        return [_Batch(points[0].script, (0,))]
    slurm = points[0].config.slurm
    as_arrays = all(p.config.slurm.array for p in points)
    try:
        limits = read_limits(slurm.account, slurm.qos)
    except SlurmLimitsError as error:
        raise sbatch.SbatchError(str(error)) from None
    guarded = [p.config.slurm.guardian for p in points]
    headers = [p.header if p.header is not None else header_of(p.script.read_text()) for p in points]
    plans = plan_arrays(headers, limits.max_array_size) if as_arrays else []
    # A guardian for each point of its own, one for each array (hpctrain.recovery.array_guardian).
    guardians = sum(any(guarded[i] for i in plan.points) for plan in plans) if as_arrays else sum(guarded)
    verdict = check(len(points), limits, slurm.array_parallelism if as_arrays else None, guardians)
    if verdict.refusal:
        raise sbatch.SbatchError(verdict.refusal)
    if verdict.note:
        log.info("%s", verdict.note)
    if not as_arrays:
        return [_Batch(p.script, (i,)) for i, p in enumerate(points)]
    sweep = SweepArrays(Path(os.path.commonpath([str(p.run.root.resolve().parent) for p in points])))
    batches: list[_Batch] = []
    try:
        for plan in plans:
            if plan.alone:
                batches.append(_Batch(points[plan.points[0]].script, plan.points))
                continue
            k = free_number(sweep)
            run_dirs = [p.run.root for p in points]
            parallel = points[plan.points[0]].config.slurm.array_parallelism
            script = write_array(sweep, k, plan, run_dirs, _NAMES.job_script.name, parallel)
            batches.append(_Batch(script, plan.points, sweep.links(k)))
            guarded_points = [points[i] for i in plan.points if guarded[i]]
            if guarded_points:
                _write_array_guardian(sweep.guardian_script(k), sweep.links(k), guarded_points[0])
    except OSError as error:  # a full disk, a read-only sweep folder
        _remove_arrays(batches)
        raise sbatch.SbatchError(f"could not write the sweep's array script in {sweep.folder}: {error}") from None
    log.info("%d points in %d job array(s), up to %d tasks each", len(points), len(batches), limits.max_array_size)
    return batches


def _write_array_guardian(path: Path, links: Path, point: Point) -> None:
    """The array's guardian.sbatch: a point's guardian rendered for the array's links folder (the
    guardian tells the two apart: hpctrain.recovery.guardian.main), its output in that folder."""
    code = point.code.folder if point.code else None
    _write_executable(path, render_guardian(point.config, links, Path(os.getcwd()), code))


def _remove_arrays(batches: list[_Batch]) -> None:
    """After a failed submission: the array scripts and links it wrote, then `.array/` if empty."""
    for batch in batches:
        if batch.links is not None:
            shutil.rmtree(batch.links, ignore_errors=True)
            batch.script.unlink(missing_ok=True)
            array_guardian_script(batch.links).unlink(missing_ok=True)
            try:
                batch.links.parent.rmdir()
            except OSError:  # another array of this sweep is still there
                pass


def _collect(futures: list[Future[str]], job_ids: list[str | None]) -> None:
    for future in futures:
        future.cancel()
    for index, future in enumerate(futures, start=1):
        if not future.cancelled() and job_ids[index] is None:
            try:
                job_ids[index] = future.result()
            except BaseException:  # its own failure is reported by the first one raised
                pass


def _record(point: Point, job_id: str, batch: _Batch, array_guardian: str | None = None) -> None:
    array_job, task = split(job_id)
    record = {
        "job_id": job_id,
        "submitted_at": round(time.time(), 3),
        "overrides": point.overrides,
        "script": str(point.script),
        "user": _user(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "python": point.config.slurm.python or sys.executable,
        "hpctrain_version": __version__,
        "code_snapshot": summary(point.code) if point.code else None,
    }
    if batch.links is not None:  # slurm.array: the array, this point's task, and its script
        record.update(array_job_id=array_job, array_task_id=task, array_script=str(batch.script))
    if array_guardian is not None:  # not `guardian_job_id`: hpctrain-cancel cancels that with the job
        record["array_guardian_job_id"] = array_guardian
    point.run.write_submission(record)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in a bare container
        return str(os.getuid())


def _undo(job_ids: list[str], points: list[Point]) -> None:
    if job_ids:
        # Cancelling twice changes nothing: CANCEL retries every kind of no answer.
        done = client.cancel(job_ids, Purpose.CANCEL)
        if not done.ok:
            log.error("scancel %s failed (%s): cancel them by hand", " ".join(job_ids), done.why())
        else:
            log.warning("cancelled the %d job(s) this submission had queued: %s", len(job_ids), " ".join(job_ids))
    discard_points(points)


def discard_points(points: list[Point]) -> None:
    for point in points:
        if point.fresh:
            discard_run_dir(point.run.root)


def discard_run_dir(root: Path) -> None:
    """Remove a run dir this submission made, only if it holds nothing but our own files."""
    if root.is_dir() and {p.name for p in root.iterdir()} <= _OURS:
        shutil.rmtree(root, ignore_errors=True)
        remove_empty_parents(root)


def discard_sweep_dir(root: Path) -> None:
    """After a failed sweep: remove its folder if nothing but Hydra's multirun.yaml is left."""
    if root.is_dir() and {p.name for p in root.iterdir()} <= _SWEEP_FILES:
        shutil.rmtree(root, ignore_errors=True)
        remove_empty_parents(root)
