"""hpctrain-status on a running job whose node an administrator drains, on a real Slurm cluster:
`scontrol update nodename=NODE state=drain` while the job trains there, and a maintenance
reservation that will take the node. The note names the job, the node, Slurm's state and reason,
and the reservation; the run trains on; once the node is resumed, nothing is said."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from slurmtools import cancel_run, node_state, of, start_cluster, submit, wait_for_step, with_test_helpers

pytestmark = [pytest.mark.slurm]

TRAIN = [*PACED, "slurm.nodes=2", "slurm.ntasks_per_node=1", "trainer.max_steps=2000", "trainer.log_every=1"]


def status(env: dict[str, str], run_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hpctrain.cli.status", str(run_dir)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_a_running_job_on_a_drained_node_is_told_with_the_reservation_that_takes_it(tmp_path: Path) -> None:
    env = start_cluster()
    env = {**env, "PYTHONPATH": with_test_helpers(env), PAUSE_ENV: "0.1"}
    run_dir = tmp_path / "run"
    (job,), _ = submit(env, run_dir, *TRAIN)
    reservation = ["scontrol", "create", "reservation", "ReservationName=hpctrain-maint", "StartTime=now+1hour"]
    try:
        wait_for_step(run_dir, 3)
        assert "Slurm shows" not in status(env, run_dir).stderr
        node = of("start", run_dir)[-1]["nodes"][-1]  # a node the job trains on
        created = subprocess.run([*reservation, "Duration=60", f"Nodes={node}", "Users=root", "Flags=MAINT"], env=env)
        assert created.returncode == 0
        node_state(env, node, "drain")
        said = status(env, run_dir).stderr
        told = f"job {job} trains on {node}, which Slurm shows draining (hpctrain-test): the run trains on"
        assert told in said, said
        assert "; reservation hpctrain-maint takes it from 20" in said, said
        wait_for_step(run_dir, 8)  # it trains on
        node_state(env, node, "resume")
        assert "Slurm shows" not in status(env, run_dir).stderr
    finally:
        subprocess.run(["scontrol", "delete", "ReservationName=hpctrain-maint"], env=env, capture_output=True)
        for name in ("node1", "node2", "node3"):
            node_state(env, name, "resume")
        cancel_run(env, run_dir)
