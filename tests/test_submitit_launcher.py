"""hpctrain under the user's own Hydra launcher, hydra-submitit-launcher: `hpctrain-train
hydra/launcher=submitit_slurm -m ...` queues one Slurm job per point (submitit's array), each point
one DDP world over the job's tasks. One point is preempted by a job of the `urgent` partition
(Slurm's SIGTERM, GraceTime 20 s, PreemptMode=REQUEUE), the other reaches its time limit's warning
(submitit's `--signal=USR2@signal_delay_s`, sent by Slurm itself). Each saves a checkpoint at the
signal's step on every rank, is requeued (by Slurm's preemption; by submitit's own handler for the
time limit), resumes from that step, and ends bit-identical to the same point trained
uninterrupted (hpctrain/process/submitit_task.py says who does what)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmtools import (
    events,
    job_field,
    job_restarts,
    of,
    same_weights,
    start_cluster,
    train_locally,
    wait_finished,
)

pytestmark = pytest.mark.slurm

LRS = ["1e-3", "2e-3"]
# 400 steps: the ranks agree on a stop within about 0.25 s of training (hpctrain/trainer/stop_vote.py),
# which is up to ~100 steps of this small model; the stop must land before the last step.
STEPS = 400
CONFIG = [
    "model=mlp",
    f"trainer.max_steps={STEPS}",
    "trainer.log_every=50",
    "trainer.eval_every=0",
    "trainer.ckpt_every=100",
    "trainer.step_hang_timeout_s=0",  # its ranks are held at a step gate for minutes: no hang
]
TIMEOUT_MIN = 3  # Slurm's time limit of each point's job
SIGNAL_DELAY_S = 60  # submitit's warning before it: Slurm sends it 60 s early at the most
HELD_AT_STEP = 30  # every rank of both points waits there in the first life, until the test lets it go
LAUNCHER = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.nodes=1",
    "hydra.launcher.tasks_per_node=2",  # two ranks a point: the two points run side by side
    "hydra.launcher.cpus_per_task=1",
    f"hydra.launcher.timeout_min={TIMEOUT_MIN}",
    f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}",
    "hydra.launcher.max_num_timeout=2",  # submitit requeues after a time limit only if allowed to
]


def submitit_log(sweep: Path, job_id: str) -> str:
    folder = sweep / ".submitit" / job_id
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("*_log.*")))


def open_gate(gates: Path, point: str, name: str = "trainer.step") -> None:
    (gates / point / f"{name}.open").write_text("")


def preempt(env: dict[str, str], job: str) -> None:
    """An urgent job wanting the job's node: Slurm sends the job's tasks SIGTERM (GraceTime 20 s)."""
    wait_until(f"job {job} on a node", lambda: job_field(env, job, "NodeList") not in (None, "(null)"), 60)
    node = job_field(env, job, "NodeList")
    subprocess.run(
        ["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-N", "1", "-w", str(node)]
        + ["-o", "/dev/null", "--wrap", "sleep 2"],
        env=env,
        check=True,
        capture_output=True,
    )
    wait_until(f"job {job} preempted", lambda: job_field(env, job, "PreemptTime") not in (None, "None"), 60)
    time.sleep(1)  # the SIGTERM reached every task


def submitit_jobs(sweep: Path) -> list[str]:
    """The job ids submitit has made folders for in the sweep's .submitit/. The folder also holds
    `<uuid>.pkl` files, written first, whose hex name may begin with a digit too."""
    folder = sweep / ".submitit"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.replace("_", "").isdigit())


def wait_until(what: str, check, timeout_s: float, story=lambda: "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}\n{story()}")
        time.sleep(0.5)


def test_a_preempted_point_and_a_timed_out_point_resume_exactly_under_submitit(tmp_path: Path) -> None:
    env = start_cluster()
    sweep, gates = tmp_path / "sweep", tmp_path / "gates"
    held = {  # the launcher's environment, which sbatch passes to the jobs; not the references'
        **env,
        "HPCTRAIN_FAULT_POINTS": f"trainer.step=gate:600@{HELD_AT_STEP}",
        "HPCTRAIN_FAULT_GATES": f"{gates}/$SLURM_ARRAY_TASK_ID",  # one folder per point
    }
    command = [sys.executable, "-m", "hpctrain.cli.train", *LAUNCHER, "-m", f"hydra.sweep.dir={sweep}"]
    command += [*CONFIG, f"optim.lr={','.join(LRS)}"]
    launcher_log = tmp_path / "launcher.log"
    jobs: dict[str, str] = {}
    with launcher_log.open("w") as out:
        # The login-node side: submitit's launcher waits for every point's result.
        launcher = subprocess.Popen(command, env=held, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_until("submitit queued both points", lambda: len(list((sweep / ".submitit").glob("*_[01]"))) == 2, 120)
        jobs.update({p.name.rsplit("_", 1)[1]: p.name for p in (sweep / ".submitit").glob("*_[01]")})
        preempted, timed_out = jobs["0"], jobs["1"]
        for point, job in jobs.items():
            wait_until(
                f"point {point} held at step {HELD_AT_STEP}",
                lambda point=point: (gates / point / "trainer.step.reached").exists(),
                180,
                lambda job=job: submitit_log(sweep, job),
            )
        started = time.monotonic()  # the points started a few seconds before they reached the gate
        preempt(env, preempted)  # point 0 alone; then let its ranks go (the grace is 20 s)
        open_gate(gates, "0")
        # Point 1 goes on when Slurm has sent the time-limit warning: at the latest when the
        # limit is SIGNAL_DELAY_S away (Slurm may send it up to 60 s earlier).
        time.sleep(max(0.0, TIMEOUT_MIN * 60 - SIGNAL_DELAY_S + 5 - (time.monotonic() - started)))
        open_gate(gates, "1")
        for job in jobs.values():
            state = wait_finished(env, job, timeout_s=600, lift_holds=True)
            assert state == "COMPLETED", submitit_log(sweep, job)
        assert launcher.wait(timeout=300) == 0, launcher_log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if jobs:  # whatever a failed test left queued or running
            subprocess.run(["scancel", *jobs.values()], env=env, capture_output=True)

    for point, reason in (("0", "preempt"), ("1", "timelimit")):
        run_dir, job = sweep / point, jobs[point]
        # The signal's step saved on every rank (one forced checkpoint, journaled once), and the
        # next life of the same job resumed from that very step.
        (stop,) = of("stop", run_dir)
        saved = [e for e in of("checkpoint", run_dir) if e["reason"] == reason]
        assert stop["reason"] == reason and [e["step"] for e in saved] == [stop["step"]], events(run_dir)
        assert HELD_AT_STEP <= stop["step"] < STEPS
        starts = of("start", run_dir)
        assert [s["restart"] for s in starts] == [0, 1] and {s["job_id"] for s in starts} == {job}
        assert starts[1]["resumed_from_step"] == stop["step"] and starts[1]["world_size"] == 2
        assert [e["step"] for e in of("finish", run_dir)] == [STEPS]
        assert job_restarts(env, job) == 1
    # Who requeued: Slurm for the preemption; submitit's own handler for the time limit.
    # submitit logs "Requeued job ..." only after `scontrol requeue` returns, and Slurm may end the
    # step (and that logging process) first; then Slurm's own line for the step says who ended it.
    log = submitit_log(sweep, timed_out)
    requeued_by_submitit = f"Requeued job {timed_out} (1 remaining timeouts)" in log
    step_ended_by_requeue = re.search(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE \*\*\*", log)
    assert "this job is timed-out" in log and (requeued_by_submitit or step_ended_by_requeue), log
    assert "DUE TO TIME LIMIT" not in log, log
    assert "Requeued job" not in submitit_log(sweep, preempted)
    # Every point bit-identical to the same point trained on 2 local processes without a stop.
    for point, lr in enumerate(LRS):
        reference = tmp_path / f"reference-{point}"
        train_locally(env, reference, *CONFIG, f"optim.lr={lr}", "trainer.nprocs=2")
        assert same_weights(sweep / str(point), reference), f"point {point} differs from its uninterrupted run"
    # submitit's own result for each point: the task function's, not an error.
    for job in jobs.values():
        assert (sweep / ".submitit" / job / f"{job}_0_result.pkl").exists()


def test_a_point_preempted_while_its_tasks_start_loses_nothing(tmp_path: Path) -> None:
    """Slurm's SIGTERM while the tasks still start (Hydra composed, torch not imported, hpctrain's
    handlers not in): submitit alone would ignore it and the life would train on until Slurm's
    SIGKILL. hpctrain holds it from the task function's first line: the tasks leave before the
    rendezvous with a `stop` record, wait for Slurm, and the next life trains the whole run."""
    env = start_cluster()
    sweep, gates = tmp_path / "sweep", tmp_path / "gates"
    held = {
        **env,
        "HPCTRAIN_FAULT_POINTS": "train.before_launch=gate:600",
        "HPCTRAIN_FAULT_GATES": f"{gates}/0",  # one point: submitit queues a plain job, no array
    }
    command = [sys.executable, "-m", "hpctrain.cli.train", *LAUNCHER, "-m", f"hydra.sweep.dir={sweep}"]
    command += [*CONFIG, f"optim.lr={LRS[0]}"]
    launcher_log = tmp_path / "launcher.log"
    job = ""
    with launcher_log.open("w") as out:
        launcher = subprocess.Popen(command, env=held, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_until("submitit queued the point", lambda: bool(submitit_jobs(sweep)), 120)
        (job,) = submitit_jobs(sweep)
        wait_until(
            "the tasks held before they train",
            lambda: (gates / "0" / "train.before_launch.reached").exists(),
            180,
            lambda: submitit_log(sweep, job),
        )
        preempt(env, job)
        open_gate(gates, "0", "train.before_launch")
        assert wait_finished(env, job, timeout_s=600, lift_holds=True) == "COMPLETED", submitit_log(sweep, job)
        assert launcher.wait(timeout=300) == 0, launcher_log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if job:
            subprocess.run(["scancel", job], env=env, capture_output=True)
    run_dir = sweep / "0"
    # The first life trained nothing and said why (each rank that saw the signal before the
    # rendezvous says it: Slurm signals both at once); the second trained the whole run.
    stops = [(e["reason"], e["step"], e["deadline_s"], e["restart"]) for e in of("stop", run_dir)]
    assert set(stops) == {("preempt", 0, 0.0, 0)} and 1 <= len(stops) <= 2, events(run_dir)
    assert [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(1, 0)], events(run_dir)
    assert [e["step"] for e in of("finish", run_dir)] == [STEPS] and job_restarts(env, job) == 1
    reference = tmp_path / "reference"
    train_locally(env, reference, *CONFIG, f"optim.lr={LRS[0]}", "trainer.nprocs=2")
    assert same_weights(run_dir, reference)
