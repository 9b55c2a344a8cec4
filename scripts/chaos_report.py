"""The chaos soak's end (scripts/chaos.py): the checks, the fault table and the goodput.

Read from the run dir the job wrote (events.jsonl, metrics.jsonl, model.pt) and the reference's
model.pt; nothing here touches the cluster.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from job_processes import is_task, processes

from hpctrain.run.causes import CheckpointReason
from hpctrain.run.events import (
    Cancelled,
    Checkpoint,
    Event,
    Failure,
    Relaunch,
    Requeue,
    Silent,
    Start,
    Stop,
    Straggler,
    read_events,
)
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.status.detail import duration, summary
from hpctrain.status.goodput import goodput

if TYPE_CHECKING:
    from chaos_soak import Injected, Soak


def alive_processes(run_dir: Path) -> list[tuple[int, dict[str, str]]]:
    """Processes of this run (their command line names its run dir): (pid, environment), the
    training tasks and srun (whose environment is left out)."""
    named = processes(str(run_dir))
    return [(p.pid, p.environ) for p in named if is_task(p)] + [(p.pid, {}) for p in named if p.program == "srun"]


def report(soak: Soak, max_steps: int) -> dict[str, Any]:
    events = read_events(soak.run_dir / "events.jsonl")
    metrics = read_jsonl(soak.run_dir / "metrics.jsonl")
    steps = [r.get("step") for r in metrics]
    checks = {
        "job completed": (soak.final_state == "COMPLETED", f"final state {soak.final_state}"),
        "model.pt bit-identical to the uninterrupted run": _same_weights(soak.run_dir, soak.reference),
        "every step once in metrics.jsonl": (
            steps == list(range(1, max_steps + 1)),
            f"{len(steps)} lines, {len(set(steps))} distinct, expected steps 1..{max_steps}",
        ),
        # A fault skipped: the job ended early, stuck PENDING or never trained again after one.
        "every fault applied": (not soak.skipped, f"skipped: {soak.skipped}" if soak.skipped else "none skipped"),
        "no job left": (not soak.jobs_left, f"left: {soak.jobs_left}"),
        "no process left": (not soak.processes_left, f"left: {soak.processes_left}"),
        # The faults stop, kill and freeze ranks and nodes; none makes a rank slow: a `straggler`
        # here is a false flag (a life's first steps, a save, a relaunch taken for slowness).
        "no straggler named": (
            not (named := [e for e in events if isinstance(e, Straggler)]),
            f"named: {[(e.step, e.ranks, e.slowdown) for e in named]}" if named else "none",
        ),
    }
    if soak.udp_blocked:
        checks.update(_udp_blocked_checks(soak.run_dir, events))
    ends = [i.at for i in soak.injected[1:]] + [float("inf")]
    rows = [_row(soak, item, end, events) for item, end in zip(soak.injected, ends)]
    figures = goodput(events, metrics).to_json()
    for row, lost in zip(rows, lost_by_fault(figures["lives"], [i.at for i in soak.injected])):
        row["lost_s"] = round(lost, 1)
    return {
        "seed": soak.seed,
        "minutes": soak.minutes,
        "job_ids": soak.job_ids,
        "run_dir": str(soak.run_dir),
        "faults": rows,
        "skipped": soak.skipped,
        "goodput": figures,
        "lost_by_kind": lost_by_kind(rows),
        "checks": {name: {"passed": ok, "detail": detail} for name, (ok, detail) in checks.items()},
        "passed": all(ok for ok, _ in checks.values()),
    }


def lost_by_fault(lives: list[dict[str, Any]], faults_at: list[float]) -> list[float]:
    """Seconds each fault (by the time it was sent) cost the run: the start-up of the lives it
    began (a life's goes to the last fault sent before it began; the first life's start is the
    job's own) and the redone steps and detection of the life it ended (the last fault sent
    within that life). Checkpoint stalls are the run's, not a fault's; waits between lives are
    not allocated time (hpctrain.status.goodput)."""
    lost = [0.0] * len(faults_at)

    def last_sent(until: float, since: float = float("-inf")) -> int | None:
        sent = [i for i, at in enumerate(faults_at) if since <= at <= until]
        return sent[-1] if sent else None

    for number, life in enumerate(lives):
        began = last_sent(life["began"]) if number else None
        if began is not None:
            lost[began] += life["startup_s"]
        ended = last_sent(life["ended"], since=life["began"])
        if ended is not None:
            lost[ended] += life["redone_s"] + life.get("detection_s", 0.0)
    return lost


def lost_by_kind(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each fault kind's count and its seconds lost per fault, median and p95 (nearest rank)."""
    kinds: dict[str, list[float]] = {}
    for row in rows:
        if row.get("lost_s") is not None:
            kinds.setdefault(row["kind"], []).append(row["lost_s"])
    return {
        kind: {"faults": len(lost), "p50_s": _rank(lost, 0.5), "p95_s": _rank(lost, 0.95)}
        for kind, lost in sorted(kinds.items())
    }


def _rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _udp_blocked_checks(run_dir: Path, events: list[Event]) -> dict[str, tuple[bool, str]]:
    """On a site that blocks UDP: the watcher heard no one, so it must never have called a node
    silent; and every keeper that ran long enough must have said that it is not armed."""
    silent = [e for e in events if isinstance(e, Silent)]
    said = "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("keeper-*.out")))
    unarmed = said.count("UDP between the nodes blocked?")
    return {
        "no silent node heard (UDP blocked)": (not silent, f"{len(silent)} `silent` events"),
        "the keeper said it is not armed": (unarmed > 0, f"said {unarmed} times in keeper-*.out"),
    }


def _row(soak: Soak, item: Injected, end: float, events: list[Event]) -> dict[str, Any]:
    window = [e for e in events if item.at <= e.time < end]
    return {
        "number": item.fault.number,
        "kind": item.fault.kind,
        "at_s": round(item.at - soak.t0, 1),
        "job_id": item.job_id,
        "step": item.step,
        "target": item.target,
        "note": item.note,
        "did": [_said(e) for e in window if not (isinstance(e, Checkpoint) and e.reason is CheckpointReason.PERIODIC)],
        "next_step_s": round(item.next_step_at - item.at, 1) if item.next_step_at is not None else None,
        "next_step": item.next_step,
    }


def _said(event: Event) -> str:
    if isinstance(event, Checkpoint):
        return f"saved {event.reason}@{event.step}"
    if isinstance(event, Stop):
        return f"agreed to stop ({event.reason})@{event.step}"
    if isinstance(event, Start):
        return f"start@{event.resumed_from_step} {','.join(event.nodes)}"
    if isinstance(event, (Failure, Requeue, Relaunch)):
        extra = next((v for v in (getattr(event, k, None) for k in ("nodes", "failed", "reason")) if v), "")
        who = getattr(event, "by", None)  # slurm, guardian or keeper
        by = f" by {who}" if who else ""
        return f"{event.name} {event.cause}{' ' + str(extra) if extra else ''}{by}"
    if isinstance(event, Cancelled):
        return f"cancelled@{event.step}"
    return event.name


def _same_weights(run_dir: Path, reference: Path) -> tuple[bool, str]:
    import torch

    try:
        mine = torch.load(run_dir / "model.pt", weights_only=True)
        theirs = torch.load(reference / "model.pt", weights_only=True)
    except (OSError, RuntimeError) as error:
        return False, f"cannot compare: {error}"
    differ = [k for k in theirs if k not in mine or not torch.equal(mine[k], theirs[k])]
    return not differ and mine.keys() == theirs.keys(), f"{len(differ)} of {len(theirs)} tensors differ"


def render(result: dict[str, Any]) -> str:
    head = (
        f"{'#':>3}  {'AT':>7}  {'FAULT':<16} {'JOB':>5} {'STEP':>5}  {'NEXT STEP':>9}  {'LOST':>7}  WHAT HPCTRAIN DID"
    )
    lines = [f"chaos soak, seed {result['seed']}, {result['minutes']:g} minutes, jobs {result['job_ids']}", head]
    for row in result["faults"]:
        next_s = f"{row['next_step_s']:.1f} s" if row["next_step_s"] is not None else "never"
        lost = f"{row['lost_s']:.1f} s" if row.get("lost_s") is not None else "-"
        lines.append(
            f"{row['number']:>3}  {row['at_s']:>6.1f}s  {row['kind']:<16} {row['job_id']:>5} {row['step'] or '-':>5}"
            f"  {next_s:>9}  {lost:>7}  {'; '.join(row['did']) or '(nothing: trained on)'}"
        )
    lines += [f"skipped: {line}" for line in result["skipped"]]
    for kind, lost in result.get("lost_by_kind", {}).items():
        lines.append(
            f"lost per {kind} fault: {lost['p50_s']:.1f} s median, {lost['p95_s']:.1f} s p95"
            f" ({lost['faults']:g} faults)"
        )
    figures = result["goodput"]
    from hpctrain.status.goodput import Goodput

    lines.append(summary(Goodput(**{**figures, "lives": []})))
    lines.append(f"lives: {len(figures['lives'])}, wall time {duration(_wall(figures))}")
    for name, check in result["checks"].items():
        lines.append(f"{'PASS' if check['passed'] else 'FAIL'}  {name}: {check['detail']}")
    return "\n".join(lines)


def _wall(figures: dict[str, Any]) -> float:
    lives = figures["lives"]
    return lives[-1]["ended"] - lives[0]["began"] if lives else 0.0
