"""Who is a rank and which run dir every task agrees on: tables over captured environments."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_slurm_env import captured

from hpctrain.errors import UserError
from hpctrain.steprun import publish_verdict, step_overrides, verdict_path, wait_for_verdict, world_rank

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
    assert step_overrides(env, ["model=mlp"]) == added


@pytest.mark.parametrize("named", ["hydra.run.dir=my/run", "+hydra.run.dir=my/run", "++hydra.run.dir=my/run"])
def test_a_named_run_dir_is_kept(named: str) -> None:
    assert step_overrides(captured("srun_step.rank0"), [named]) == []


def test_torchrun_outside_slurm_must_name_the_run_dir() -> None:
    with pytest.raises(UserError, match="hydra.run.dir"):
        step_overrides({"RANK": "0", "WORLD_SIZE": "2"}, ["model=mlp"])


@pytest.mark.parametrize("flag", ["-m", "--multirun"])
def test_a_sweep_inside_srun_is_refused(flag: str) -> None:
    with pytest.raises(UserError, match="hpctrain-submit -m"):
        step_overrides(captured("srun_step.rank1"), [flag, "optim.lr=1,2"])


def test_verdict_is_per_job_restart_and_step(tmp_path: Path) -> None:
    first = verdict_path(tmp_path, captured("srun_step.rank1"))
    requeued = verdict_path(tmp_path, captured("srun_step.rank1", SLURM_RESTART_COUNT="1"))
    next_step = verdict_path(tmp_path, captured("srun_E.rank1"))
    assert len({first, requeued, next_step}) == 3
    publish_verdict(first, "refused")
    assert wait_for_verdict(first, 1) == {"ok": False, "error": "refused"}
    with pytest.raises(UserError, match="rank 0 wrote no config"):
        wait_for_verdict(requeued, 0.2)
