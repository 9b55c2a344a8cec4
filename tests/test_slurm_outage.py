"""Slurm away for 30 s at the worst moments: slurmctld stopped while a job asks for its own requeue,
while another launches its first step, while lives start, and while a step is judged.

A one-node job gets the time-limit warning at step 40, saves and stops; its batch script decides
the requeue and waits at a fault point (`batch.before_requeue=sleep:5`) while the test stops
slurmctld (SIGSTOP: alive, silent, as during a restart or a network blip) for 30 s. The control
step's `scontrol requeue` gets no answer; it looks again (`scontrol show job`) and asks again
within REQUEUE_WAIT_S (60 s), and never submits a second job while the first may still come back.
Once slurmctld answers, the job is requeued, resumes from its time-limit save and ends
bit-identical to an uninterrupted run, with one requeue and no failure in its journal. Beside it, a
second job held just before its first srun (`batch.before_launch`) is let go into the outage:
srun gives up on slurmctld ("Unable to confirm allocation") without starting a task, and the step
is launched again in the job once Slurm answers (`relaunch`, cause `launch`, charged to no budget;
before, a crash, whose budget is 1), one life, bit-identical.

The same 30 s (longer, until the cells that must save in it did) while lives start, while a
forced save is written, while a step is judged and while a job waits out its requeue hold, seven
jobs side by side, each held while slurmctld is stopped, then let go into the outage: in
`slurm.setup`, before `control begin`, before the worker's imports, in a second life's resume (its
newest checkpoint read, not yet applied), in a warned step's time-limit save (held half-written),
in `after-step` judging a warned step, and PENDING in the requeue hold after a first life that
stopped itself. None fails: the three first starts train
on (one life, no requeue), the resume trains on in its second life while Slurm is still away, the
save is written while Slurm is away, the warned steps' facts fall back and their requeues wait for
Slurm, and the held job starts once Slurm is back; every job ends COMPLETED, bit-identical,
without the guardian.

In a module of its own: the stopped controller is this worker's cluster's, and nothing else of
this worker runs on it meanwhile (pytest-xdist hands out whole modules).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import gated
from helpers.paced import PACED, PAUSE_ENV
from slurmtools import (
    CLUSTER_DIR,
    ENDED,
    Reference,
    _controller_pid,
    cancel_run,
    devcluster,
    events,
    job_field,
    job_output,
    job_restarts,
    job_state,
    of,
    run_ends,
    same_weights,
    start_cluster,
    submit,
    wait_at_gate,
    wait_finished,
    wait_for_output,
    wait_for_step,
    with_test_helpers,
)

from hpctrain import faults

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    *PACED,
    "trainer.max_steps=200",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
    "trainer.step_hang_timeout_s=0",  # its ranks are held at a step gate for minutes: no hang
]
OUTAGE_S = 30.0
OUTAGE_MAX_S = 150.0  # the cells' outage, when its cells are slow to save in it
# The requeue waits this long at its fault point: the test stops slurmctld meanwhile.
# The rank waits at step 40 (a gate) until the test has sent the warning: with a timed wait the
# warning came after the job had finished, twice under the suite's load (its submit returned late).
HELD_AT_STEP = 40
ARMING = f"batch.before_requeue=sleep:5,trainer.step=gate:600@{HELD_AT_STEP}"
DECIDED = "hpctrain: step ended with 75: requeue"  # 75: the workers saved for the time limit


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def controller_pid() -> int:
    module = devcluster()
    pid = _controller_pid(module, module.Paths(Path(CLUSTER_DIR).absolute()))
    assert pid is not None, "the dev cluster's slurmctld is not running"
    return pid


def test_slurmctld_stopped_for_30_s_during_the_requeue(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = tmp_path / "reference"
    trained = Reference(env, reference, TRAIN)
    run_dir = tmp_path / "run"
    gates = tmp_path / "gates"
    (job,), _ = submit({**env, PAUSE_ENV: "0.1", faults.ENV: ARMING, faults.GATES_ENV: str(gates)}, run_dir, *TRAIN)
    # Beside it, a job held just before its first srun, let go into the same outage: srun gives up
    # on the stopped slurmctld without starting a task.
    launch_dir, launch_gates = tmp_path / "launch", tmp_path / "launch-gates"
    armed = {**env, PAUSE_ENV: "0.05", faults.ENV: "batch.before_launch=gate:600", faults.GATES_ENV: str(launch_gates)}
    (launch_job,), _ = submit(armed, launch_dir, *TRAIN)
    controller = controller_pid()
    try:
        reached, opened = faults.gate_files(gates, "trainer.step")
        wait_at_gate(slurm_env, job, reached, 300)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], env=slurm_env, check=True)
        opened.touch()
        wait_for_output(run_dir, DECIDED, 120)
        launch_reached, launch_opened = faults.gate_files(launch_gates, "batch.before_launch")
        wait_at_gate(slurm_env, launch_job, launch_reached, 300)
        os.kill(controller, signal.SIGSTOP)
        stopped_at = time.time()
        launch_opened.touch()
        time.sleep(OUTAGE_S)
    finally:
        os.kill(controller, signal.SIGCONT)
    back_at = time.time()
    try:
        state = wait_finished(slurm_env, job, timeout_s=600, lift_holds=True)
        launch_state = wait_finished(slurm_env, launch_job, timeout_s=600, lift_holds=True)
    finally:
        subprocess.run(["scancel", job, launch_job], env=slurm_env, capture_output=True)
    trained.trained()

    # The launch lost to the outage: srun's own words, then the step launched again in the job,
    # charged to no budget (before: a crash, whose budget is 1).
    launched = events(launch_dir)
    told = f"{launched}\n{job_output(launch_dir)}"
    assert launch_state == "COMPLETED", told
    assert "srun: error: Unable to confirm allocation" in job_output(launch_dir), told
    assert [(e["event"], e.get("cause")) for e in launched if e["event"] in ("relaunch", "requeue", "failure")] == [
        ("relaunch", "launch")
    ], told
    assert [(s["restart"], s["resumed_from_step"]) for s in of("start", launch_dir)] == [(0, 0)], told
    assert same_weights(launch_dir, reference)
    (again,) = of("relaunch", launch_dir)
    print(f"a launch lost to the outage: launched again {again['time'] - back_at:.1f} s after slurmctld was back")

    journal = events(run_dir)
    assert state == "COMPLETED", f"{journal}\n{job_output(run_dir)}"
    # One job all along, requeued once, as the time limit; nothing failed or was resubmitted.
    assert [(e["event"], e["cause"]) for e in journal if e["event"] in ("requeue", "failure")] == [
        ("requeue", "timelimit")
    ], journal
    assert not list(run_dir.glob("guardian-*.out")), "the guardian ran: the job ended on the way"
    # Asked during the outage, unanswered, then found done (or asked again) once Slurm was back.
    assert "hpctrain: scontrol requeue got no answer" in job_output(run_dir), job_output(run_dir)
    saved = [e["step"] for e in journal if e["event"] == "checkpoint" and e["reason"] == "timelimit"]
    starts = [e for e in journal if e["event"] == "start"]
    assert len(saved) == 1 and [(s["restart"], s["resumed_from_step"]) for s in starts] == [(0, 0), (1, saved[0])]
    # The second life began only once slurmctld answered again.
    assert starts[1]["time"] > back_at, (stopped_at, back_at, starts[1]["time"])
    assert same_weights(run_dir, reference)
    print(f"slurmctld stopped {back_at - stopped_at:.1f} s; training again {starts[1]['time'] - back_at:.1f} s after")


# Slurm away while a life starts, while a forced save is written, while the batch script judges an
# ended step and while a job waits out its requeue hold: each job held (at a gate, or PENDING),
# slurmctld stopped, the gates opened, slurmctld let go 30 s later. Cell -> (the point held, its
# arming). A time-limit warning at step 40 first for `forced` (its save held half-written) and
# `after_step`; the resume and the hold cells' first lives stop themselves from step 20 (a SIGTERM
# to the task: saved, requeued by the batch script).
GATE_S = 300
HOLD = ""  # no fault point: the job is held by Slurm's requeue hold (PENDING, Reason=BeginTime)
OUTAGE_CELLS = {
    "setup": ("batch.setup", f"batch.setup=gate:{GATE_S}"),
    "begin": ("batch.before_begin", f"batch.before_begin=gate:{GATE_S}"),
    "imports": ("worker.before_imports", f"worker.before_imports=gate:{GATE_S}"),
    "resume": ("trainer.resume_loading", gated.at_resume(f"gate:{GATE_S}")),
    "after_step": ("control.after_step", f"control.after_step=gate:{GATE_S}"),
    "hold": (HOLD, f"trainer.step=term@{gated.FIRST_LIFE_STOP}"),
    "forced": ("checkpoint.forced_in_flight", f"checkpoint.forced_in_flight=gate:{GATE_S}"),
}
WARNED = ("control.after_step", "checkpoint.forced_in_flight")


def saved_in_the_outage(runs: dict[str, Path]) -> bool:
    """The imports cell wrote its first checkpoint, the resume cell one after its stop."""
    try:
        if not of("checkpoint", runs["imports"]):
            return False
        stops = of("stop", runs["resume"])
        return bool(stops) and any(c["step"] > stops[0]["step"] for c in of("checkpoint", runs["resume"]))
    except (OSError, ValueError):  # a journal not yet there, or a line read as it is written
        return False


def held_at(env: dict[str, str], run_dir: Path, gates: Path, point: str, arming: str, in_hold: threading.Event) -> str:
    """Submit the cell's job and wait until it is held: its job id. The dev cluster's six CPUs hold
    six one-task jobs; the seventh, the forced save's, is submitted once the hold cell's job waits
    PENDING in its hold (its CPU free again), so that it never waits for a CPU a held job keeps."""
    if point == "checkpoint.forced_in_flight":
        assert in_hold.wait(600), "the hold cell's job never reached its requeue hold"
    # A warned cell's job is slower: the warning must land before its 200 steps are done, and a
    # machine loaded by the other workers once let the test thread see step 40 only after the end.
    pause = "0.2" if point in WARNED else "0.05"
    armed = {**env, PAUSE_ENV: pause, faults.ENV: arming, faults.GATES_ENV: str(gates)}
    (job,), _ = submit(armed, run_dir, *TRAIN)
    if point in WARNED:
        wait_for_step(run_dir, 40)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], env=env, check=True)
    if point == HOLD:
        wait_in_requeue_hold(env, job, 600)
        in_hold.set()
    else:
        wait_at_gate(env, job, faults.gate_files(gates, point)[0], 600)
    return job


def wait_in_requeue_hold(env: dict[str, str], job: str, timeout_s: float) -> None:
    """Until the job, requeued once, waits PENDING for its BeginTime (the hold is left in place)."""
    deadline = time.monotonic() + timeout_s
    while not (job_restarts(env, job) == 1 and job_field(env, job, "Reason") == "BeginTime"):
        assert time.monotonic() < deadline, f"job {job} not in its requeue hold within {timeout_s:.0f} s"
        assert job_state(env, job) not in ENDED, f"job {job} ended before its requeue hold"
        time.sleep(0.3)


def test_slurmctld_stopped_for_30_s_as_a_life_starts_and_as_a_step_is_judged(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    trained = Reference(env, tmp_path / "reference", TRAIN)
    runs = {name: tmp_path / name for name in OUTAGE_CELLS}
    gates = {name: tmp_path / "gates" / name for name in OUTAGE_CELLS}
    try:
        with ThreadPoolExecutor(max_workers=len(OUTAGE_CELLS)) as pool:
            in_hold = threading.Event()
            holding = {
                name: pool.submit(held_at, env, runs[name], gates[name], *cell, in_hold)
                for name, cell in OUTAGE_CELLS.items()
            }
            jobs = {name: future.result() for name, future in holding.items()}
            controller = controller_pid()
            os.kill(controller, signal.SIGSTOP)
            stopped_at = time.time()
            try:
                for name, (point, _) in OUTAGE_CELLS.items():
                    if point != HOLD:
                        faults.gate_files(gates[name], point)[1].touch()
                time.sleep(OUTAGE_S)
                # The imports and resume cells must save while Slurm is away: on a loaded machine
                # that took longer than 30 s (a save 3 s after it was back), so the outage lasts
                # until both saved, within a bound.
                deadline = time.monotonic() + OUTAGE_MAX_S - OUTAGE_S
                while not saved_in_the_outage(runs) and time.monotonic() < deadline:
                    time.sleep(0.5)
            finally:
                os.kill(controller, signal.SIGCONT)
            back_at = time.time()
            ending = {name: pool.submit(run_ends, env, runs[name], jobs[name], 600) for name in OUTAGE_CELLS}
            states = {name: future.result() for name, future in ending.items()}
    finally:
        for run_dir in runs.values():
            cancel_run(slurm_env, run_dir)
    trained.trained()

    for name in OUTAGE_CELLS:
        run_dir = runs[name]
        told = f"{name}: {states[name]}\n{events(run_dir)}\n{job_output(run_dir)}"
        # One job all along: nothing failed, nothing was submitted again, bit-identical.
        assert states[name] == ("COMPLETED", "COMPLETED"), told
        assert of("failure", run_dir) == [] and of("cancelled", run_dir) == [], told
        assert not list(run_dir.glob("guardian-*.out")), f"{name}: the guardian ran\n{told}"
        assert [f["step"] for f in of("finish", run_dir)] == [200], told
        assert same_weights(run_dir, tmp_path / "reference"), f"{name}: not bit-identical"
        starts = [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)]
        if name == "imports":
            # Let go into the outage before its imports: it joined the group, trained and wrote
            # its step-50 checkpoint (both renames) while Slurm was still away.
            first_save = of("checkpoint", run_dir)[0]
            assert of("start", run_dir)[0]["time"] < first_save["time"] < back_at, (back_at, told)
        if name in ("resume", "hold"):
            # The first life stopped itself from step 20 and was requeued by its batch script.
            (stop,) = of("stop", run_dir)
            assert stop["reason"] == "preempt" and stop["step"] >= gated.FIRST_LIFE_STOP, told
            assert [(e["cause"], e.get("by")) for e in of("requeue", run_dir)] == [("preempt", None)], told
            assert starts == [(0, 0), (1, stop["step"])], told
            second_start = of("start", run_dir)[1]["time"]
            if name == "resume":
                # Let go into the outage with its checkpoint read: it trained on and wrote its
                # next periodic checkpoint while Slurm was still away.
                later = [c for c in of("checkpoint", run_dir) if c["step"] > stop["step"]]
                assert stopped_at < second_start < later[0]["time"] < back_at, (stopped_at, back_at, told)
            else:
                # PENDING through the outage: its second life began only once Slurm was back.
                assert second_start > back_at, (back_at, told)
            continue
        if name not in ("after_step", "forced"):
            assert of("requeue", run_dir) == [] and starts == [(0, 0)], told
            continue
        # The warned step judged while Slurm was away: its facts fell back, its requeue waited.
        assert [e["cause"] for e in of("requeue", run_dir)] == ["timelimit"], told
        (saved,) = [c for c in of("checkpoint", run_dir) if c["reason"] == "timelimit"]
        assert starts == [(0, 0), (1, saved["step"])], told
        if name == "forced":
            # Its time-limit save, held half-written, let go into the outage: written while Slurm
            # was away (a save never asks Slurm), the step judged and the requeue asked after.
            assert stopped_at < saved["time"] < back_at, (stopped_at, back_at, told)
