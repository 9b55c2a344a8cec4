"""A training node lost after Slurm started the job and before its first step, on the dev cluster.

The batch script is held at `batch.before_begin` (a fault point's gate); the test sets down the
job's node that does not run the batch script (`scontrol update state=down`), which Slurm removes
from the --no-kill job, and opens the gate. The training srun then asks for 2 nodes of a job that
has 1: Slurm 22.05 answers "Requested nodes are busy" and srun would retry for ever (seen in the
overlap soak: a job RUNNING 13 minutes on one node, nothing trained). With `--immediate` srun gives
up after a minute; after-step finds the node gone from the job (`node_failure`, detected by
Slurm) and requeues without it; the next life trains on the nodes left and the run ends
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.gated import END_TIMEOUT_S, GATE_S, TRAIN, submit_armed, wait_held
from slurmtools import (
    Reference,
    events,
    job_field,
    job_output,
    lift_requeue_hold,
    node_state,
    same_weights,
    start_cluster,
    wait_finished,
    with_test_helpers,
)

from hpctrain.slurm.env import parse_node_list

pytestmark = pytest.mark.slurm

POINT = "batch.before_begin"
TWO_NODES = ["slurm.nodes=2", "slurm.ntasks_per_node=1"]


def test_a_node_lost_before_the_first_step_is_requeued_around(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir = tmp_path / "run"
    trained = Reference(env, tmp_path / "reference", [*TRAIN, "trainer.nprocs=2"])
    job = submit_armed(env, run_dir, tmp_path / "gates", f"{POINT}=gate:{GATE_S}", *TRAIN, *TWO_NODES)
    opened = wait_held(env, job, tmp_path / "gates", POINT)
    batch_host = job_field(env, job, "BatchHost")
    (lost,) = [n for n in parse_node_list(job_field(env, job, "NodeList") or "") if n != batch_host]
    node_state(env, lost, "down")
    try:
        opened.touch()
        lift_requeue_hold(env, job, timeout_s=200)
        assert wait_finished(slurm_env, job, timeout_s=END_TIMEOUT_S, lift_holds=True) == "COMPLETED", job_output(
            run_dir
        )
    finally:
        node_state(env, lost, "resume")
    journal = events(run_dir)
    failures = [(e["cause"], e.get("nodes"), e.get("detected_by")) for e in journal if e["event"] == "failure"]
    assert failures == [("node_failure", [lost], "slurm")], journal
    assert [(e["cause"], e["excluded"]) for e in journal if e["event"] == "requeue"] == [("node_failure", [lost])]
    starts = [e for e in journal if e["event"] == "start"]
    assert [s["restart"] for s in starts] == [1] and lost not in starts[0]["nodes"], starts
    assert same_weights(run_dir, trained.trained())
