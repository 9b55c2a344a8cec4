"""One row per run: everything the table, --json and the exit code need, gathered once."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from hpctrain.run.events import Start, read_events
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir
from hpctrain.status import drain_note, slurm_query, starved_note
from hpctrain.status.checkpoint_age import newest_checkpoint
from hpctrain.status.cost import Cost, read_plan, run_cost
from hpctrain.status.goodput import Goodput, goodput
from hpctrain.status.journal_summary import JournalSummary, summarize
from hpctrain.status.metrics_tail import read_tail
from hpctrain.status.run_state import decide


@dataclass(frozen=True)
class Row:
    run_dir: Path
    job_id: str | None  # None: trained on this machine with hpctrain-train
    state: str
    failed: bool
    source: str  # who said the state: squeue | sacct | scontrol | journal
    restarts: int
    step: int | None
    max_steps: int | None
    loss: float | None
    eval_accuracy: float | None
    eval_loss: float | None
    samples_per_s: float | None
    checkpoint_step: int | None
    checkpoint_age_s: float | None
    # hpctrain/status/goodput.py's figures (to_json of Goodput), up to the run's last record.
    goodput: dict[str, Any] | None = None
    # hpctrain/status/cost.py: node-hours and GPU-hours allocated and kept (a running life until now).
    cost: Cost | None = None

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["run_dir"] = str(self.run_dir.resolve())
        record["cost"] = self.cost.to_json() if self.cost is not None else None
        # JSON has no NaN: a diverged loss is null, as in metrics.jsonl.
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


@dataclass
class Status:
    rows: list[Row]
    notes: list[str]  # one line each: what could not be asked, and so where states come from

    @property
    def any_failed(self) -> bool:
        return any(row.failed for row in self.rows)


def collect(runs: list[Path], now: float | None = None, with_goodput: bool = False) -> Status:
    """Read every run's own files, then ask Slurm about all their jobs at once (sacct about every
    job of every run, for the cost). with_goodput: also each run's goodput figures in its row
    (--json shows them; the cost reads the whole metrics.jsonl either way)."""
    now = time.time() if now is None else now
    summaries: list[JournalSummary | str] = []
    for run in runs:
        try:
            summaries.append(summarize(RunDir(run)))
        except (OSError, ValueError) as error:  # unreadable files: say so on its row
            summaries.append(getattr(error, "strerror", None) or (str(error) or type(error).__name__).splitlines()[0])
    journals = [s for s in summaries if isinstance(s, JournalSummary)]
    answer = slurm_query.query(
        [s.job_id for s in journals if s.job_id], usage_of=[job for s in journals for job in s.jobs]
    )
    rows = [
        _row(run, summary, answer, now, with_goodput)
        if isinstance(summary, JournalSummary)
        else _unreadable(run, summary)
        for run, summary in zip(runs, summaries)
    ]
    waiting = [
        (s.job_id, RunDir(run).config)
        for run, s in zip(runs, summaries)
        if isinstance(s, JournalSummary)
        and s.job_id
        and (job := answer.jobs.get(s.job_id)) is not None
        and starved_note.waits_for_nodes(job.state, job.reason)
    ]
    running = [
        (s.job_id, _nodes_of_last_start(RunDir(run)))
        for run, s in zip(runs, summaries)
        if isinstance(s, JournalSummary)
        and s.job_id
        and (job := answer.jobs.get(s.job_id)) is not None
        and job.state == "RUNNING"
    ]
    return Status(rows, answer.notes + starved_note.notes(waiting) + drain_note.notes(running))


def _nodes_of_last_start(run: RunDir) -> list[str]:
    starts = [e for e in read_events(run.events) if isinstance(e, Start)]
    return list(starts[-1].nodes) if starts else []


def _row(run: Path, journal: JournalSummary, answer: slurm_query.SlurmAnswer, now: float, with_goodput: bool) -> Row:
    job = answer.jobs.get(journal.job_id) if journal.job_id else None
    state = decide(job, journal)
    metrics = read_tail(RunDir(run).metrics)
    checkpoint = newest_checkpoint(RunDir(run).checkpoints)
    steps = [s for s in (metrics.step, journal.last_step) if s is not None]
    events, records = read_events(RunDir(run).events), read_jsonl(RunDir(run).metrics)
    # A running life holds its allocation until now (its cost); the goodput figures shown stop at
    # its last record, and are worked out only when shown.
    figures: Goodput | None
    if state.label.startswith("RUNNING"):
        until_now = goodput(events, records, now)
        figures = goodput(events, records) if with_goodput else None
    else:
        figures = until_now = goodput(events, records)
    cost = run_cost(
        events,
        until_now,
        read_plan(RunDir(run).config),
        answer.usage,
        journal.jobs,
    )
    return Row(
        run_dir=run,
        job_id=journal.job_id,
        state=state.label,
        failed=state.failed,
        source=job.source if job else "journal",
        restarts=max(journal.restarts, job.restarts or 0) if job else journal.restarts,
        step=max(steps) if steps else None,
        max_steps=journal.total_steps or configured_max_steps(RunDir(run).config),
        loss=metrics.loss,
        eval_accuracy=metrics.eval_accuracy,
        eval_loss=metrics.eval_loss,
        samples_per_s=metrics.samples_per_s,
        checkpoint_step=checkpoint.step if checkpoint else None,
        checkpoint_age_s=max(0.0, now - checkpoint.written_at) if checkpoint else None,
        goodput=figures.to_json() if with_goodput and figures is not None else None,
        cost=cost,
    )


def _unreadable(run: Path, why: str) -> Row:
    return Row(run, None, f"UNREADABLE ({why})", False, "journal", 0, *([None] * 8))


def configured_max_steps(config: Path) -> int | None:
    """trainer.max_steps of the run's config.yaml, before the first start says total_steps
    (0 there means trainer.epochs decides, known only once the data is loaded)."""
    try:
        with open(config, encoding="utf-8") as file:
            loaded = yaml.load(file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    trainer = loaded.get("trainer") if isinstance(loaded, dict) else None
    steps = trainer.get("max_steps") if isinstance(trainer, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
