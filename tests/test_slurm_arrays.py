"""A sweep as Slurm job arrays on the real dev cluster: requeues, node failures and hot spares per task, splitting at
MaxArraySize, refusal over MaxSubmitJobs. (A plain sweep as one array: test_slurm_jobs.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    LIMITED_MAX_ARRAY_SIZE,
    events,
    job_field,
    job_output,
    job_restarts,
    node_state,
    of,
    point_jobs,
    same_weights,
    signal_batch,
    start_cluster,
    start_limited_cluster,
    submit,
    train_locally,
    wait_finished,
    wait_for_state,
    wait_for_step,
    with_test_helpers,
)

pytestmark = pytest.mark.slurm

# Two threads a point: each task takes a whole 2-CPU node, so a node's failure hits one task.
RUN = ["trainer.log_every=5", "trainer.eval_every=0", "trainer.ckpt_every=20", "trainer.threads=2"]
LRS = ["1e-3", "2e-3", "3e-3"]  # point n trains with LRS[n]


def test_array_tasks_requeue_alone_and_resume_exactly_in_their_own_run_dirs(tmp_path: Path) -> None:
    env = start_cluster()
    sweep = tmp_path / "sweep"
    # 400 paced steps, at least 20 s of training a task whatever the load: the faults below must
    # land while each trains, and the tasks may start many seconds apart (each needs a whole node;
    # unpaced, 6 s of training let the first task finish before the last had started under load).
    config = [*RUN, *PACED, "trainer.max_steps=400"]
    paced = {**env, PAUSE_ENV: "0.05", "PYTHONPATH": with_test_helpers(env)}
    (array,), out = submit(paced, sweep, *config, f"optim.lr={','.join(LRS)}", multirun=True)
    ids = {Path(d).name: j for d, j in point_jobs(out).items()}
    assert sorted(ids) == ["0", "1", "2"] and set(ids.values()) == {f"{array}_{t}" for t in range(3)}, out
    # Every task started (until then a pending task answers with the array's own record).
    for name in ids:
        wait_for_step(sweep / name, 5)
    # The task whose own number is the array's id: its batch script's `scontrol requeue` must
    # requeue it alone (by `<array>_<task>`), not every task of the array.
    holder = next(n for n, j in ids.items() if job_field(env, j, "JobId") == array)
    failing = next(n for n in ids if n != holder)
    calm = next(n for n in ids if n not in (holder, failing))
    # The time-limit warning at once: the holder must still be training when it lands.
    signal_batch(env, ids[holder])
    wait_for_step(sweep / failing, 40)  # a checkpoint or two behind it
    victim = of("start", sweep / failing)[0]["nodes"][0]
    node_state(env, victim, "down")  # the batch node of the failing task: Slurm requeues it
    try:
        wait_for_state(env, ids[failing], {"PENDING"}, 120)
    finally:
        node_state(env, victim, "resume")
    for name in (holder, failing, calm):
        state = wait_finished(env, ids[name], timeout_s=600, lift_holds=True)
        assert state == "COMPLETED", job_output(sweep / name)
    # The warned task saved at the warning and resumed from that very step, as the same task.
    saved = [e for e in of("checkpoint", sweep / holder) if e["reason"] == "timelimit"]
    starts = of("start", sweep / holder)
    assert len(saved) == 1 and [s["restart"] for s in starts] == [0, 1], events(sweep / holder)
    assert starts[1]["resumed_from_step"] == saved[0]["step"] and {s["job_id"] for s in starts} == {ids[holder]}
    assert [e["cause"] for e in of("requeue", sweep / holder)] == ["timelimit"]
    # The failed node's task came back as the same task, from its newest complete checkpoint
    # (helpers/resumes.py): the save forced by the SIGTERM when it ends before KillWait's SIGKILL
    # (step 43 in CI), else a periodic one, which may be step 20: the test goes on once step 40
    # is logged, and the write of step 40 only starts then, in the background.
    starts = of("start", sweep / failing)
    assert [s["restart"] for s in starts] == [0, 1] and {s["job_id"] for s in starts} == {ids[failing]}
    newest = newest_checkpoint_before(events(sweep / failing), 1)
    assert starts[1]["resumed_from_step"] >= newest, events(sweep / failing)
    # The third task was never requeued by the others' requeues.
    assert [s["restart"] for s in of("start", sweep / calm)] == [0], events(sweep / calm)
    for name in (holder, failing):
        reference = tmp_path / f"reference-{name}"
        train_locally(env, reference, *config, f"optim.lr={LRS[int(name)]}")
        assert same_weights(sweep / name, reference), name


def test_a_sweep_splits_at_max_array_size_and_one_over_max_submit_jobs_is_refused(tmp_path: Path) -> None:
    env = start_limited_cluster()
    short = ["trainer.max_steps=3", "trainer.log_every=1", "trainer.eval_every=0", "optim.lr=1e-3,2e-3,3e-3,4e-3"]
    limit = subprocess.run(
        ["sacctmgr", "-i", "modify", "user", "root", "set", "MaxSubmitJobs=3"], env=env, capture_output=True, text=True
    )
    assert limit.returncode == 0, limit.stderr
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "hpctrain.cli.submit", "-m", f"hydra.sweep.dir={tmp_path / 'refused'}"]
            + ["cluster=devcluster", *short],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        reset = subprocess.run(
            ["sacctmgr", "-i", "modify", "user", "root", "set", "MaxSubmitJobs=-1"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert reset.returncode == 0, reset.stderr
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "the sweep has 4 points but association root/root (MaxSubmitJobs) allows 3" in refused.stderr
    # Two arrays (MaxArraySize 3), one guardian each (not one a point: 8 before).
    assert "with 2 guardian jobs (slurm.guardian) the sweep queues 6" in refused.stderr
    assert "nothing was queued and no run dir was kept" in refused.stderr
    assert "Submitted batch job" not in refused.stdout and not (tmp_path / "refused").exists()
    queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True, check=True)
    assert queued.stdout.strip() == ""

    sweep = tmp_path / "split"
    arrays, out = submit(env, sweep, *short, multirun=True)
    ids = {Path(d).name: j for d, j in point_jobs(out).items()}
    # MaxArraySize 3: task ids 0..2, so four points make two arrays, each counting from 0.
    assert len(arrays) == 2 and LIMITED_MAX_ARRAY_SIZE == 3, out
    assert ids == {"0": f"{arrays[0]}_0", "1": f"{arrays[0]}_1", "2": f"{arrays[0]}_2", "3": f"{arrays[1]}_0"}
    for name, job_id in ids.items():
        assert wait_finished(env, job_id, timeout_s=300) == "COMPLETED", job_output(sweep / name)
        record = json.loads((sweep / name / "submission.json").read_text())
        assert record["job_id"] == job_id and f"{record['array_job_id']}_{record['array_task_id']}" == job_id
        assert of("finish", sweep / name)[0]["step"] == 3 and of("start", sweep / name)[0]["job_id"] == job_id
        assert f"job {job_id} restart 0" in job_output(sweep / name)


def test_an_array_task_relaunches_on_its_hot_spare(tmp_path: Path) -> None:
    """The task holding the array's own number (the last one, here after the first has ended):
    its batch script reads its own allocation (`scontrol show job <array>_<task>`), not every
    record of the array, and moves onto its spare without a requeue."""
    env = start_cluster()
    sweep = tmp_path / "sweep"
    config = [
        "trainer.log_every=5",
        "trainer.eval_every=0",
        "trainer.ckpt_every=20",
        "trainer.max_steps=300",
        "slurm.nodes=2",
        "slurm.ntasks_per_node=1",
        "slurm.spare_nodes=1",
        "slurm.array_parallelism=1",
    ]
    (array,), out = submit(env, sweep, *config, "optim.lr=1e-3,2e-3", multirun=True)
    ids = {Path(d).name: j for d, j in point_jobs(out).items()}
    assert wait_finished(env, ids["0"], timeout_s=300) == "COMPLETED", job_output(sweep / "0")
    wait_for_step(sweep / "1", 50)
    assert job_field(env, ids["1"], "JobId") == array  # its SLURM_JOB_ID names the whole array
    victim = of("start", sweep / "1")[0]["nodes"][1]
    node_state(env, victim, "down")
    try:
        assert wait_finished(env, ids["1"], timeout_s=600) == "COMPLETED", job_output(sweep / "1")
    finally:
        node_state(env, victim, "resume")
    assert job_restarts(env, ids["1"]) == 0  # never requeued
    relaunches = of("relaunch", sweep / "1")
    assert len(relaunches) == 1 and relaunches[0]["failed"] == [victim], events(sweep / "1")
    starts = of("start", sweep / "1")
    assert len(starts) == 2 and victim not in starts[1]["nodes"] and len(starts[1]["nodes"]) == 2
    reference = tmp_path / "reference"
    train_locally(env, reference, *config[:-1], "optim.lr=2e-3", "trainer.nprocs=2")
    assert same_weights(sweep / "1", reference)


def test_a_large_sweep_is_recorded_point_by_point_by_forked_children(tmp_path: Path) -> None:
    """501 points, queued held as one array: their run dirs written by forked children
    (hpctrain.submit.forked: 2 cores or more), and after the sbatch each point's records too:
    submission.json names its task and its array's guardian, its generation names the task."""
    import os

    from hpctrain.run import generations
    from hpctrain.submit import forked

    count = forked.MIN_PER_CHILD * 2 + 1
    env = start_cluster()
    sweep = tmp_path / "sweep"
    crashes = ",".join(str(i) for i in range(count))
    guardians: set[str] = set()
    arrays, out = submit(env, sweep, "slurm.extra=[--hold]", f"slurm.restart_budget.crash={crashes}", multirun=True)
    try:
        (array,) = arrays
        ids = {Path(d).name: j for d, j in point_jobs(out).items()}
        assert ids == {str(t): f"{array}_{t}" for t in range(count)}
        for t in range(count):
            record = json.loads((sweep / str(t) / "submission.json").read_text())
            assert (record["job_id"], record["array_job_id"], record["array_task_id"]) == (f"{array}_{t}", array, t)
            guardians.add(record["array_guardian_job_id"])
            assert generations.numbers(sweep / str(t)) == [1]
            claim = generations.read(sweep / str(t), 1)
            assert claim is not None and (claim.kind, claim.job_id) == (generations.SUBMIT, f"{array}_{t}"), claim
        (guardian,) = guardians
        assert job_field(env, guardian, "Dependency").startswith(f"afternotok:{array}_0"), guardian
    finally:
        subprocess.run(["scancel", *arrays, *guardians], env=env)
    if len(os.sched_getaffinity(0)) >= 2:
        assert re.search(rf"checked {count} points, \d+ of them in full, in 2 processes", out), out[:2000]
