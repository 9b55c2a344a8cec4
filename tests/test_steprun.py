"""Who is a rank and which run dir every task agrees on: tables over captured environments."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_slurm_env import captured

from hpctrain.errors import UserError
from hpctrain.process.steprun import publish_verdict, step_overrides, verdict_path, wait_for_verdict, world_rank
from hpctrain.run.life import LifeStamp

# (environment, rank when one of several tasks, overrides added to `hpctrain-train model=mlp`)
ROWS = [
    # Shells are no rank: hpctrain-train starts its own processes there.
    (captured("batch_shell"), None, []),
    (captured("salloc_shell"), None, []),
    # A one-task step (`srun --pty bash`) neither: trainer.nprocs spawns as on any machine.
    (captured("srun_subset.rank0"), None, []),
    # A multi-task step: every task one rank, the run dir from the job id, Hydra's files from rank 0.
    (captured("srun_step.rank0"), 0, ["hydra.run.dir=runs/slurm-1"]),
    (captured("srun_step.rank3"), 3, ["hydra.run.dir=runs/slurm-1", "hydra.output_subdir=null"]),
    (captured("salloc_step.rank1"), 1, ["hydra.run.dir=runs/slurm-5", "hydra.output_subdir=null"]),
    (captured("het2_step.rank1"), 1, ["hydra.run.dir=runs/slurm-7", "hydra.output_subdir=null"]),
    # An array task: its own job number, as run dirs were always named (a requeued life finds it).
    (
        captured("srun_step.rank0", SLURM_JOB_ID="44", SLURM_ARRAY_JOB_ID="36", SLURM_ARRAY_TASK_ID="7"),
        0,
        ["hydra.run.dir=runs/slurm-44"],
    ),
    # torchrun's variables win, inside a step or not.
    (
        captured("srun_subset.rank0", RANK="1", WORLD_SIZE="2"),
        1,
        ["hydra.run.dir=runs/slurm-1", "hydra.output_subdir=null"],
    ),
    ({"RANK": "0", "WORLD_SIZE": "1"}, None, []),
]


@pytest.mark.parametrize("env, rank, added", ROWS)
def test_world_rank_and_overrides(env: dict[str, str], rank: int | None, added: list[str]) -> None:
    assert world_rank(env) == rank
    assert step_overrides(env, ["model=mlp"], LifeStamp.from_env(env)) == added


@pytest.mark.parametrize("named", ["hydra.run.dir=my/run", "+hydra.run.dir=my/run", "++hydra.run.dir=my/run"])
def test_a_named_run_dir_is_kept(named: str) -> None:
    env = captured("srun_step.rank0")
    assert step_overrides(env, [named], LifeStamp.from_env(env)) == []


def test_torchrun_outside_slurm_must_name_the_run_dir() -> None:
    with pytest.raises(UserError, match="hydra.run.dir"):
        step_overrides({"RANK": "0", "WORLD_SIZE": "2"}, ["model=mlp"], LifeStamp.from_env({}))


@pytest.mark.parametrize("flag", ["-m", "--multirun"])
def test_a_sweep_inside_srun_is_refused(flag: str) -> None:
    with pytest.raises(UserError, match="hpctrain-submit -m"):
        env = captured("srun_step.rank1")
        step_overrides(env, [flag, "optim.lr=1,2"], LifeStamp.from_env(env))


def verdict_of(tmp_path: Path, env: dict[str, str]) -> Path:
    return verdict_path(tmp_path, env, LifeStamp.from_env(env))


def test_verdict_is_per_job_restart_and_step(tmp_path: Path) -> None:
    first = verdict_of(tmp_path, captured("srun_step.rank1"))
    requeued = verdict_of(tmp_path, captured("srun_step.rank1", SLURM_RESTART_COUNT="1"))
    next_step = verdict_of(tmp_path, captured("srun_E.rank1"))
    # Two tasks of one array (each its own job number) never share a verdict either.
    array = {"SLURM_ARRAY_JOB_ID": "36", "SLURM_JOB_ID": "44", "SLURM_ARRAY_TASK_ID": "7"}
    task_7 = verdict_of(tmp_path, captured("srun_step.rank1", **array))
    task_8 = verdict_of(
        tmp_path, captured("srun_step.rank1", **{**array, "SLURM_JOB_ID": "45", "SLURM_ARRAY_TASK_ID": "8"})
    )
    assert len({first, requeued, next_step, task_7, task_8}) == 5
    assert task_7.name == "36_7.r0.s0.config"
    publish_verdict(first, "refused")
    assert wait_for_verdict(first, 1) == {"ok": False, "error": "refused"}
    with pytest.raises(UserError, match="rank 0 wrote no config"):
        wait_for_verdict(requeued, 0.2)
