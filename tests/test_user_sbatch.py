"""A user's own sbatch script (not rendered by hpctrain) running `srun hpctrain-train ...`: one
DDP world over the step's tasks, bit-identical to the same config trained by local processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from slurmtools import events, job_output, start_cluster, train_locally, wait_finished

pytestmark = pytest.mark.slurm

CONFIG = ["model=mlp", "trainer.max_steps=24", "trainer.log_every=8", "trainer.eval_every=0", "trainer.ckpt_every=12"]


def script(tmp_path: Path) -> str:
    """Three launches a user would write, one after the other in one job of 2 nodes x 1 task."""
    words = " ".join(CONFIG)
    return textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=2
        #SBATCH --chdir={tmp_path}
        #SBATCH --output={tmp_path}/slurm-%j.out
        set -e
        # A named run dir, through the console script.
        srun hpctrain-train hydra.run.dir=named {words}
        # No run dir named: every task derives runs/slurm-<job id>.
        srun python -m hpctrain.cli.train {words}
        # torchrun in a one-task step still trains its own 2 processes.
        srun --nodes=1 --ntasks=1 torchrun --standalone --nproc-per-node=2 \\
            -m hpctrain.cli.train hydra.run.dir=torchrun {words}
        """)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def test_srun_hpctrain_train_is_one_world_matching_local_processes(tmp_path: Path) -> None:
    env = start_cluster()
    (tmp_path / "job.sh").write_text(script(tmp_path))
    done = subprocess.run(["sbatch", "--parsable", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    reference = tmp_path / "local"
    train_locally(env, reference, *CONFIG, "trainer.nprocs=2")  # while the job runs
    assert wait_finished(env, job_id, timeout_s=600) == "COMPLETED", job_output(tmp_path)
    expected = weights(reference)
    for run_dir in (tmp_path / "named", tmp_path / "runs" / f"slurm-{job_id}", tmp_path / "torchrun"):
        got = weights(run_dir)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in got), f"{run_dir.name} differs from local processes"
    for run_dir in (tmp_path / "named", tmp_path / "runs" / f"slurm-{job_id}"):
        (start,) = [e for e in events(run_dir) if e["event"] == "start"]
        # Two nodes, whichever Slurm chose (one a failed test left busy is passed over).
        assert start["world_size"] == 2 and len(set(start["nodes"])) == 2 and start["job_id"] == job_id
        assert [e["step"] for e in events(run_dir) if e["event"] == "finish"] == [24]
    # One run dir per launch, nothing else beside them.
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [f"slurm-{job_id}"]
    assert "finished: step 24" in job_output(tmp_path)


def test_a_refusal_by_rank0_ends_every_task_at_once(tmp_path: Path) -> None:
    """In an salloc allocation (its shell is no rank; its step's tasks are): rank 0 refuses a run
    dir holding another run's config, says so once, and the other task stops too instead of
    waiting for peers."""
    env = start_cluster()
    run_dir = tmp_path / "run"
    # Another seed: what is trained (a longer plan, max_steps, would be taken as a replan).
    train_locally(env, run_dir, *CONFIG, "trainer.max_steps=1", "trainer.seed=7")
    done = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--ntasks-per-node=1",
            "srun",
            sys.executable,
            "-m",
            "hpctrain.cli.train",
            f"hydra.run.dir={run_dir}",
            *CONFIG,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert done.stderr.count("already holds a run with another config (trainer.seed: 7 -> 0)") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert [e["event"] for e in events(run_dir)].count("start") == 1  # nothing trained again
