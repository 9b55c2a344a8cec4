"""trainer.strategy=fsdp on the real dev cluster: a 2-node job of a sharded GPT is preempted (its
partition's PreemptMode=REQUEUE, the urgent job needing every node), saves its shards at the
signal's step through DCP, and resumes from them in its next life with no step lost; its end is
bit-identical to an uninterrupted local run of the same config on 2 processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.paced import PAUSE_ENV
from slurmtools import (
    Reference,
    events,
    job_output,
    lift_requeue_hold,
    of,
    preempt_everything,
    same_weights,
    start_cluster,
    submit,
    wait_finished,
    wait_for_step,
    with_test_helpers,
)
from test_fsdp import TINY_MODEL

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    *TINY_MODEL,
    "model._target_=helpers.paced.PacedGPT",
    "data.batch_size=6",
    "trainer.strategy=fsdp",
    "trainer.max_steps=300",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=25",
]
SHAPE = ["slurm.nodes=2", "slurm.ntasks_per_node=1"]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def test_a_preempted_fsdp_job_saves_its_shards_at_the_signal_and_resumes_exactly(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir = tmp_path / "preempted"
    reference = Reference(env, tmp_path / "reference", [*TRAIN, "trainer.nprocs=2"])
    (job_id,), _ = submit({**env, PAUSE_ENV: "0.05"}, run_dir, *TRAIN, *SHAPE)
    wait_for_step(run_dir, 30)
    urgent = preempt_everything(slurm_env)
    lift_requeue_hold(slurm_env, job_id)
    assert wait_finished(slurm_env, urgent) == "COMPLETED"
    assert wait_finished(slurm_env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
    saved = [e for e in of("checkpoint", run_dir) if e["reason"] == "preempt"]
    assert len(saved) == 1, events(run_dir)
    starts = of("start", run_dir)
    assert [s["restart"] for s in starts] == [0, 1] and starts[1]["resumed_from_step"] == saved[0]["step"] > 30
    assert [e["cause"] for e in of("requeue", run_dir)] == ["preempt"]
    # The signal's save is sharded: each node's rank wrote its own file, rank 0 the .json.
    meta = json.loads((run_dir / "checkpoints" / "step_00000300.json").read_text())
    assert meta["sharded"] is True and {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    assert same_weights(run_dir, reference.trained(timeout_s=900))
