"""Submit chosen points again, each into its own run dir with its own job.sbatch.

The job runs the run dir's config.yaml and code snapshot as first submitted, so it resumes from
its newest checkpoint exactly. Submission goes through submit_all, the one function that queues
points (all or nothing: if sbatch refuses one, the jobs queued here are cancelled and every
record is left as it was). Afterwards each point's submission.json names the new job (the
earlier ids under `resubmitted_from`) and its journal gets a `retry` event, which starts a new
restart budget window for the new job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config import load_run_config
from hpctrain.run import generations
from hpctrain.run.events import Journal, Retry
from hpctrain.run.paths import RunDir, checkpoints_in
from hpctrain.submit.code_snapshot import MANIFEST, CodeSnapshot
from hpctrain.submit.submission import Point, submit_all
from hpctrain.sweep.pick import Verdict
from hpctrain.sweep.points import PointError

# What a retry keeps from the first submission: what the run is. Everything else in the new
# record (submitted_at, user, host, array fields, ...) describes the new submission.
_KEPT = ("overrides", "script", "code_snapshot")


@dataclass(frozen=True)
class Retried:
    verdict: Verdict
    job_id: str


def resume_step(run: Path) -> int | None:
    """The step the new job resumes from (its newest checkpoint), or None: from the start."""
    found = checkpoints_in(RunDir(run).checkpoints)
    return found[0].step if found else None


def prepare(verdicts: list[Verdict]) -> list[Point]:
    """A Point per chosen run dir, from its own files; raises PointError naming what is missing."""
    points = []
    for verdict in verdicts:
        run = RunDir(verdict.point.run)
        if not run.job_script.is_file():
            raise PointError(f"{run.root}: no {run.job_script.name} to submit again; submit this point anew")
        record = run.read_submission()
        try:  # this retry acts on the ended job's generation: a newer act (the guardian's) wins
            based_on = generations.basis(run.root, _job_names(verdict.point.job_id, record))
        except generations.Superseded as lost:
            raise PointError(f"{run.root}: {lost}; see hpctrain-status") from None
        points.append(
            Point(
                config=load_run_config(run.root),
                run=run,
                overrides=list(record.get("overrides") or []),
                fresh=False,  # a failed submission must never remove what the run holds
                code=_snapshot(record),
                by="retry",
                after=based_on.number if based_on else None,
            )
        )
    return points


def _job_names(job_id: str | None, record: dict[str, Any]) -> tuple[str, ...]:
    """The ended job's names: the one the verdict is about, and submission.json's."""
    return tuple(str(j) for j in (job_id, record.get("job_id")) if j)


def resubmit(verdicts: list[Verdict], parallelism: int | None = None) -> list[Retried]:
    """Queue every chosen point (raises sbatch.SbatchError: nothing then stays queued)."""
    points = prepare(verdicts)
    before = [point.run.read_submission() for point in points]

    def records(job_ids: list[str]) -> None:  # before the new jobs' generations name them
        for verdict, point, earlier, job_id in zip(verdicts, points, before, job_ids):
            _note(point.run, earlier, job_id)
            Journal(point.run.events).write_event(
                Retry(
                    job_id=job_id,
                    previous_job_id=verdict.point.job_id,
                    previous_state=verdict.point.state or verdict.point.ending,
                    reason=verdict.why,
                )
            )

    job_ids = submit_all(points, parallelism or points[0].config.slurm.submit_parallelism, records)
    return [Retried(v, j) for v, j in zip(verdicts, job_ids)]


def _note(run: RunDir, earlier: dict[str, Any], job_id: str) -> None:
    """submission.json: the new submission's record, with what the run is kept from the
    first one, and the earlier job ids under `resubmitted_from` (RunDir.record_resubmission)."""
    fresh = run.read_submission()
    merged = {**fresh, **{k: earlier[k] for k in _KEPT if k in earlier}}
    merged["job_id"] = earlier.get("job_id")
    merged["resubmitted_from"] = earlier.get("resubmitted_from", [])
    run.write_submission(merged)
    run.record_resubmission(job_id)


def _snapshot(record: dict[str, Any]) -> CodeSnapshot | None:
    """The code snapshot job.sbatch already names (submission.json's code_snapshot), as is."""
    folder = (record.get("code_snapshot") or {}).get("dir")
    if not folder or not Path(folder).is_dir():
        return None
    snapshot = CodeSnapshot(Path(folder))
    try:
        snapshot.manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        snapshot.manifest = None
    return snapshot
