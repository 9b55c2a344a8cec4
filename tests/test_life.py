"""The life stamp: one name per life, from the variables Slurm sets (values seen on the dev cluster)."""

from __future__ import annotations

import pytest

from hpctrain.run.life import LifeStamp

# (environment, job_id, restart, aliases): a plain job, an array task whose own number differs from
# its `<array>_<task>` name, the task holding the array's own number, a requeued life, no Slurm.
CASES = [
    ({"SLURM_JOB_ID": "36"}, "36", 0, ()),
    ({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "7"}, "36_7", 0, ("43",)),
    ({"SLURM_JOB_ID": "36", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "3"}, "36_3", 0, ("36",)),
    ({"SLURM_JOB_ID": "36", "SLURM_RESTART_COUNT": "2"}, "36", 2, ()),
    ({}, None, 0, ()),
    ({"SLURM_JOB_ID": "36", "SLURM_RESTART_COUNT": "x"}, "36", 0, ()),
]


@pytest.mark.parametrize(("env", "job_id", "restart", "aliases"), CASES)
def test_life_stamp_from_env(env: dict[str, str], job_id: str | None, restart: int, aliases: tuple[str, ...]) -> None:
    life = LifeStamp.from_env(env)
    assert (life.job_id, life.restart, life.aliases) == (job_id, restart, aliases)
    assert life.in_slurm is (job_id is not None)


def test_the_batch_scripts_start_is_read_when_it_set_it() -> None:
    # The batch script exports it as its first act (`date +%s.%N`); a user's own script does not.
    assert (
        LifeStamp.from_env({"SLURM_JOB_ID": "36", "HPCTRAIN_ALLOCATED_AT": "1795600000.25"}).allocated_at
        == 1795600000.25
    )
    assert LifeStamp.from_env({"SLURM_JOB_ID": "36"}).allocated_at is None
    assert LifeStamp.from_env({"HPCTRAIN_ALLOCATED_AT": "soon"}).allocated_at is None


@pytest.mark.parametrize(
    ("env", "nodes", "gpus"),
    [
        # A step of a 3-node job with 2 GPUs a node (values of the dev cluster's gres GPUs).
        ({"SLURM_JOB_ID": "36", "SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "2"}, 3, 2),
        # A CPU job: Slurm sets no GPU count at all.
        ({"SLURM_JOB_ID": "36", "SLURM_JOB_NUM_NODES": "1"}, 1, None),
        ({"SLURM_JOB_ID": "36", "SLURM_JOB_NUM_NODES": "", "SLURM_GPUS_ON_NODE": "0"}, None, None),
        ({}, None, None),
    ],
)
def test_what_the_allocation_holds(env: dict[str, str], nodes: int | None, gpus: int | None) -> None:
    life = LifeStamp.from_env(env)
    assert (life.job_nodes, life.gpus_on_node) == (nodes, gpus)
