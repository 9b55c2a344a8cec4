"""A training node an administrator drains, with a spare free, on the real dev cluster: the run
leaves it at the next step boundary, no step redone.

A 2-node job with a spare trains (a paced step of 100 ms); an administrator drains its training
node that is not the batch host (`scontrol update nodename=NODE state=drain reason=...`). Within
slurm.drain_poll_s (30 s, the default) the batch script's watcher journals `draining` (the node,
Slurm's reason, the spare) and SIGTERMs the step; the ranks save the step they are at and stop;
the control step relaunches at once on the batch node and the spare (`relaunch`, cause `drain`),
which resumes from exactly that step. No budget is spent, no requeue made, and the run ends
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from slurmtools import (
    Reference,
    job_field,
    job_output,
    node_state,
    of,
    run_ends,
    same_weights,
    start_cluster,
    submit,
    wait_for_step,
    with_test_helpers,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [*PACED, "trainer.max_steps=700", "trainer.log_every=10", "trainer.eval_every=0", "trainer.ckpt_every=200"]
ON_SLURM = ["slurm.nodes=2", "slurm.ntasks_per_node=1", "slurm.spare_nodes=1"]
REASON = "hpctrain-test fan replacement"


def test_a_drained_training_node_is_left_for_the_spare_at_a_step_boundary(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = Reference(env, tmp_path / "reference", [*TRAIN, "trainer.nprocs=2"])
    run_dir = tmp_path / "run"
    (job,), _ = submit({**env, PAUSE_ENV: "0.1"}, run_dir, *TRAIN, *ON_SLURM)
    try:
        wait_for_step(run_dir, 20)
        batch = job_field(env, job, "BatchHost")
        (node,) = [n for n in of("start", run_dir)[-1]["nodes"] if n != batch]
        node_state(env, node, "drain", reason=REASON)
        drained_at = time.time()
        assert run_ends(env, run_dir, job, timeout_s=600) == ("COMPLETED", "COMPLETED"), job_output(run_dir)
    finally:
        for name in ("node1", "node2", "node3"):
            node_state(env, name, "resume")
    (draining,) = of("draining", run_dir)
    assert (draining["nodes"], draining["reasons"]) == ([node], [REASON]), draining
    assert draining["time"] - drained_at < 30 + 10, "not seen within slurm.drain_poll_s"
    (relaunch,) = of("relaunch", run_dir)
    assert (relaunch["cause"], relaunch["excluded"], relaunch["failed"]) == ("drain", [node], []), relaunch
    assert node not in relaunch["nodes"] and draining["spares"][0] in relaunch["nodes"]
    saved = [c for c in of("checkpoint", run_dir) if c["reason"] == "preempt"]
    assert len(saved) == 1, of("checkpoint", run_dir)
    first, second = of("start", run_dir)
    assert second["resumed_from_step"] == saved[0]["step"], "a step was redone (or skipped)"
    assert not of("requeue", run_dir) and not of("failure", run_dir)
    print(f"drain seen after {draining['time'] - drained_at:.1f} s; relaunched on {relaunch['nodes']}")
    assert same_weights(run_dir, reference.trained()), "the run did not end bit-identical to the uninterrupted one"
