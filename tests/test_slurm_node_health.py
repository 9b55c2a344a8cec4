"""Node health on the real dev cluster: a node that fails its site's own check (slurm.health.command,
run by bash on each node as a life starts; here tests/helpers/claim_bad_node.sh, failing on the
first node that runs it, whichever Slurm placed the first step on) is kept out of the life.

1. With a spare: the first step's broken node journals `failure` (node_health, the check, what it found),
   the step ends, and the control step relaunches at once on the batch node and the spare
   (`failure` node_failure detected_by health, `relaunch`), no requeue;
2. without one: the life is requeued with it in the job's ExcNodeList, and the next life trains
   on the two other nodes.

Both runs end bit-identical to an uninterrupted one, and each life's `start` holds the checks'
seconds (within the issue's 5 s) and the timed all-reduce.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurmtools import Reference, job_output, of, run_ends, same_weights, start_cluster, submit, with_test_helpers

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    "model.channels=[8,16]",
    "model.hidden=32",
    "trainer.max_steps=40",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=10",
]
CHECK = Path(__file__).parent / "helpers" / "claim_bad_node.sh"
ON_SLURM = ["slurm.nodes=2", "slurm.ntasks_per_node=1", f'slurm.health.command="bash {CHECK}"']


def test_a_node_failing_its_check_is_left_for_a_spare_or_requeued_around(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = Reference(env, tmp_path / "reference", [*TRAIN, "trainer.nprocs=2"])
    spare_dir, alone_dir = tmp_path / "spare", tmp_path / "alone"
    (spare_job,), _ = submit(env, spare_dir, *TRAIN, *ON_SLURM, "slurm.spare_nodes=1")
    (alone_job,), _ = submit(env, alone_dir, *TRAIN, *ON_SLURM)
    trained = reference.trained()
    for run_dir, job in ((spare_dir, spare_job), (alone_dir, alone_job)):
        assert run_ends(env, run_dir, job, timeout_s=600) == ("COMPLETED", "COMPLETED"), job_output(run_dir)
        bad = (run_dir / ".bad-node").read_text().strip()
        unhealthy, lost = of("failure", run_dir)
        assert (unhealthy["cause"], unhealthy["nodes"], unhealthy["check"]) == ("node_health", [bad], "command")
        assert unhealthy["result"] == f"`bash {CHECK}` exited 1: {bad}: the test's broken node"
        assert (lost["cause"], lost["nodes"], lost["detected_by"]) == ("node_failure", [bad], "health")
        last = of("start", run_dir)[-1]
        assert bad not in last["nodes"], last
        health = last["health"]
        assert health["checks_s"] < 5.0 and health["command_s"] > 0, health
        assert health["allreduce_gbps"] > 0, health
        print(f"{run_dir.name}: start health {health}")
        assert same_weights(run_dir, trained), "the run did not end bit-identical to the uninterrupted one"
    (relaunch,) = of("relaunch", spare_dir)
    bad = (spare_dir / ".bad-node").read_text().strip()
    assert (relaunch["cause"], relaunch["failed"], relaunch["excluded"]) == ("node_failure", [bad], [bad])
    assert not of("requeue", spare_dir)
    (requeue,) = of("requeue", alone_dir)
    bad = (alone_dir / ".bad-node").read_text().strip()
    assert (requeue["cause"], requeue["excluded"]) == ("node_failure", [bad])
    assert not of("relaunch", alone_dir)
