"""Forced saves against a deadline, and the checkpoint format version: the decision as a table,
then the writer's cancel and the PlainCheckpointer's forced save on real files in this process, then
the `stop` record a real run writes before its forced save.

The dev-cluster proof (a multi-GB GPT preempted during a background write) is in
test_forced_save_slurm.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import train_command, train_env
from fakeslurm import FIXTURES, Said, captured, install
from helpers.held_save import HOLD_ENV
from helpers.paced import PAUSE_ENV

from hpctrain.checkpoint import CheckpointTooNew, PlainCheckpointer, UnreadableFormat, store
from hpctrain.checkpoint.deadline import (
    DEFAULT_GRACE_S,
    DEFAULT_KILL_WAIT_S,
    ForcedSavePlan,
    SigtermTimes,
    SigtermTimesReading,
    deadline_s,
    grace_time_s,
    plan_forced_save,
    preempted_now,
    sigterm_s,
    sigterm_times,
    usable_s,
)
from hpctrain.checkpoint.format import FORMAT_VERSION
from hpctrain.dist.context import DistContext
from hpctrain.recovery.decide import lineage
from hpctrain.recovery.facts import Outcome
from hpctrain.recovery.history import saved_for
from hpctrain.recovery.judge import classify
from hpctrain.run.causes import Cause, CheckpointReason, StopReason
from hpctrain.run.events import Checkpoint, Event, ForcedSave, Start, Stop, read_events
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.slurm.records import parse_job_record, parse_partition

TESTS = Path(__file__).parent
GOLDEN_V1 = TESTS / "golden" / "checkpoint_v1"

# ---- the decision ------------------------------------------------------------------------------

# A 30 s grace leaves usable_s(30) = 25.5 s. Columns: deadline, full write estimate, write under
# way (step, seconds left), newest complete step -> choice, steps to redo (the stop step is 100).
PLANS = [
    (None, 50.0, None, None, 80, "written", 0),  # no deadline (Ctrl-C): write, however long
    (None, 50.0, 90, 40.0, 80, "waited", 0),
    (30.0, None, None, None, None, "written", 0),  # nothing written yet: no estimate, try
    (30.0, None, 90, None, 80, "waited", 0),
    (30.0, 10.0, None, None, 80, "written", 0),
    (30.0, 30.0, None, None, 80, "skipped", 20),  # a write that cannot finish: keep step 80
    (30.0, 30.0, None, None, None, "skipped", 100),  # nothing to keep: redo from the start
    (30.0, 10.0, 90, 5.0, 80, "waited", 0),  # 15 s <= 25.5 s
    (30.0, 10.0, 90, 20.0, 80, "abandoned_inflight", 0),  # 30 s do not fit, 10 s do
    (30.0, 10.0, 90, None, 80, "waited", 0),  # no pace yet: the write under way counts as a full one
    (30.0, 26.0, 90, 20.0, 80, "inflight_only", 10),  # only the write under way fits
    (30.0, 26.0, 90, 26.0, 80, "skipped", 20),  # neither fits
    (5.0, 2.0, None, None, 80, "written", 0),  # usable_s(5) = 3 s
    (5.0, 4.0, 90, 1.0, 80, "inflight_only", 10),
    (0.0, 0.1, 90, 0.1, 80, "skipped", 20),  # the deadline has passed already
]


@pytest.mark.parametrize(("deadline", "write", "inflight", "left", "complete", "choice", "redo"), PLANS)
def test_plan_forced_save(
    deadline: float | None,
    write: float | None,
    inflight: int | None,
    left: float | None,
    complete: int | None,
    choice: str,
    redo: int,
) -> None:
    plan = plan_forced_save(100, deadline, write, inflight, left, complete)
    assert (plan.choice, plan.redo_steps) == (choice, redo), plan.why
    assert plan.why  # every choice says why


def test_the_margin_keeps_time_for_the_exit() -> None:
    assert usable_s(30.0) == pytest.approx(25.5)  # 15% of a long deadline
    assert usable_s(5.0) == pytest.approx(3.0)  # at least 2 s of a short one
    assert usable_s(1.0) < 0  # nothing fits


@pytest.mark.parametrize(
    "control_s, after_s, usable_of_120",
    [
        (None, 0.0, 102.0),  # outside hpctrain's jobs: the margin alone (15% of 120 s: 18 s)
        ("0.4", 3.2, 102.0),  # a quick controller: the margin covers after-step and the requeue
        ("7.5", 24.5, 95.5),  # a slow one (begin took 7.5 s): three times that, and 2 s, kept free
        ("12", 25.0, 95.0),  # never more than the control step's own bound on its calls
        ("soon", 0.0, 102.0),  # not a number: warned, the margin alone
    ],
)
def test_the_margin_grows_with_how_slowly_slurm_answered_this_life(
    control_s: str | None, after_s: float, usable_of_120: float
) -> None:
    """The time-limit warning gives slurm.signal_delay_s (120 s): the save must leave after-step
    and the requeue their time, measured from this life's `control begin` (HPCTRAIN_CONTROL_S)."""
    from hpctrain.checkpoint.deadline import CONTROL_BOUND_S, CONTROL_S_ENV, after_save_s
    from hpctrain.recovery.control import SLURM_BUDGET_S

    env = {} if control_s is None else {CONTROL_S_ENV: control_s}
    assert after_save_s(env) == pytest.approx(after_s)
    assert usable_s(120.0, after_save_s(env)) == pytest.approx(usable_of_120)
    assert CONTROL_BOUND_S >= SLURM_BUDGET_S
    # A write of 100 s fits a quick controller's margin, not a slow one's.
    chosen = plan_forced_save(60, 120.0, 100.0, None, None, 40, after_save_s(env))
    assert chosen.choice == ("written" if usable_of_120 >= 100.0 else "skipped"), chosen


def test_the_batch_script_exports_how_long_control_begin_took() -> None:
    from test_render import rendered

    from hpctrain.checkpoint.deadline import CONTROL_S_ENV

    script = rendered()
    assert f'export {CONTROL_S_ENV}="$(awk ' in script
    assert script.index("control begin") < script.index(f"export {CONTROL_S_ENV}=") < script.index("    srun ")


@pytest.mark.parametrize(
    ("reason", "since", "expected"),
    [("timelimit", 3.0, 117.0), ("preempt", 3.0, 17.0), ("preempt", 25.0, 0.0), ("interrupt", 3.0, None)],
)
def test_deadline_counts_from_the_signal(reason: str, since: float, expected: float | None) -> None:
    assert deadline_s(reason, since, signal_delay_s=120, sigterm_given=20) == expected


# ---- what a SIGTERM gives: GraceTime for a preemption, KillWait otherwise ---------------------

SITE = SigtermTimes(grace_s=20.0, kill_wait_s=5.0)  # the dev cluster's batch partition
ZERO_GRACE = SigtermTimes(grace_s=0.0, kill_wait_s=30.0)  # Slurm's defaults, as on many sites
LONG_KILL_WAIT = SigtermTimes(grace_s=10.0, kill_wait_s=60.0)


@pytest.mark.parametrize(
    ("times", "preempted", "expected"),
    [
        (SITE, True, 20.0),  # a preemption: its grace
        (SITE, False, 5.0),  # scancel, an admin's requeue: KillWait, not the grace (it used to be 20)
        (SITE, None, 5.0),  # Slurm did not say: never more than either could give
        (ZERO_GRACE, True, 30.0),  # a zero-grace preemption still leaves KillWait (it used to be 0: no save)
        (ZERO_GRACE, False, 30.0),
        (ZERO_GRACE, None, 30.0),
        (LONG_KILL_WAIT, True, 10.0),
        (LONG_KILL_WAIT, None, 10.0),
        (LONG_KILL_WAIT, False, 60.0),
    ],
)
def test_a_sigterm_gives_the_grace_of_a_preemption_and_killwait_otherwise(
    times: SigtermTimes, preempted: bool | None, expected: float
) -> None:
    assert sigterm_s(times, preempted) == expected
    # Slurm is asked only when its answer changes the deadline.
    assert times.preemption_differs == (times is not ZERO_GRACE)


@pytest.mark.parametrize(
    ("record", "preempted"),
    [("stop_preempted", True), ("stop_running", False), ("stop_cancelled", False), ("stop_admin_requeued", False)],
)
def test_a_preemption_is_told_by_the_jobs_preempt_time(
    record: str, preempted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records scontrol printed on the dev cluster during each kind of SIGTERM."""
    line = (FIXTURES / "scontrol" / f"{record}.txt").read_text()
    assert (parse_job_record(line).preempt_time is not None) == preempted
    slurm = install(tmp_path, monkeypatch).says("scontrol", Said(out=line))
    assert preempted_now({**os.environ, "SLURM_JOB_ID": "25817000"}) is preempted
    assert slurm.calls("scontrol") == [["scontrol", "show", "job", "-o", "25817000"]]


def test_no_answer_or_no_job_is_not_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, monkeypatch).says("scontrol", captured("stopped_scontrol_show_job"))
    assert preempted_now({**os.environ, "SLURM_JOB_ID": "7"}) is None
    assert preempted_now({"PATH": os.environ["PATH"]}) is None  # not a Slurm job


def test_killwait_and_grace_from_the_environment_then_slurm_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    job = (FIXTURES / "scontrol" / "stop_running.txt").read_text()  # Partition=batch
    config = (FIXTURES / "scontrol" / "show_config.txt").read_text()  # KillWait = 5 sec
    slurm = install(tmp_path, monkeypatch)
    # In a job: its partition's GraceTime (PreemptType=preempt/partition_prio: the partition's,
    # not its QOS's), then KillWait, each as scontrol printed them.
    slurm.says("scontrol", Said(out=job), Said(out=config), Said(out=PARTITION_LINE), Said(out=config))
    in_job = {**os.environ, "SLURM_JOB_ID": "25817000"}
    assert sigterm_times(in_job) == SigtermTimes(grace_s=20.0, kill_wait_s=5.0)
    assert [c[:3] for c in slurm.calls("scontrol")] == [
        ["scontrol", "show", "job"],
        ["scontrol", "show", "config"],
        ["scontrol", "show", "partition"],
        ["scontrol", "show", "config"],
    ]
    # The environment wins; outside Slurm, Slurm's defaults and no grace, nothing asked.
    overridden = {**in_job, "HPCTRAIN_KILL_WAIT_S": "12", "HPCTRAIN_GRACE_TIME_S": "0"}
    assert sigterm_times(overridden) == SigtermTimes(0.0, 12.0)
    assert sigterm_times({"PATH": os.environ["PATH"]}) == SigtermTimes(0.0, DEFAULT_KILL_WAIT_S)
    assert len(slurm.calls("scontrol")) == 4
    # A config without KillWait (or no scontrol): the default, said with the variable to set.
    with caplog.at_level(logging.WARNING):
        assert sigterm_times({"SLURM_JOB_ID": "7", "PATH": str(tmp_path / "none")}).kill_wait_s == DEFAULT_KILL_WAIT_S
    assert "could not read KillWait" in caplog.text and "HPCTRAIN_KILL_WAIT_S" in caplog.text


def test_a_start_does_not_wait_for_slurm_to_tell_what_a_sigterm_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # slurmctld away: scontrol answers, as on the dev cluster, only after a while.
    slow = captured("stopped_scontrol_show_job")
    install(tmp_path, monkeypatch).says("scontrol", replace(slow, sleep_s=3.0), replace(slow, sleep_s=3.0))
    began = time.monotonic()
    reading = SigtermTimesReading({**os.environ, "SLURM_JOB_ID": "7"})
    assert time.monotonic() - began < 0.5  # the life starts at once
    with caplog.at_level(logging.WARNING):
        times = reading.get(wait_s=0.2)  # a SIGTERM before Slurm answered: Slurm's defaults
    assert times == SigtermTimes(DEFAULT_GRACE_S, DEFAULT_KILL_WAIT_S)
    assert "not read yet" in caplog.text and "HPCTRAIN_KILL_WAIT_S" in caplog.text
    # Answered by then (here: from the environment), the reading is the answer.
    known = SigtermTimesReading({"SLURM_JOB_ID": "7", "HPCTRAIN_GRACE_TIME_S": "20", "HPCTRAIN_KILL_WAIT_S": "5"})
    assert known.get() == SigtermTimes(20.0, 5.0)


# Printed by `scontrol show partition --oneliner batch` and `scontrol show job --oneliner ID`
# on the dev cluster (Slurm 22.05), cut to the fields around the ones read.
PARTITION_LINE = (
    "PartitionName=batch AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=20 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-3] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP"
)


def test_grace_time_is_read_from_scontrol_fields() -> None:
    assert parse_partition(PARTITION_LINE)["GraceTime"] == "20"
    assert "GraceTime" not in parse_partition("PartitionName=batch State=UP")


def test_grace_time_from_the_environment_then_slurm_then_the_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert grace_time_s({"HPCTRAIN_GRACE_TIME_S": "45"}) == 45.0
    assert grace_time_s({}) == DEFAULT_GRACE_S  # not a Slurm job
    # A Slurm job where scontrol cannot be run (a container without Slurm's commands): said so.
    with caplog.at_level(logging.WARNING):
        assert grace_time_s({"SLURM_JOB_ID": "7", "PATH": str(tmp_path)}) == DEFAULT_GRACE_S
    assert "could not read the partition's GraceTime" in caplog.text and "HPCTRAIN_GRACE_TIME_S" in caplog.text


# ---- the writer's cancel and the Checkpointer's forced save --------------------------------------


def _checkpointer(folder: Path, forced: list[ForcedSave], written: list[Checkpoint]) -> PlainCheckpointer:
    return PlainCheckpointer(
        folder,
        DistContext.single(cuda_devices=0),
        keep=3,
        fingerprint="fp",
        on_written=written.append,
        on_forced=forced.append,
    )


def _state(step: int) -> dict[str, Any]:
    return {
        "model": {"w": torch.full((1 << 20,), float(step))},
        "train": {"step": step, "epoch": 0, "batch_in_epoch": step},
    }


@pytest.fixture
def paced_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Background writes that stop after 128 KiB until the event is set (a slow disk), or for
    at most 20 s (a test that went wrong fails instead of hanging)."""
    may_go_on = threading.Event()
    real_write_chunk = store._HashingWriter._write_chunk

    def paced(self: store._HashingWriter, chunk: memoryview) -> None:
        real_write_chunk(self, chunk)
        if threading.current_thread() is threading.main_thread() or self.size < 2 * store.CHUNK_BYTES:
            return
        give_up = time.monotonic() + 20
        while not may_go_on.wait(0.02) and not self.control.cancel.is_set() and time.monotonic() < give_up:
            pass  # stuck, until the disk catches up or the write is cancelled

    monkeypatch.setattr(store, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(store._HashingWriter, "_write_chunk", paced)
    yield may_go_on
    may_go_on.set()


def test_an_abandoned_write_leaves_no_file_and_the_stop_step_is_written(
    tmp_path: Path, paced_writes: threading.Event
) -> None:
    folder = tmp_path / "checkpoints"
    forced: list[ForcedSave] = []
    written: list[Checkpoint] = []
    checkpointer = _checkpointer(folder, forced, written)
    checkpointer.save(10, _state(10), CheckpointReason.PERIODIC, background=False)  # measures a write's pace
    checkpointer.save(20, _state(20), CheckpointReason.PERIODIC, background=True)  # stuck after its first chunk
    time.sleep(0.5)  # its own pace: 128 KiB in 0.5 s, ~16 s for the rest
    checkpointer.writer.bytes_per_s = 1e9  # a full write: 4 ms
    # usable_s(2.5) = 0.5 s: the full write fits, the rest of the write under way does not.
    checkpointer.forced_save(25, _state(25), StopReason.PREEMPT, deadline_s=2.5)

    assert [e.step for e in store.entries(folder)] == [25, 10]
    assert not list(folder.glob("*.tmp"))
    assert forced == [forced[0]] and forced[0].forced_save == "abandoned_inflight"
    assert forced[0].inflight_step == 20 and forced[0].resume_step == 25 and forced[0].redo_steps == 0
    assert [(r.step, r.forced_save) for r in written] == [(10, None), (25, "abandoned_inflight")]
    loaded = PlainCheckpointer(folder, DistContext.single(cuda_devices=0), 2, "fp", lambda r: None).load()
    assert loaded is not None and loaded["train"]["step"] == 25 and loaded["format_version"] == FORMAT_VERSION


def test_a_skipped_save_keeps_the_last_complete_checkpoint_and_says_what_is_redone(
    tmp_path: Path, paced_writes: threading.Event
) -> None:
    folder = tmp_path / "checkpoints"
    forced: list[ForcedSave] = []
    checkpointer = _checkpointer(folder, forced, [])
    checkpointer.save(10, _state(10), CheckpointReason.PERIODIC, background=False)
    checkpointer.save(20, _state(20), CheckpointReason.PERIODIC, background=True)
    time.sleep(0.5)  # its own pace: ~16 s for the rest
    checkpointer.writer.bytes_per_s = 1e5  # a full write: 40 s; neither fits in usable_s(10) = 8 s
    checkpointer.forced_save(27, _state(27), StopReason.TIMELIMIT, deadline_s=10.0)

    assert [e.step for e in store.entries(folder)] == [10]
    assert not list(folder.glob("*.tmp"))
    record = forced[0]
    assert (record.forced_save, record.resume_step, record.redo_steps) == ("skipped", 10, 17)
    assert record.deadline_s == 10.0 and record.estimated_write_s > 10 and "keeping" in record.why


def test_a_forced_save_without_deadline_waits_for_the_write_under_way(
    tmp_path: Path, paced_writes: threading.Event
) -> None:
    folder = tmp_path / "checkpoints"
    forced: list[ForcedSave] = []
    checkpointer = _checkpointer(folder, forced, [])
    checkpointer.save(20, _state(20), CheckpointReason.PERIODIC, background=True)
    threading.Timer(0.3, paced_writes.set).start()  # the slow disk catches up
    checkpointer.forced_save(21, _state(21), StopReason.INTERRUPT, deadline_s=None)
    assert [e.step for e in store.entries(folder)] == [21, 20]
    assert forced[0].forced_save == "waited" and forced[0].deadline_s is None


# ---- the format version ------------------------------------------------------------------------


def test_a_checkpoint_of_a_newer_format_is_refused_not_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    written: list[Checkpoint] = []
    checkpointer = _checkpointer(folder, [], written)
    checkpointer.save(5, _state(5), CheckpointReason.PERIODIC, background=False)
    checkpointer.save(9, _state(9), CheckpointReason.PERIODIC, background=False)
    newest = store.paths_for(folder, 9)
    meta = json.loads(newest.meta.read_text())
    assert meta["format_version"] == FORMAT_VERSION
    newest.meta.write_text(json.dumps({**meta, "format_version": FORMAT_VERSION + 1}))

    with pytest.raises(CheckpointTooNew) as refused:
        checkpointer.load()
    message = str(refused.value)
    assert f"format_version {FORMAT_VERSION + 1}" in message and f"reads version {FORMAT_VERSION}." in message
    assert "pip install -U hpctrain" in message and "move the checkpoints folder away" in message
    assert [e.step for e in store.entries(folder)] == [9, 5]  # nothing was removed


def test_a_checkpoint_of_an_older_format_is_refused_not_skipped(tmp_path: Path) -> None:
    """tests/golden/checkpoint_v1 was written by the code before format_version existed (before
    hpctrain 0.1.0): this hpctrain reads only its own format, and says so rather than misread it,
    skip it for an older one, or start over."""
    assert "format_version" not in json.loads((GOLDEN_V1 / "step_00000005.json").read_text())
    folder = tmp_path / "checkpoints"
    shutil.copytree(GOLDEN_V1, folder)
    checkpointer = PlainCheckpointer(folder, DistContext.single(cuda_devices=0), 2, "fixture-v1", lambda r: None)

    with pytest.raises(UnreadableFormat) as refused:
        checkpointer.load()
    message = str(refused.value)
    assert not isinstance(refused.value, CheckpointTooNew)
    assert f"format_version None, but this hpctrain reads version {FORMAT_VERSION}" in message
    assert "move the checkpoints folder away" in message
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000005.json", "step_00000005.pt"]  # kept


def test_plan_is_a_frozen_record() -> None:
    plan = ForcedSavePlan("written", "why", 0)
    with pytest.raises(AttributeError):
        plan.choice = "skipped"  # type: ignore[misc]


def test_a_periodic_save_stops_waiting_for_the_previous_write_when_a_stop_is_requested(
    tmp_path: Path, paced_writes: threading.Event
) -> None:
    folder = tmp_path / "checkpoints"
    written: list[Checkpoint] = []
    checkpointer = _checkpointer(folder, [], written)
    checkpointer.save(20, _state(20), CheckpointReason.PERIODIC, background=True)  # stuck
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()  # the signal arrives while the next save waits
    started = time.perf_counter()
    checkpointer.save(21, _state(21), CheckpointReason.PERIODIC, background=True, stop_requested=stop.is_set)
    assert time.perf_counter() - started < 10
    assert checkpointer.writer.busy() and checkpointer.writer.inflight_step == 20  # step 21 was not started
    # Asked again with the stop already requested: no wait, no copy, nothing started.
    checkpointer.save(22, _state(22), CheckpointReason.PERIODIC, background=True, stop_requested=lambda: True)
    assert checkpointer.writer.inflight_step == 20
    paced_writes.set()
    checkpointer.wait()
    assert [e.step for e in store.entries(folder)] == [20] and [r.step for r in written] == [20]


def test_a_forced_write_still_under_way_at_the_deadline_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "checkpoints"
    forced: list[ForcedSave] = []
    checkpointer = _checkpointer(folder, forced, [])
    checkpointer.save(10, _state(10), CheckpointReason.PERIODIC, background=False)
    real_write_chunk = store._HashingWriter._write_chunk

    def slow_disk(self: store._HashingWriter, chunk: memoryview) -> None:
        time.sleep(0.05)
        real_write_chunk(self, chunk)

    monkeypatch.setattr(store, "CHUNK_BYTES", 1 << 16)  # 4 MiB: 64 chunks, 3.2 s on this disk
    monkeypatch.setattr(store._HashingWriter, "_write_chunk", slow_disk)
    checkpointer.writer.bytes_per_s = 1e9  # the estimate says 4 ms: wrong
    started = time.perf_counter()
    checkpointer.forced_save(11, _state(11), StopReason.TIMELIMIT, deadline_s=3.0)  # usable: 1 s

    assert time.perf_counter() - started < 2.5
    assert forced[0].forced_save == "overran" and "cancelled" in forced[0].why
    assert (forced[0].resume_step, forced[0].redo_steps) == (10, 1)
    assert [e.step for e in store.entries(folder)] == [10] and not list(folder.glob("*.tmp"))


# ---- the `stop` record: written before the save, there even when the save is killed ------------

HELD = (
    "model._target_=helpers.held_save.HeldSaveConvNet",
    "trainer.nprocs=2",
    "trainer.max_steps=400",
    "trainer.ckpt_every=0",
    "trainer.eval_every=0",
    "trainer.log_every=5",
)
# A life of task 7 of array 36 (its own job number 44), restarted twice: what the stamp must say.
ARRAY_LIFE = {"SLURM_JOB_ID": "44", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "7", "SLURM_RESTART_COUNT": "2"}


def _logged_step(run_dir: Path) -> int:
    return max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)


def _wait_for(found: Callable[[], object], what: str, launcher: subprocess.Popen, log: Path) -> object:
    deadline = time.monotonic() + 300
    while not (value := found()):
        if launcher.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {what} (exit {launcher.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    return value


@pytest.mark.slow
def test_the_stop_is_journaled_before_its_save_and_outlives_a_killed_save(tmp_path: Path) -> None:
    """A real SIGTERM to a real 2-process hpctrain-train whose forced save is held (a slow disk):
    the `stop` record is in the journal while the save is still under way, and after a SIGKILL
    it is the life's last word, which the control step judges the step by."""
    run_dir, hold, log = tmp_path / "run", tmp_path / "hold-the-save", tmp_path / "train.log"
    env = {**train_env(TESTS), **ARRAY_LIFE, HOLD_ENV: str(hold), PAUSE_ENV: "0.01", "HPCTRAIN_GRACE_TIME_S": "30"}
    launched_at = time.time()
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            train_command(run_dir, HELD),
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    journal = run_dir / "events.jsonl"
    try:
        _wait_for(lambda: _logged_step(run_dir) >= 20, "step 20", launcher, log)
        hold.touch()  # from now on a save, once started, does not get past taking the state
        os.kill(launcher.pid, signal.SIGTERM)  # a preemption, as the launcher passes it on
        _wait_for(lambda: any(isinstance(e, Stop) for e in read_events(journal)), "stop record", launcher, log)
        time.sleep(1.0)  # time enough for an unheld save of this small model
        during: list[Event] = read_events(journal)
        assert not [e for e in during if isinstance(e, (Checkpoint, ForcedSave))], during
        assert launcher.poll() is None, "the ranks should still be in their save"
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the save killed half-way, as KillWait would
        launcher.wait(timeout=60)

    events = read_events(journal)
    assert [e.name for e in events] == ["start", "stop"], events
    start, stop = events
    assert isinstance(start, Start) and isinstance(stop, Stop)
    assert stop.reason is StopReason.PREEMPT and 20 <= stop.step < 400
    assert (start.job_id, start.restart) == (stop.job_id, stop.restart) == ("36_7", 2)
    assert stop.deadline_s is not None and 0 < stop.deadline_s <= 30  # the grace, less the time to agree
    assert not list((run_dir / "checkpoints").glob("*.pt"))
    since = tuple(e for e in lineage(events, "36_7") if e.time >= launched_at)
    # What after-step reads of this step: the stop, kept with its job, and judged as the stop it was.
    assert [e for e in since if saved_for(e)] == [stop]
    assert classify(since, Outcome(exit_code=137, nodes_wanted=2), []) is Cause.PREEMPT


@pytest.mark.parametrize(
    "preempt_type, source",
    [("preempt/qos", "qos"), ("preempt/partition_prio", "partition"), ("preempt/none", "partition"), ("", "partition")],
)
def test_whose_grace_time_by_the_clusters_preempt_type(preempt_type: str, source: str) -> None:
    """slurm.conf(5): under PreemptType=preempt/qos a preempted job gets its QOS's GraceTime
    (sacctmgr), otherwise its partition's."""
    from hpctrain.checkpoint.deadline import grace_source

    assert grace_source(preempt_type) == source


def test_a_jobs_qos_is_read_from_its_record() -> None:
    """`scontrol show job -o` of a running job on the dev cluster with accounting: QOS=normal."""
    from hpctrain.slurm.records import parse_job_record

    line = (Path(__file__).parent / "fixtures" / "slurm" / "scontrol" / "running_with_qos.txt").read_text()
    record = parse_job_record(line)
    assert record is not None and record.qos == "normal" and record.partition == "batch"
    assert parse_job_record(line.replace("QOS=normal", "QOS=(null)")).qos is None  # type: ignore[union-attr]


def test_a_short_kill_wait_keeps_half_for_the_save_however_slow_the_controller() -> None:
    """KillWait 5 s after an admin's requeue, `control begin` measured at 1.7 s on a loaded
    machine (a margin of 3 x 1.7 + 2 = 7.1 s): before, nothing fit and a 0.02 s save of the stop
    step was skipped (seen in the suite's run); half the deadline stays the save's."""
    from hpctrain.checkpoint.deadline import CONTROL_S_ENV, after_save_s

    after = after_save_s({CONTROL_S_ENV: "1.7"})
    assert after == pytest.approx(7.1)
    assert usable_s(5.0, after) == pytest.approx(2.5)
    assert plan_forced_save(69, 5.0, 0.02, None, None, 60, after).choice == "written"
    # A long deadline keeps the whole measured margin (the time limit's requeue must be asked).
    assert usable_s(120.0, after) == pytest.approx(120.0 - 18.0)
