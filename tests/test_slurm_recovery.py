"""Never lose training, on a real Slurm cluster: preemption, time limit, node failure, hot
spares and restart budgets. Each run ends with weights bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers.paced import DEFAULT_STEP_PAUSE_S, PACED, PAUSE_ENV
from helpers.relaunch_breakdown import breakdown, told
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    events,
    job_field,
    job_output,
    job_restarts,
    lift_requeue_hold,
    node_state,
    of,
    preempt_everything,
    same_weights,
    signal_batch,
    start_cluster,
    submit,
    train_locally,
    wait_finished,
    wait_for_output,
    wait_for_state,
    wait_for_step,
    with_test_helpers,
)

pytestmark = pytest.mark.slurm

# Long enough to be interrupted mid-run; digits has 22 steps an epoch at 2 x 32, so any
# interruption point is mid-epoch or close to it.
RUN = [*PACED, "trainer.log_every=5", "trainer.eval_every=0", "trainer.ckpt_every=20"]
SETUP_BEGINS = "hpctrain-test: setup begins"


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    # The small paced model (helpers.paced, in every config here): its steps take about as long
    # as the default ConvNet's, at a quarter of the CPU the suite shares.
    env = start_cluster()
    return {**env, "PYTHONPATH": with_test_helpers(env), PAUSE_ENV: DEFAULT_STEP_PAUSE_S}


def test_preemption_saves_at_the_signal_step_and_resumes_exactly(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "preempted"
    config = [*RUN, "trainer.max_steps=900", "slurm.nodes=2", "slurm.ntasks_per_node=1"]
    (job_id,), _ = submit(slurm_env, run_dir, *config)
    wait_for_step(run_dir, 60)
    # A job in the high-priority partition that needs every node preempts ours.
    urgent = preempt_everything(slurm_env)
    lift_requeue_hold(slurm_env, job_id)
    assert wait_finished(slurm_env, urgent) == "COMPLETED"
    assert wait_finished(slurm_env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
    saved = [e for e in of("checkpoint", run_dir) if e["reason"] == "preempt"]
    assert len(saved) == 1, events(run_dir)
    starts = of("start", run_dir)
    assert [s["restart"] for s in starts] == [0, 1]
    # Zero lost steps: the second life starts at exactly the step the signal stopped.
    assert starts[1]["resumed_from_step"] == saved[0]["step"] > 60
    assert [e["cause"] for e in of("requeue", run_dir)] == ["preempt"]
    # The ranks' agreement was journaled before that save, by the life it stopped.
    stops = [(e["step"], e["reason"], e["job_id"], e["restart"]) for e in of("stop", run_dir)]
    assert stops == [(saved[0]["step"], "preempt", job_id, 0)], events(run_dir)
    reference = tmp_path / "reference"
    train_locally(slurm_env, reference, *config, "trainer.nprocs=2")
    assert same_weights(run_dir, reference)


def test_node_failure_requeues_without_the_node(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "node-failure"
    config = [*RUN, "trainer.max_steps=600", "slurm.nodes=2", "slurm.ntasks_per_node=1"]
    (job_id,), _ = submit(slurm_env, run_dir, *config)
    wait_for_step(run_dir, 50)
    first = of("start", run_dir)[0]["nodes"]
    victim = first[1]  # not the batch node: the batch script survives and decides
    node_state(slurm_env, victim, "down")
    try:
        wait_for_state(slurm_env, job_id, {"PENDING"}, 120)
        # The exclusion lands a moment after the requeue (the same scontrol process).
        deadline = time.monotonic() + 10
        while victim not in (job_field(slurm_env, job_id, "ExcNodeList") or "") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert victim in (job_field(slurm_env, job_id, "ExcNodeList") or ""), job_output(run_dir)
        lift_requeue_hold(slurm_env, job_id)
        assert wait_finished(slurm_env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
    finally:
        node_state(slurm_env, victim, "resume")
    failures = [e for e in of("failure", run_dir) if e["cause"] == "node_failure"]
    assert failures and failures[0]["nodes"] == [victim]
    starts = of("start", run_dir)
    assert len(starts) == 2 and victim not in starts[1]["nodes"]
    # Resumed from the newest complete checkpoint (helpers/resumes.py): a periodic one (40 when
    # its write had ended, 20 when not), or a save the SIGTERM forced if every rank got it and it
    # ended before the SIGKILL; never an older one.
    assert starts[1]["resumed_from_step"] >= newest_checkpoint_before(events(run_dir), 1), events(run_dir)
    reference = tmp_path / "reference"
    train_locally(slurm_env, reference, *config, "trainer.nprocs=2")
    assert same_weights(run_dir, reference)


def test_hot_spare_relaunches_without_requeue(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "spare"
    config = [*RUN, "trainer.max_steps=600", "slurm.nodes=2", "slurm.ntasks_per_node=1", "slurm.spare_nodes=1"]
    (job_id,), _ = submit(slurm_env, run_dir, *config, "slurm.warm_standby=true")
    wait_for_step(run_dir, 50)
    wait_for_standbys(run_dir, job_id, 3)
    victim = of("start", run_dir)[0]["nodes"][1]
    failed_at = time.time()
    node_state(slurm_env, victim, "down")
    try:
        assert wait_finished(slurm_env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
    finally:
        node_state(slurm_env, victim, "resume")
    assert job_restarts(slurm_env, job_id) == 0  # never requeued
    relaunches = of("relaunch", run_dir)
    assert len(relaunches) == 1 and relaunches[0]["failed"] == [victim], events(run_dir)
    assert of("requeue", run_dir) == []
    starts = of("start", run_dir)
    assert len(starts) == 2 and victim not in starts[1]["nodes"] and len(starts[1]["nodes"]) == 2
    # Seconds from the node failure to training again (the relaunched step's start event): about
    # 10 s on a quiet machine. What a spare saves is a requeue's wait, whose BeginTime hold alone
    # is about 120 s: under that, whatever the load (Restarts 0 above says no requeue came).
    print(f"hot spare: {starts[1]['time'] - failed_at:.1f} s from node failure to the relaunched step")
    print(f"hot spare, the relaunch piece by piece: {told(breakdown(run_dir, failed_at))}")
    assert starts[1]["time"] - failed_at < 120
    # Handed to the warm standbys (hpctrain.process.standby): no import of torch in the relaunched tasks,
    # which took 2 s and more here (5-10 s loaded); what is left is the handoff and the fork.
    assert starts[1]["startup"]["imports_s"] < 1.0, starts[1]
    assert "starting cold" not in job_output(run_dir)
    reference = tmp_path / "reference"
    train_locally(slurm_env, reference, *config, "trainer.nprocs=2")
    assert same_weights(run_dir, reference)


def wait_for_standbys(run_dir: Path, job_id: str, nodes: int, timeout_s: float = 120) -> None:
    """Until the job's output says its NODES warm standbys are ready (they import once the life
    trains: seconds; a relaunch before that starts cold, which other tests cover)."""
    deadline = time.monotonic() + timeout_s
    output = run_dir / f"slurm-{job_id}.out"
    while (ready := output.read_text(errors="replace").count(": ready\n") if output.exists() else 0) < nodes:
        assert time.monotonic() < deadline, f"{ready} of {nodes} standbys ready after {timeout_s} s"
        time.sleep(0.2)


def test_restart_budget_stops_a_job_that_always_fails(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "always-fails"
    # A loss that cannot take the model's output crashes at every start: one crash restart is
    # allowed (trained again in the job at once), then stop. (A bad model argument is a user's
    # mistake: it stops at once, no restart.)
    (job_id,), _ = submit(
        slurm_env, run_dir, "trainer.max_steps=20", "slurm.restart_budget.crash=1", "loss._target_=torch.nn.MSELoss"
    )
    # Waiting for PENDING would catch the job before its first start; lift the requeue's hold.
    assert wait_finished(slurm_env, job_id, timeout_s=300, lift_holds=True) == "FAILED", job_output(run_dir)
    crashes = [e for e in of("failure", run_dir) if e["cause"] == "crash"]
    assert len(crashes) == 2
    assert [e["cause"] for e in of("relaunch", run_dir)] == ["crash"] and of("requeue", run_dir) == []
    spent = [e for e in of("failure", run_dir) if e["cause"] == "budget"]
    assert spent and "crash" in spent[0]["reason"]
    wait_for_state(slurm_env, job_id, {"FAILED"}, 5)


def test_scancel_saves_and_stops_without_requeue(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "cancelled"
    config = [*RUN, "trainer.max_steps=5000", "slurm.nodes=2", "slurm.ntasks_per_node=1"]
    (job_id,), _ = submit(slurm_env, run_dir, *config)
    wait_for_step(run_dir, 40)
    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    assert wait_finished(slurm_env, job_id, timeout_s=120) == "CANCELLED"
    time.sleep(2)  # the last journal lines of the batch shell
    saved = [e for e in of("checkpoint", run_dir) if e["reason"] == "preempt"]
    assert len(saved) == 1 and saved[0]["step"] >= 40, events(run_dir)
    assert of("requeue", run_dir) == [] and job_restarts(slurm_env, job_id) == 0
    assert of("finish", run_dir) == []


def test_torn_newest_checkpoint_falls_back_and_stays_exact(slurm_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "torn"
    config = [*RUN, "trainer.max_steps=600", "slurm.nodes=2", "slurm.ntasks_per_node=1"]
    (job_id,), _ = submit(slurm_env, run_dir, *config)
    wait_for_step(run_dir, 70)
    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    assert wait_finished(slurm_env, job_id, timeout_s=120) == "CANCELLED"
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    newest, previous = checkpoints[-1], checkpoints[-2]
    with open(newest, "r+b") as file:  # a write cut short by a dying node
        file.truncate(newest.stat().st_size // 2)
    # The rendered script runs again by hand, in the same run dir.
    again = subprocess.run(
        ["sbatch", "--parsable", str(run_dir / "job.sbatch")], env=slurm_env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert wait_finished(slurm_env, again, timeout_s=300) == "COMPLETED", job_output(run_dir)
    resumed = of("start", run_dir)[-1]["resumed_from_step"]
    assert resumed == int(previous.stem.split("_")[1])
    assert "not usable" in job_output(run_dir)
    reference = tmp_path / "reference"
    train_locally(slurm_env, reference, *config, "trainer.nprocs=2")
    assert same_weights(run_dir, reference)


def test_recovery_cases_side_by_side(slurm_env, tmp_path: Path) -> None:
    """Four faults at once, each on one node: the time-limit signal before srun starts, a
    requeue Slurm refuses, a hang, and a crash with the user's slurm.exclude."""
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    # Crash budget 2: the first crash is trained again in the job, the second (right after that
    # relaunch) requeued, the third stops the run.
    crash = ["trainer.max_steps=20", "loss._target_=torch.nn.MSELoss", "slurm.restart_budget.crash=2"]
    configs = {
        # A job Slurm will not requeue (a site's policy, here --no-requeue): the run dir is submitted again.
        "refused": [*crash, "slurm.extra=['--no-requeue']"],
        "hang": [
            "trainer.max_steps=50",
            "model._target_=helpers.stuck.StuckAfter",
            "trainer.hang_timeout_s=20",
            "trainer.eval_every=0",
            "slurm.restart_budget.hang=0",
        ],
        "exclude": [*crash, "slurm.exclude=node3"],
        # Last: the warning comes while a setup line runs: the shell survives (set -u), launches
        # nothing, requeues. The setup's first line tells the test the shell has set its traps;
        # the sleep is the test's window to see it (30 s ran out once: the job started while its
        # own hpctrain-submit still queued the guardian on a loaded slurmctld).
        "early_warning": [*RUN, "trainer.max_steps=40", f"slurm.setup=['echo {SETUP_BEGINS}','sleep 75']"],
    }
    jobs = {name: submit(env, tmp_path / name, *config)[0][0] for name, config in configs.items()}
    runs = {name: tmp_path / name for name in configs}
    # Asked now, while slurmctld still holds the job: by the end of this long test MinJobAge
    # (300 s) may have dropped its record (scontrol then says nothing of it).
    assert job_field(slurm_env, jobs["refused"], "Requeue") == "0"

    # The warning only once the batch shell has set its traps: the job is RUNNING before its shell
    # runs (slurmd still starting it), and a USR2 then kills the shell, as bash's default does
    # (sent as the job turned RUNNING, it ended 2 of 6 jobs FAILED, WTERMSIG 12, no output; a
    # fixed 2 s wait is no bound under load). The traps are the script's first lines, before the
    # setup's: its echo says they are set.
    wait_for_output(runs["early_warning"], SETUP_BEGINS, timeout_s=300)
    assert "hpctrain: job" not in job_output(runs["early_warning"]), "the setup line ended before the signal"
    signal_batch(slurm_env, jobs["early_warning"])

    # The user's exclusion survives the requeue's ExcNodeList (it used to be replaced).
    wait_for_state(slurm_env, jobs["exclude"], {"PENDING"}, 300)
    assert job_field(slurm_env, jobs["exclude"], "ExcNodeList") == "node3", job_output(runs["exclude"])
    assert [e["excluded"] for e in of("requeue", runs["exclude"])] == [["node3"]]

    # Its requeue's hold lifted two seconds on, not at once: slurmd refuses a start in the very
    # second of the requeue ("Killing non-startable batch job: Job credential revoked": FAILED,
    # no second life, in 1 of 3 runs under load), since it compares the new credential's time
    # with the revocation's in whole seconds. Slurm's own ~120 s hold is there for that.
    warned = jobs["early_warning"]
    wait_for_state(slurm_env, warned, {"PENDING"}, 300)
    subprocess.run(["scontrol", "update", f"jobid={warned}", "StartTime=now+2"], env=slurm_env, check=True)
    assert wait_finished(slurm_env, warned, 600) == "COMPLETED", job_output(runs["early_warning"])
    assert [e["cause"] for e in of("requeue", runs["early_warning"])] == ["timelimit"]
    assert [s["restart"] for s in of("start", runs["early_warning"])] == [1]  # nothing launched in life 0
    assert "unbound variable" not in job_output(runs["early_warning"])

    # Refused requeue: never COMPLETED; the run went on in a new job that spent the crash budget.
    assert wait_finished(slurm_env, jobs["refused"], 300) == "FAILED", job_output(runs["refused"])
    refused = [e for e in of("failure", runs["refused"]) if e["cause"] == "requeue_refused"]
    assert len(refused) == 1 and refused[0]["action"] == "resubmit", events(runs["refused"])
    assert "disabled" in refused[0]["reason"]  # scontrol's own words
    again = refused[0]["new_job_id"]
    assert json.loads((runs["refused"] / "submission.json").read_text())["job_id"] == again
    assert wait_finished(slurm_env, again, 300) == "FAILED", job_output(runs["refused"])
    spent = [e for e in of("failure", runs["refused"]) if e["cause"] == "budget"]
    assert len(spent) == 1 and spent[0]["job_id"] == again and "crash" in spent[0]["reason"]

    # A hang is counted as a hang, whatever exit code srun passed on.
    assert wait_finished(slurm_env, jobs["hang"], 300) == "FAILED", job_output(runs["hang"])
    causes = [e["cause"] for e in of("failure", runs["hang"])]
    assert causes[0] == "hang" and causes[-1] == "budget" and "crash" not in causes, events(runs["hang"])
    assert "hang" in of("failure", runs["hang"])[-1]["reason"]
    # Its hang report, in the run dir: the rank's collectives section, then its stack, stuck in
    # the model's forward.
    hung = of("failure", runs["hang"])[0]
    report = (runs["hang"] / hung["report"] / "rank-0.txt").read_text()
    assert hung["report"] == f"hangs/{jobs['hang']}.0" and hung["not_reached"] == []
    assert "last collectives (torch's Flight Recorder), newest last:" in report, report
    assert "helpers/stuck.py" in report and "in forward" in report, report

    assert wait_finished(slurm_env, jobs["exclude"], 300, lift_holds=True) == "FAILED", job_output(runs["exclude"])
    assert all("node3" not in s["nodes"] for s in of("start", runs["exclude"]))
