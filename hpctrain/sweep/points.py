"""The points a sweep command works on, and what hpctrain-status knows of each.

The facts come from status's own readers (the journal summary and one round of Slurm queries
for every job at once), so a cancel or a retry sees a point exactly as hpctrain-status shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.paths import RunDir
from hpctrain.status import discover, slurm_query
from hpctrain.status.journal_summary import summarize


class PointError(ValueError):
    """The command named no sweep, run dir or point that exists; the message says what to change."""


@dataclass(frozen=True)
class PointFacts:
    name: str  # the run dir's name in its sweep (`3`), or its path for a lone run dir
    run: Path
    job_id: str | None  # the job last submitted from the run dir (`36` or an array task `36_7`)
    state: str | None  # Slurm's word for that job now; None when Slurm does not know it
    restarts: int | None  # Slurm's count of the job's restarts, when Slurm said
    ending: str | None  # how the journal says the job's attempt ended (finish, failure, ...)
    cause: str | None  # that ending's cause (a failure's, a requeue's)
    last_step: int | None  # the newest step the journal records


@dataclass(frozen=True)
class Survey:
    points: list[PointFacts]
    # squeue answered: a job absent from its answer is neither queued nor running.
    squeue_answered: bool
    notes: list[str]  # what could not be asked, one line each


def choose(target: Path, names: list[str]) -> list[Path]:
    """The run dirs named: every point of the sweep dir `target`, or the points `names` (a run
    dir's name in the sweep, e.g. `3`, or its path); `target` may be one run dir (no names then)."""
    if not target.is_dir():
        raise PointError(f"{target}: no such directory; name a sweep dir (hpctrain-submit -m) or a run dir")
    if discover.is_run_dir(target):
        if names:
            raise PointError(f"{target} is a run dir, not a sweep dir: name no points after it, or name its sweep dir")
        return [target]
    points = discover.sweep_points(target)
    if not points:
        raise PointError(f"{target} is neither a sweep dir (multirun.yaml beside its points' run dirs) nor a run dir")
    by_name = {p.name: p for p in points}
    by_path = {p.resolve(): p for p in points}
    chosen: list[Path] = []
    unknown: list[str] = []
    for name in names:
        point = by_name.get(name) or by_path.get(Path(name).resolve())
        if point is None:
            unknown.append(name)
        elif point not in chosen:
            chosen.append(point)
    if unknown:
        raise PointError(
            f"no point {', '.join(unknown)} in {target}; its points are {', '.join(p.name for p in points)}"
        )
    return chosen or points


def survey(runs: list[Path], lone: bool = False) -> Survey:
    """What each run's journal and Slurm say, Slurm asked once for all the jobs."""
    summaries = []
    for run in runs:
        try:
            summaries.append(summarize(RunDir(run)))
        except (OSError, ValueError) as error:
            raise PointError(f"{run}: cannot read its records: {error}") from None
    answer = slurm_query.query([s.job_id for s in summaries if s.job_id])
    facts = []
    for run, summary in zip(runs, summaries):
        job = answer.jobs.get(summary.job_id) if summary.job_id else None
        facts.append(
            PointFacts(
                name=str(run) if lone else run.name,
                run=run,
                job_id=summary.job_id,
                state=job.state if job else None,
                restarts=job.restarts if job else None,
                ending=summary.ending,
                cause=summary.cause,
                last_step=summary.last_step,
            )
        )
    return Survey(facts, answer.squeue_answered, answer.notes)


def gather(target: Path, names: list[str]) -> Survey:
    runs = choose(target, names)
    return survey(runs, lone=discover.is_run_dir(target))
