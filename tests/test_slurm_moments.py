"""Faults at the batch script's worst moments, on the real dev cluster, side by side.

Each cell of the phase-by-fault matrix that needs Slurm and a batch script: a one-node job whose
fault points (hpctrain.faults, armed through the submitting environment, which sbatch passes on)
put the fault at an exact moment of its first life. Every run but the scancelled one must end
COMPLETED without anyone resubmitting it, resume from its newest complete checkpoint, and end bit-identical to an
uninterrupted run of the same config.

- the time limit reached while after-step decides (the warned stop done): Slurm's SIGTERM to the
  shell is the limit's (Reason=TimeLimit), not a cancel; the job ends TIMEOUT and the guardian
  submits it again. Before: recorded as `cancelled`, and the run was over.
- the batch shell killed between the decision to requeue and the asking: the job ends FAILED;
  the guardian submits it again as that requeue, charged once.
- `scontrol requeue` accepted, then the control step killed (ExcNodeList never set), or the
  batch shell killed right after: Slurm requeues the job all the same; one requeue in the journal.
- the time-limit warning while the batch script runs slurm.setup: nothing is launched, the job
  is requeued as a time limit.
- an administrator's `scontrol requeue` while the batch script runs slurm.setup: the shell's
  SIGTERM trap records Slurm's requeue (preempt) at once; before, the next start charged the
  life that wrote nothing to node_failure.
- a scancel once the requeue is decided: the job ends CANCELLED and stays so (Slurm 22.05
  grants the requeue of a job being cancelled; before, it was asked and the job came back).
- the time-limit warning once the requeue is decided: the requeue goes on, asked once; the
  warning changes nothing (no task runs to pass it to).

The three kills are set off by a preemption's SIGTERM at an awkward moment of a task's start
(its stop handlers installed, the process group not joined): the ranks stop after their first
step and save it, and the batch script decides a requeue (preempt). Slurm's requeue hold
(~120 s) is lifted two seconds on (slurmtools.LIFTED_START).
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    Reference,
    cancel_run,
    current_job,
    events,
    job_output,
    job_restarts,
    job_state,
    of,
    run_ends,
    same_weights,
    start_cluster,
    submit,
    wait_at_gate,
    with_test_helpers,
)

from hpctrain import faults

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# A paced ConvNet (at least 100 ms a step in a job): 400 steps outlast the first minute of a
# 1-minute job, whose warning comes at most 30 s after its start (--signal=B:USR2@30).
TRAIN = [
    *PACED,
    "trainer.max_steps=400",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]
PAUSE_S = "0.1"
# A preemption's SIGTERM to the task after its stop handlers, before the process group: it
# stops after its first step, saved, and the batch script decides a requeue (preempt).
PREEMPTED_AT_START = "worker.before_rendezvous=term"
GATE_S = 300  # a bound for a test that never opens the gate; opened within a second
CELLS = {
    "timelimit_during_after_step": (
        ["slurm.time=00:01:00", "slurm.signal_delay_s=30"],
        # Held until the time limit's SIGTERM (87 s into the job on the dev cluster) kills it.
        "control.after_step=sleep:600",
    ),
    "shell_killed_before_requeue": ([], f"{PREEMPTED_AT_START},batch.before_requeue=kill"),
    "control_killed_after_requeue_accepted": ([], f"{PREEMPTED_AT_START},control.requeue_asked=kill"),
    "shell_killed_after_requeue": ([], f"{PREEMPTED_AT_START},batch.after_requeue=kill"),
    "warning_during_setup": ([], "batch.setup=signal:USR2"),
    # Held at slurm.setup (a gate) until the test has requeued it (`scontrol requeue`, as an
    # administrator): a timed wait lost the race on a loaded machine (the requeue came after setup).
    "admin_requeue_during_setup": ([], f"batch.setup=gate:{GATE_S}"),
    # Held at the decision (a gate) until the test has scancelled it: SIGTERM is ignored from the
    # decision on, and the test acts at exactly this moment however loaded the machine is (a
    # timed wait lost the race on a loaded CI machine: the scancel hit the requeued job).
    "scancel_during_requeue": ([], f"{PREEMPTED_AT_START},batch.before_requeue=gate:{GATE_S}"),
    # Held at the decision the same way until the test has sent the warning to the batch shell.
    "warning_during_requeue": ([], f"{PREEMPTED_AT_START},batch.before_requeue=gate:{GATE_S}"),
}
DECIDED = "hpctrain: step ended with 76: requeue"  # 76: the workers saved for a SIGTERM
# A job of a minute, its KillWait, the guardian's start, the new job's training (twice, should
# its own warning come first): generous on a loaded two-core machine.
END_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def requeue_as_an_admin(env: dict[str, str], gates: Path, job_id: str) -> None:
    """`scontrol requeue` while the job's batch script is held in slurm.setup, then let it go."""
    reached, opened = faults.gate_files(gates, "batch.setup")
    wait_at_gate(env, job_id, reached, 180)
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True)
    opened.touch()


def run_to_the_end(env: dict[str, str], run_dir: Path, first_job: str) -> tuple[str, str]:
    """Until the job that carries the run on (the first, or one its guardian submitted) ended;
    requeue holds lifted. Returns (the first job's end state, the last job's end state)."""
    if run_dir.name == "admin_requeue_during_setup":
        requeue_as_an_admin(env, gates_of(run_dir), first_job)
    if run_dir.name in ("scancel_during_requeue", "warning_during_requeue"):
        reached, opened = faults.gate_files(gates_of(run_dir), "batch.before_requeue")
        wait_at_gate(env, first_job, reached, 180)
        assert DECIDED in job_output(run_dir)
        # scancel returns once slurmctld marked the job CANCELLED: the control step, let go now,
        # finds it so with KillWait (5 s here) to spare. The warning: `--signal=B:USR2@N`'s, by hand.
        fault = ["scancel"] if run_dir.name == "scancel_during_requeue" else ["scancel", "--batch", "--signal=USR2"]
        subprocess.run([*fault, first_job], env=env, check=True)
        opened.touch()
    return run_ends(env, run_dir, first_job, END_TIMEOUT_S)


def gates_of(run_dir: Path) -> Path:
    """The folder of a cell's gate files (hpctrain.faults: gate:S)."""
    return run_dir.parent / "gates" / run_dir.name


def test_faults_at_the_batch_scripts_worst_moments_side_by_side(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = tmp_path / "reference"
    trained = Reference(env, reference, TRAIN)
    runs = {name: tmp_path / name for name in CELLS}
    jobs: dict[str, str] = {}
    try:
        with ThreadPoolExecutor(max_workers=len(CELLS)) as pool:  # every cell watched at once
            submitted = {
                name: pool.submit(
                    submit,
                    {**env, PAUSE_ENV: PAUSE_S, faults.ENV: arming, faults.GATES_ENV: str(gates_of(runs[name]))},
                    runs[name],
                    *TRAIN,
                    *config,
                )
                for name, (config, arming) in CELLS.items()
            }
            jobs = {name: future.result()[0][0] for name, future in submitted.items()}
            ends = {name: pool.submit(run_to_the_end, slurm_env, runs[name], jobs[name]) for name in CELLS}
            states = {name: future.result() for name, future in ends.items()}
    finally:
        for run_dir in runs.values():
            cancel_run(slurm_env, run_dir)
    trained.trained()

    # scancel while the batch script asked for its requeue: the user's word stands. Before, the
    # requeue was asked all the same, Slurm granted it (Restarts=1) and the cancelled job trained on.
    cancelled = runs.pop("scancel_during_requeue")
    assert states["scancel_during_requeue"] == ("CANCELLED", "CANCELLED"), job_output(cancelled)
    assert job_restarts(slurm_env, jobs["scancel_during_requeue"]) == 0, job_output(cancelled)
    assert current_job(cancelled) == jobs["scancel_during_requeue"], events(cancelled)
    assert len(of("cancelled", cancelled)) == 1 and of("finish", cancelled) == [], events(cancelled)
    assert "the job was cancelled while its step ended: no requeue" in job_output(cancelled)

    for name, run_dir in runs.items():
        journal = events(run_dir)
        assert states[name][1] == "COMPLETED", f"{name}: {states[name]}\n{journal}\n{job_output(run_dir)}"
        assert same_weights(run_dir, reference), name
        assert of("cancelled", run_dir) == [], f"{name}: {journal}"
        # Every life resumed from the newest checkpoint complete before it (helpers/resumes.py).
        for life, start in enumerate(of("start", run_dir)):
            assert start["resumed_from_step"] >= newest_checkpoint_before(journal, life), f"{name}: {journal}"
        finish = of("finish", run_dir)
        assert len(finish) == 1 and finish[0]["step"] == 400, f"{name}: {journal}"

    # The time limit during after-step: the first job ended TIMEOUT, not cancelled; its guardian
    # submitted the run again, charged to timelimit.
    timed = runs["timelimit_during_after_step"]
    assert states["timelimit_during_after_step"][0] == "TIMEOUT", job_output(timed)
    by_guardian = [(e["event"], e["cause"]) for e in events(timed) if e.get("by") == "guardian"]
    assert by_guardian == [("failure", "timelimit"), ("requeue", "timelimit")], events(timed)
    assert "the time limit ended this job, no cancel" in job_output(timed)

    # The shell killed between the decision and the asking: FAILED, resubmitted as the decided
    # requeue (preempt), which the batch script had charged already: one requeue, not two.
    killed = runs["shell_killed_before_requeue"]
    assert states["shell_killed_before_requeue"][0] == "FAILED", job_output(killed)
    assert [(e["cause"], e.get("by")) for e in of("requeue", killed)] == [("preempt", None)], events(killed)
    resubmitted = [e for e in of("failure", killed) if e.get("by") == "guardian"]
    assert [(e["cause"], e["action"]) for e in resubmitted] == [("preempt", "resubmit")], events(killed)

    # `scontrol requeue` accepted, then the control step or the shell killed: Slurm requeued the
    # job all the same (the same job, its second life), once. The warning to a shell about to ask
    # for its decided requeue: asked all the same, once.
    for name in ("control_killed_after_requeue_accepted", "shell_killed_after_requeue", "warning_during_requeue"):
        run_dir = runs[name]
        assert current_job(run_dir) == jobs[name], f"{name}: resubmitted, not requeued: {events(run_dir)}"
        assert job_restarts(slurm_env, jobs[name]) == 1, job_output(run_dir)
        assert [e["cause"] for e in of("requeue", run_dir)] == ["preempt"], f"{name}: {events(run_dir)}"
        (stop,) = of("stop", run_dir)
        starts = [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)]
        assert (stop["reason"], starts) == ("preempt", [(0, 0), (1, stop["step"])]), f"{name}: {events(run_dir)}"

    # An administrator's requeue during slurm.setup: the shell's trap saw Restarts=1 and recorded
    # it as Slurm's (preempt), so the next start charged no node failure (before: node_failure).
    admin = runs["admin_requeue_during_setup"]
    assert [(e["cause"], e.get("by")) for e in of("requeue", admin)] == [("preempt", "slurm")], events(admin)
    assert of("failure", admin) == [], events(admin)
    assert [s["restart"] for s in of("start", admin)] == [1], events(admin)
    assert current_job(admin) == jobs["admin_requeue_during_setup"]

    # The warning during slurm.setup: nothing launched in the first life, a time-limit requeue.
    warned = runs["warning_during_setup"]
    assert [e["cause"] for e in of("requeue", warned)] == ["timelimit"], events(warned)
    assert [s["restart"] for s in of("start", warned)] == [1], events(warned)
    assert job_state(slurm_env, jobs["warning_during_setup"]) == "COMPLETED"
