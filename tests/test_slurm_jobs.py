"""hpctrain-submit on a real Slurm cluster: multi-node DDP, sweeps, GPU binding, --test-only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from slurmtools import job_field, job_output, point_jobs, start_cluster, submit, wait_finished

from hpctrain.slurm.hostlist import expand

pytestmark = pytest.mark.slurm

SHORT = ["trainer.max_steps=30", "trainer.log_every=10", "trainer.eval_every=0"]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_two_nodes_two_tasks_match_local_four_processes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    slurm_dir = tmp_path / "slurm run"  # a space: paths are quoted all the way to srun
    job_ids, out = submit(slurm_env, slurm_dir, *SHORT, "slurm.nodes=2", "slurm.ntasks_per_node=2")
    assert len(job_ids) == 1 and str(slurm_dir) in out
    local_dir = tmp_path / "local"
    local = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={local_dir}", *SHORT, "trainer.nprocs=4"],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0, local.stderr
    assert wait_finished(slurm_env, job_ids[0]) == "COMPLETED", job_output(slurm_dir)
    start = [e for e in events(slurm_dir) if e["event"] == "start"][0]
    assert start["world_size"] == 4 and start["job_id"] == job_ids[0]
    # The job's two nodes, whichever Slurm chose (an earlier test of this worker's cluster may
    # still be releasing one: a hard-coded node1,node2 failed so in a full run).
    allocated = expand(job_field(slurm_env, job_ids[0], "NodeList") or "")
    assert len(set(start["nodes"])) == 2 and sorted(start["nodes"]) == sorted(allocated), (start, allocated)
    assert [e for e in events(slurm_dir) if e["event"] == "finish"][0]["step"] == 30
    a, b = weights(slurm_dir / "model.pt"), weights(local_dir / "model.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "Slurm run differs from the local run"
    # The rendered script is what ran, and Slurm's output landed in the run dir.
    assert (slurm_dir / "job.sbatch").read_text().startswith("#!/bin/bash")
    assert json.loads((slurm_dir / "submission.json").read_text())["job_id"] == job_ids[0]
    assert f"job {job_ids[0]} restart 0" in job_output(slurm_dir)


def test_sweep_returns_at_once_and_trains_every_point(slurm_env: dict[str, str], tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    job_ids, out = submit(
        slurm_env,
        sweep,
        *SHORT,
        "optim.lr=1e-3,3e-3",
        "model=mlp,convnet",
        "trainer.max_steps=10",
        "slurm.array_parallelism=2",
        multirun=True,
    )
    returned_at = time.time()  # the jobs' journals tell time by the same clock
    # One job array (slurm.array), two tasks at a time: one `Submitted batch job`, a task per point.
    (array,) = job_ids
    tasks = point_jobs(out)
    assert sorted(tasks.values()) == [f"{array}_{t}" for t in range(4)], out
    assert job_field(slurm_env, f"{array}_3", "ArrayTaskThrottle") == "2"
    for job_id in tasks.values():
        assert wait_finished(slurm_env, job_id) == "COMPLETED"
    # It returned while jobs were still queued or running (it never waits for them): before the
    # last point finished, which two at a time cannot come before a whole job of another point.
    # (Not a number of seconds: a submission's time is the machine's load as much as its own.)
    finished = [e["time"] for task in tasks for e in events(Path(task)) if e["event"] == "finish"]
    assert len(finished) == 4 and returned_at < max(finished), (returned_at, finished)
    # The points' run dirs 0..3, beside the sweep's shared code snapshot (code/).
    run_dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [str(p) for p in run_dirs] == sorted(tasks)
    for run_dir in run_dirs:
        finish = [e for e in events(run_dir) if e["event"] == "finish"]
        assert finish and finish[0]["step"] == 10, job_output(run_dir)
        record = json.loads((run_dir / "submission.json").read_text())
        assert record["job_id"] == tasks[str(run_dir)] == f"{record['array_job_id']}_{record['array_task_id']}"
        # Each task's output is in its own run dir, named by the task's own job number.
        assert f"job {record['job_id']} restart 0" in job_output(run_dir)
    # hpctrain-status: one row per point, with its array id.
    status = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", "--json", str(sweep)],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = json.loads(status.stdout)
    rows = rows["runs"] if isinstance(rows, dict) else rows
    assert sorted((r["job_id"], r["state"]) for r in rows) == [(j, "COMPLETED") for j in sorted(tasks.values())]


@pytest.mark.parametrize("gpu_bind", ["all", "per_task"])
def test_each_rank_binds_a_distinct_gpu(slurm_env: dict[str, str], tmp_path: Path, gpu_bind: str) -> None:
    run_dir = tmp_path / gpu_bind
    job_ids, _ = submit(
        slurm_env,
        run_dir,
        "trainer.max_steps=2",
        "trainer.eval_every=0",
        "slurm.nodes=2",
        "slurm.gpus_per_node=2",
        f"slurm.gpu_bind={gpu_bind}",
    )
    assert wait_finished(slurm_env, job_ids[0]) == "COMPLETED", job_output(run_dir)
    start = [e for e in events(run_dir) if e["event"] == "start"][0]
    assert start["world_size"] == 4  # one task per GPU by default
    bound = [(r["node"], r["gpu"]) for r in start["ranks"]]
    assert all(gpu is not None for _, gpu in bound), bound
    assert len(set(bound)) == 4, f"two ranks share a GPU: {bound}"
    assert {gpu for _, gpu in bound} == {"0", "1"}


def test_test_only_accepts_what_is_rendered(slurm_env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "dry"
    job_ids, out = submit(
        slurm_env,
        run_dir,
        "dry_run=true",
        "slurm.nodes=2",
        "slurm.gpus_per_node=2",
        "slurm.mem=1000M",
        "slurm.job_name='a b\"c#d'",
        "slurm.extra=['--comment=x y']",
    )
    assert job_ids == [] and "#SBATCH --nodes=2" in out
    done = subprocess.run(
        ["sbatch", "--test-only", str(run_dir / "job.sbatch")], env=slurm_env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
