"""A lost batch node never ends a run, on a real Slurm cluster.

Under --no-kill Slurm does not requeue a job whose BatchHost is set down: it kills the batch
step and ends the job FAILED, Reason=JobLaunchFailure, Restarts=0
(tests/fixtures/slurm/guardian/batch_host_down.txt). The run's guardian job (queued with
`--dependency=afternotok:<job>`) then submits it again into the same run dir; the new job resumes
from the newest complete checkpoint and ends bit-identical to an uninterrupted run. When the
node's slurmd registers again before the kill reaches it, the job stays RUNNING without its batch
script, and the job's keeper (tests/test_slurm_keeper.py) submits the run again instead: either
way, one new job.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    events,
    job_field,
    job_output,
    job_restarts,
    job_state,
    node_state,
    of,
    point_jobs,
    same_weights,
    start_cluster,
    submit,
    train_locally,
    wait_finished,
    wait_for_step,
)

pytestmark = pytest.mark.slurm

RUN = ["trainer.log_every=5", "trainer.eval_every=0", "trainer.ckpt_every=20", "trainer.max_steps=600"]
# From the node going down to the guardian's new job in submission.json: the job ends at once
# (the node is set down, not silent), the guardian waits for the next scheduling pass and starts
# Python; generous on a loaded two-core machine.
RESUBMIT_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def submission(run_dir: Path) -> dict:
    return json.loads((run_dir / "submission.json").read_text())


def wait_for_resubmission(run_dir: Path, job_id: str) -> str:
    deadline = time.monotonic() + RESUBMIT_TIMEOUT_S
    while time.monotonic() < deadline:
        new_job = submission(run_dir)["job_id"]
        if new_job != job_id:
            return new_job
        time.sleep(0.5)
    guardian = "\n".join(p.read_text() for p in run_dir.glob("guardian-*.out"))
    raise AssertionError(
        f"no resubmission of {job_id} within {RESUBMIT_TIMEOUT_S} s\n{guardian}\n{job_output(run_dir)}"
    )


def lose_the_batch_host(env: dict[str, str], run_dir: Path, *config: str, spare: bool) -> None:
    (job_id,), _ = submit(env, run_dir, *config)
    guardian = submission(run_dir)["guardian_job_id"]
    assert job_field(env, guardian, "Reason") == "Dependency", job_field(env, guardian, "JobState")
    wait_for_step(run_dir, 50)
    batch_host = job_field(env, job_id, "BatchHost")
    assert batch_host
    lost_at = time.time()
    node_state(env, batch_host, "down")
    if spare:
        # A lost node stays away until someone repairs it. This one's slurmd still runs, and
        # ReturnToService=2 takes it back at its next registration, maybe before the check below
        # on a slow machine: drained as well, it takes no job until resumed.
        node_state(env, batch_host, "drain")
    try:
        new_job = wait_for_resubmission(run_dir, job_id)
        if spare:
            keeper = [e for e in events(run_dir) if e["event"] == "requeue" and e.get("by") == "keeper"]
            if keeper:
                # Slurm kept the job RUNNING without its batch script (the loaded machine's race
                # below), and its keeper, seeing the lost node drained, submitted the run again
                # without it and without the spare it cannot have now (decide_keeper).
                assert keeper[0]["nodes"] == 2 and keeper[0]["excluded"] == [batch_host], keeper
            else:
                # The guardian submits job.sbatch as it is: every node of the cluster is the
                # job's, so the new one waits until the node is back.
                assert job_field(env, new_job, "JobState") == "PENDING"
            node_state(env, batch_host, "resume")
        assert wait_finished(env, new_job, timeout_s=600) == "COMPLETED", job_output(run_dir)
    finally:
        node_state(env, batch_host, "resume")

    # Slurm ended the lost job for good (batch_host_down.txt): never requeued; its guardian
    # submitted the run again. Or the node's slurmd registered again before the batch step's kill
    # reached it: slurmctld aborted the script "on wrong node" and kept the job RUNNING (seen
    # here on a loaded machine), and the job's keeper submitted the run again and cancelled it.
    journal = events(run_dir)
    by = "keeper" if any(e.get("by") == "keeper" for e in journal) else "guardian"
    ended = {"guardian": "FAILED", "keeper": "CANCELLED"}[by]
    assert (job_state(env, job_id), job_restarts(env, job_id)) == (ended, 0)
    record = submission(run_dir)
    assert record["resubmitted_from"] == [job_id] and record["guardian_job_id"] != guardian
    # The new job completed: Slurm cancelled its guardian without running it.
    assert wait_finished(env, record["guardian_job_id"], timeout_s=60) == "CANCELLED"
    assert job_field(env, record["guardian_job_id"], "Reason") == "DependencyNeverSatisfied"

    resubmitted = [e for e in journal if e.get("by") in ("guardian", "keeper")]
    assert [(e["event"], e["cause"], e["job_id"], e["by"]) for e in resubmitted] == [
        ("failure", "node_failure", job_id, by),
        ("requeue", "node_failure", job_id, by),
    ], journal
    assert resubmitted[0]["nodes"] == [batch_host] and resubmitted[0]["new_job_id"] == new_job
    starts = [e for e in journal if e["event"] == "start"]
    assert [s["job_id"] for s in starts] == [job_id, new_job]
    # Resumed from the newest complete checkpoint, whatever step that was (helpers/resumes.py).
    assert starts[1]["resumed_from_step"] >= newest_checkpoint_before(journal, 1), journal
    print(
        f"lost batch host ({'with' if spare else 'no'} spare, run on by its {by}): "
        f"{starts[1]['time'] - lost_at:.1f} s to training again"
    )


@pytest.mark.parametrize("spare", [False, True], ids=["no-spare", "spare"])
def test_a_lost_batch_host_is_submitted_again_by_the_guardian_and_ends_exact(
    slurm_env, tmp_path: Path, spare: bool
) -> None:
    config = [*RUN, "slurm.nodes=2", "slurm.ntasks_per_node=1", f"slurm.spare_nodes={int(spare)}"]
    run_dir = tmp_path / "run"
    lose_the_batch_host(slurm_env, run_dir, *config, spare=spare)
    reference = tmp_path / "reference"
    train_locally(slurm_env, reference, *config, "trainer.nprocs=2")
    assert same_weights(run_dir, reference)


def test_a_sweeps_array_has_one_guardian_which_submits_its_lost_point_again(slurm_env, tmp_path: Path) -> None:
    """Two 2-node points as one array: one guardian for both (not one each). The running task's
    batch host goes down; the array's guardian starts, submits that point again as a job of its
    own (with its own guardian), and queues its successor for the task still waiting, which Slurm
    cancels without running once that task completed."""
    # Two threads a process: each task takes two whole 2-CPU nodes of the three, one task at a time.
    config = [*RUN, "trainer.max_steps=300", "trainer.threads=2", "slurm.nodes=2", "slurm.ntasks_per_node=1"]
    sweep = tmp_path / "sweep"
    (array,), out = submit(slurm_env, sweep, *config, "optim.lr=1e-3,2e-3", multirun=True)
    ids = {Path(d).name: j for d, j in point_jobs(out).items()}
    assert ids == {"0": f"{array}_0", "1": f"{array}_1"}, out
    records = {name: submission(sweep / name) for name in ids}
    guardians = {r.get("array_guardian_job_id") for r in records.values()}
    assert len(guardians) == 1 and None not in guardians and not any("guardian_job_id" in r for r in records.values())
    (guardian,) = guardians
    # The array's two tasks and one guardian (before: a guardian a point, four jobs).
    queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=slurm_env, capture_output=True, text=True)
    assert sorted(queued.stdout.split()) == sorted([f"{array}_0", f"{array}_1", guardian]), queued.stdout
    dependency = job_field(slurm_env, guardian, "Dependency") or ""
    assert f"afternotok:{array}_0" in dependency and f"afternotok:{array}_1" in dependency, dependency

    first = running_task(slurm_env, ids)
    other = next(name for name in ids if name != first)
    wait_for_step(sweep / first, 50)
    batch_host = job_field(slurm_env, ids[first], "BatchHost")
    assert batch_host
    node_state(slurm_env, batch_host, "down")
    try:
        new_job = wait_for_resubmission(sweep / first, ids[first])
    finally:
        node_state(slurm_env, batch_host, "resume")
    for name, job in ((first, new_job), (other, ids[other])):
        assert wait_finished(slurm_env, job, timeout_s=600) == "COMPLETED", job_output(sweep / name)
    by = {e.get("by") for e in events(sweep / first) if e["event"] == "requeue"}
    assert by <= {"guardian", "keeper"} and by, events(sweep / first)
    # The array's guardian ran (a task ended without completing); the resubmitted point has a
    # guardian of its own; the successor watching the other task never ran.
    assert wait_finished(slurm_env, guardian, timeout_s=60) == "COMPLETED"
    moved = submission(sweep / first)
    assert "array_guardian_job_id" not in moved and moved["guardian_job_id"] not in (None, guardian)
    successor = submission(sweep / other)["array_guardian_job_id"]
    assert successor != guardian
    assert wait_finished(slurm_env, successor, timeout_s=60) == "CANCELLED"
    assert job_field(slurm_env, successor, "Reason") == "DependencyNeverSatisfied"
    said = "\n".join(p.read_text() for p in (sweep / ".array").glob("array-*/guardian-*.out"))
    assert f"job {array}_" in said, said
    assert [s["job_id"] for s in of("start", sweep / first)] == [ids[first], new_job]
    assert [f["step"] for f in of("finish", sweep / other)] == [300]


def running_task(env: dict[str, str], ids: dict[str, str], timeout_s: float = 120) -> str:
    """The point whose task Slurm started (two 2-node tasks on 3 nodes: one runs at a time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, job in ids.items():
            if job_field(env, job, "JobState") == "RUNNING":
                return name
        time.sleep(0.5)
    raise AssertionError(f"no task of {ids} started within {timeout_s:.0f} s")
