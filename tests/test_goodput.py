"""Goodput (hpctrain/status/goodput.py): a table of hand-built journals for the arithmetic, and
the journal of a real run stopped by a real SIGTERM and resumed."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import train_command, train_env

from hpctrain.run.causes import CheckpointReason
from hpctrain.run.events import Checkpoint, Event, Relaunch, Start, from_record, read_events
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir
from hpctrain.status.goodput import goodput, goodput_of


def start(t: float, resumed: int, job: str | None = "7", restart: int = 0, allocated: float | None = None) -> Start:
    return Start(time=t, job_id=job, restart=restart, resumed_from_step=resumed, allocated_at=allocated)


def ckpt(t: float, step: int, reason: str = "periodic", blocking: float = 0.0, write: float = 0.0) -> Checkpoint:
    return Checkpoint(time=t, step=step, reason=CheckpointReason(reason), blocking_s=blocking, write_s=write)


def ev(name: str, t: float, **fields: object) -> Event:
    """Any event as its journal line says it (its words read back as the journal's reader does)."""
    event = from_record({"event": name, "time": t, **fields})
    assert event is not None, (name, fields)
    return event


def m(step: int, t: float) -> dict:
    return {"step": step, "loss": 1.0, "time": t}


# (label, events, metrics, now, expected: allocated, kept, startup, stall, redone, wait, endings)
CASES = [
    (
        "uninterrupted",
        [start(0, 0), ckpt(10.5, 10, "final", 0.2, 0.3), ev("finish", 11, step=10)],
        [m(5, 5), m(10, 10)],
        None,
        (11, 10, 0, 0.5, 0.5, 0, ["finish"]),
    ),
    (
        # Steps 11-15 were trained, then lost with the crash (their lines dropped by life 2).
        "crash redoes the steps after the checkpoint",
        [
            start(0, 0),
            ckpt(10.2, 10, "periodic", 0.1, 0.1),
            ev("failure", 16, cause="crash"),
            ev("requeue", 16.1, cause="crash"),
            start(40, 10, restart=1),
            ev("finish", 51, step=20),
        ],
        [m(10, 10), m(20, 50)],
        None,
        (27.1, 20, 0, 0.1, 7.0, 23.9, ["requeue", "finish"]),
    ),
    (
        # Each life's batch script started (allocated_at) 4 s before its `start`: set-up, imports
        # and the rendezvous are allocated time lost to start-up, not a wait between lives.
        "the time from the batch script's start to `start` counts as start-up",
        [
            start(0, 0, allocated=-4),
            ckpt(10.2, 10, "periodic", 0.1, 0.1),
            ev("failure", 16, cause="crash"),
            ev("requeue", 16.1, cause="crash"),
            start(40, 10, restart=1, allocated=36),
            ev("finish", 51, step=20),
        ],
        [m(10, 10), m(20, 50)],
        None,
        (35.1, 20, 8, 0.1, 7.0, 19.9, ["requeue", "finish"]),
    ),
    (
        "relaunch on a spare: the allocation is held, the start-up counts",
        [
            start(0, 0),
            ckpt(10, 10),
            ev("failure", 12, cause="node_failure"),
            ev("relaunch", 12.5, cause="node_failure"),
            start(20, 10),
            ev("finish", 30, step=20),
        ],
        [m(10, 10), m(20, 30)],
        None,
        (30, 20, 7.5, 0, 2.5, 0, ["relaunch", "finish"]),
    ),
    (
        # Life 1 wrote checkpoints 10 and 20; 20 was torn, life 2 resumed from 10.
        "a torn newest checkpoint: the steps after the one resumed from are lost",
        [
            start(0, 0),
            ckpt(10, 10),
            ckpt(20, 20),
            ev("requeue", 25, cause="preempt"),
            start(30, 10, restart=1),
            ev("finish", 40, step=20),
        ],
        [m(10, 10), m(20, 40)],
        None,
        (35, 20, 0, 0, 15, 5, ["requeue", "finish"]),
    ),
    (
        # Every checkpoint of life 1 was lost: life 2 started over, life 1 kept nothing.
        "all of a life's checkpoints torn: it keeps nothing",
        [
            start(0, 0),
            ckpt(10, 10),
            ev("requeue", 12, cause="timelimit"),
            start(20, 0, restart=1),
            ev("finish", 40, step=10),
        ],
        [m(10, 40)],
        None,
        (32, 20, 0, 0, 12, 8, ["requeue", "finish"]),
    ),
    (
        # The batch node died: Slurm requeued; the next start wrote failure + requeue (by slurm).
        "killed without a word: ends at its last record",
        [
            start(0, 0),
            ckpt(20, 20),
            ev("failure", 100, cause="node_failure", by="slurm"),
            ev("requeue", 100.1, cause="node_failure", by="slurm"),
            start(105, 20, restart=1),
            ev("finish", 115, step=30),
        ],
        [m(20, 20), m(30, 115)],
        None,
        (30, 30, 0, 0, 0, 85, ["unknown", "finish"]),
    ),
    (
        "scancel, then submitted again into the same run dir",
        [
            start(0, 0, job="7"),
            ckpt(10, 10, "preempt", 1, 1),
            ev("cancelled", 13, step=10),
            start(60, 10, job="8"),
            ev("finish", 70, step=20),
        ],
        [m(10, 8), m(20, 70)],
        None,
        (23, 18, 0, 2, 3, 47, ["cancelled", "finish"]),
    ),
    (
        # Job 8 lost a node before its first start and relaunched: that failure is not life 1's.
        "another job's events before its first start",
        [
            start(0, 0, job="7"),
            ckpt(10, 10, "timelimit"),
            ev("failure", 30, job_id="8", cause="node_failure"),
            ev("relaunch", 31, job_id="8", cause="node_failure"),
            start(40, 10, job="8"),
            ev("finish", 50, step=20),
        ],
        [m(10, 10), m(20, 50)],
        None,
        (29, 20, 9, 0, 0, 21, ["stopped", "finish"]),
    ),
    (
        # The ranks agreed to stop after step 30, then the save was killed: life 2 redoes 21-30.
        "a stop whose save was killed ends no life by itself",
        [
            start(0, 0),
            ckpt(20, 20),
            ev("stop", 31, step=30, reason="preempt", deadline_s=10.0),
            start(60, 20, restart=1),
            ev("finish", 70, step=30),
        ],
        [m(20, 20), m(30, 30), m(30, 70)],
        None,
        (41, 30, 0, 0, 11, 29, ["unknown", "finish"]),
    ),
    (
        "still running: counted until now, its last logged step kept",
        [start(0, 0)],
        [m(10, 10), m(20, 20)],
        25.0,
        (25, 20, 0, 0, 5, 0, ["running"]),
    ),
    ("nothing started", [ev("failure", 1, cause="user_error")], [], None, (0, 0, 0, 0, 0, 0, [])),
]


@pytest.mark.parametrize("events, metrics, now, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_goodput_table(events: list[Event], metrics: list[dict], now: float | None, expected: tuple) -> None:
    allocated, kept, startup, stall, redone, wait, endings = expected
    got = goodput(events, metrics, now)
    assert [life.ending for life in got.lives] == endings
    figures = (got.allocated_s, got.kept_s, got.startup_s, got.stall_s, got.redone_s, got.wait_s)
    assert figures == pytest.approx((allocated, kept, startup, stall, redone, wait))
    # The parts of the allocated time add up to it.
    assert got.kept_s + got.startup_s + got.stall_s + got.redone_s == pytest.approx(got.allocated_s)
    assert got.goodput_pct == (pytest.approx(100 * kept / allocated) if allocated else None)


def test_lineage_follows_the_step_each_life_resumed_from() -> None:
    events = [
        start(0, 0),
        ckpt(10, 10),
        ckpt(20, 20),
        ev("requeue", 25, cause="preempt"),
        start(30, 10, restart=1),
        ev("finish", 40, step=20),
    ]
    lives = goodput(events, [m(10, 10), m(20, 40)]).lives
    assert [(life.resumed_from, life.kept_to) for life in lives] == [(0, 10), (10, 20)]
    assert goodput(events, [m(10, 10), m(20, 40)]).to_json()["lives"][1]["allocated_s"] == 10


# ---- a real run: SIGTERM, then resumed ---------------------------------------------------------

PAUSE_S = 0.02
PACED = (
    "model._target_=helpers.paced.PacedConvNet",
    "trainer.max_steps=200",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
)


@pytest.mark.slow
def test_goodput_of_a_real_run_stopped_by_sigterm_and_resumed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**train_env(Path(__file__).parent), "HPCTRAIN_TEST_STEP_PAUSE_S": str(PAUSE_S)}
    first = subprocess.Popen(
        train_command(run_dir, PACED), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0) < 60:
        assert first.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 60"
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) != 0
    time.sleep(1.0)  # a wait between lives, which goodput leaves out
    second = subprocess.run(
        train_command(run_dir, PACED), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr[-3000:]

    got = goodput_of(RunDir(run_dir))
    stopped_at = [
        e["step"]
        for e in read_jsonl(run_dir / "events.jsonl")
        if e.get("event") == "checkpoint" and e.get("reason") == "preempt"
    ]
    assert len(got.lives) == 2 and len(stopped_at) == 1
    assert [life.ending for life in got.lives] == ["stopped", "finish"]
    assert [(life.resumed_from, life.kept_to) for life in got.lives] == [(0, stopped_at[0]), (stopped_at[0], 200)]
    assert [life.state_from for life in got.lives] == [None, "disk"]
    # Every kept step took at least the pace; a SIGTERM save loses no step.
    assert got.lives[0].kept_s >= stopped_at[0] * PAUSE_S
    assert got.kept_s >= 200 * PAUSE_S
    assert got.wait_s >= 1.0
    assert got.kept_s + got.startup_s + got.stall_s + got.redone_s == pytest.approx(got.allocated_s)
    # The share itself depends on the machine's load (start-up and checkpoint stalls took 21% of
    # this run in a loaded CI): what it must be is kept over allocated, and no step was redone
    # (the first life stopped at step 60 or later: had it lost them, 60 paced steps, 1.2 s or
    # more, would be redone; what is left is the stop's own exit after its save).
    assert got.goodput_pct == pytest.approx(100 * got.kept_s / got.allocated_s)
    assert got.redone_s < 50 * PAUSE_S


# ---- a real chaos soak's journal (scripts/chaos.py, seed 2: 8 faults, one of each kind) --------

SOAK = Path(__file__).parent / "golden" / "goodput_soak"  # metrics.jsonl kept to step and time


def test_goodput_of_a_real_chaos_soak_journal() -> None:
    # Written by an hpctrain of before the typed records: read as any journal is.
    events = read_events(SOAK / "events.jsonl")
    got = goodput(events, read_jsonl(SOAK / "metrics.jsonl"))
    # Time limit, killed rank, hang, preemption, preemption with the newest checkpoint torn (its
    # life resumed from 363 again: nothing kept), scancel (job 7's last life, no word after its
    # save), resubmitted job 10 losing a node before its first step, relaunched on the spare.
    assert [(life.resumed_from, life.kept_to) for life in got.lives] == [
        (0, 238),
        (238, 240),
        (240, 240),
        (240, 363),
        (363, 363),
        (363, 375),
        (375, 375),
        (375, 1440),
    ]
    assert [life.ending for life in got.lives] == [
        "requeue",
        "requeue",
        "requeue",
        "requeue",
        "requeue",
        "stopped",
        "relaunch",
        "finish",
    ]
    assert [life.cause for life in got.lives][:5] == ["timelimit", "crash", "hang", "preempt", "preempt"]
    relaunch = next(e for e in events if isinstance(e, Relaunch))
    assert got.lives[-1].began == relaunch.time
    assert got.startup_s == pytest.approx(got.lives[-1].started - relaunch.time)
    assert got.lives[2].kept_s == 0 and got.lives[4].kept_s == 0  # a hang's and a torn save's lives
    assert got.kept_s + got.startup_s + got.stall_s + got.redone_s == pytest.approx(got.allocated_s)
    assert got.allocated_s == pytest.approx(247.31, abs=0.01) and got.goodput_pct == pytest.approx(62.4, abs=0.1)


def test_a_silent_node_s_silence_is_lost_to_detection_not_to_redone_steps() -> None:
    """Step 20 at t=20, the node frozen at 21, declared silent at 31 (silent_s 10), the step
    relaunched at 32 from the step-20 checkpoint: of the 12 s after step 20, 10 s went to detection."""
    events = [
        start(0, 0),
        ckpt(20.1, 20, "periodic"),
        ev("silent", 31, job_id="7", restart=0, nodes=["node2"], ranks=[1], silent_s=10.0, timeout_s=10.0),
        ev("failure", 32, job_id="7", restart=0, cause="node_failure", nodes=["node2"], detected_by="heartbeat"),
        Relaunch(time=32, job_id="7", restart=0, cause="node_failure", failed=["node2"]),
        start(36, 20),
        ev("finish", 46, step=30),
    ]
    figures = goodput(events, [m(20, 20), m(22, 22), m(30, 46)])
    first = figures.lives[0]
    assert (first.detection_s, round(first.redone_s, 6)) == (10.0, 2.0)
    assert figures.detection_s == 10.0
