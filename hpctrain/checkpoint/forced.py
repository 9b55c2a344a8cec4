"""Rank 0's part of a signal-forced save: plan it against the deadline, then carry the plan out.

The plan is hpctrain.checkpoint.deadline.plan_forced_save; the estimates come from the
background writer (the last complete write's bytes/s, the write under way's own pace). What was
done is reported as one record (the `forced_save` event), whatever the choice, so a skipped
save is as visible as a written one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch

from hpctrain import faults
from hpctrain.checkpoint import store
from hpctrain.checkpoint.deadline import ForcedSavePlan, after_save_s, plan_forced_save
from hpctrain.checkpoint.snapshot import Snapshotter, state_bytes
from hpctrain.checkpoint.writer import BackgroundWriter
from hpctrain.run.causes import StopReason
from hpctrain.run.events import ForcedSave

log = logging.getLogger(__name__)

WRITES_STOP_STEP = ("written", "waited", "abandoned_inflight")


def plan(
    writer: BackgroundWriter, step: int, state: dict[str, Any], deadline_s: float | None
) -> tuple[ForcedSavePlan, dict[str, Any]]:
    """The plan, and the estimates it was made from (for the record)."""
    inflight_step = writer.inflight_step if writer.busy() else None
    write_s = writer.estimate_s(state_bytes(state))
    inflight_left_s = writer.inflight_left_s()
    complete = store.entries(writer.folder)
    newest = complete[0].step if complete else None
    after_s = after_save_s(os.environ)
    chosen = plan_forced_save(step, deadline_s, write_s, inflight_step, inflight_left_s, newest, after_s)
    estimates = {
        "deadline_s": _round(deadline_s),
        "estimated_write_s": _round(write_s),
        "inflight_step": inflight_step,
        "inflight_left_s": _round(inflight_left_s),
    }
    return chosen, estimates


def carry_out(
    writer: BackgroundWriter,
    snapshotter: Snapshotter,
    chosen: ForcedSavePlan,
    step: int,
    state: dict[str, Any],
    info: dict[str, Any],
    cutoff: float | None,
) -> str:
    """Do what `chosen` says; returns the choice actually made: an abandoned write that had
    completed first makes "abandoned_inflight" a "waited", "skipped" an "inflight_only"; a
    write still under way at `cutoff` (time.perf_counter()) is cancelled: "overran"."""
    started = time.perf_counter()
    choice = chosen.choice
    past_cutoff = (lambda: time.perf_counter() >= cutoff) if cutoff is not None else (lambda: False)
    if choice in ("waited", "inflight_only", "written"):
        if not writer.wait_unless(past_cutoff):  # re-raises a failed background write
            writer.abandon()
            return "overran"
    else:
        had_write = writer.pending()
        abandoned = writer.abandon()
        newest = store.entries(writer.folder)
        if had_write and not abandoned and newest and newest[0].step == writer.inflight_step:
            # Nothing to cancel any more: the write under way had completed, and it counts.
            choice = {"abandoned_inflight": "waited", "skipped": "inflight_only"}.get(choice, choice)
    if choice in WRITES_STOP_STEP:
        # Training has stopped: the live tensors stay as they are, so on CPU they are written as
        # they are, without the copy a background write needs.
        tree = snapshotter.take(state) if torch.cuda.is_available() else state
        waited_s = round(time.perf_counter() - started, 4)  # for the write under way, or its cancel
        timer = (
            None if cutoff is None else threading.Timer(max(0.0, cutoff - time.perf_counter()), writer.cancel_current)
        )
        if timer is not None:
            timer.start()
        try:
            writer.start(
                step,
                tree,
                {**info, "blocking_s": waited_s, "forced_save": choice},
                background=False,
                in_flight=_forced_in_flight,
            )
        except store.WriteAbandoned:
            return "overran"  # the estimate was wrong; an exit in time beats a write that is killed
        finally:
            if timer is not None:
                timer.cancel()
    return choice


def record(
    writer: BackgroundWriter,
    chosen: ForcedSavePlan,
    choice: str,
    step: int,
    reason: StopReason,
    estimates: dict[str, Any],
    started: float,
) -> ForcedSave:
    complete = store.entries(writer.folder)
    resume_step = complete[0].step if complete else 0
    return ForcedSave(
        step=step,
        reason=reason,
        forced_save=choice,
        why=_why(chosen, choice),
        **estimates,
        resume_step=resume_step,
        redo_steps=step - resume_step,
        took_s=round(time.perf_counter() - started, 3),
    )


def _why(chosen: ForcedSavePlan, choice: str) -> str:
    if choice == chosen.choice:
        return chosen.why
    if choice == "overran":
        return f"{chosen.why}; but the write was still under way at the deadline and was cancelled"
    return f"{chosen.why}; the write under way completed first"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _forced_in_flight() -> None:
    faults.point("checkpoint.forced_in_flight")
