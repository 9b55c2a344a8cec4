"""hpctrain-status's cost of a real GPU job on the dev cluster, against sacct's own numbers.

One node with 2 fake GPUs, two training processes, two steps: the smallest job that holds GPUs.
What hpctrain-status --json says it cost must be sacct's ElapsedRaw x AllocTRES of that job: its
`node=`, and its `gres/gpu=` where the cluster's accounting counts GPUs (AccountingStorageTRES=
gres/gpu); where it does not (Slurm's default, and the dev cluster's), the GPUs per node come from
the run's records and are multiplied by sacct's node count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.run.events import read_events
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.status.cost import read_plan, run_cost
from hpctrain.status.goodput import goodput
from hpctrain.status.usage import parse_tres

pytestmark = pytest.mark.slurm

GPUS_PER_NODE = 2


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    from slurmtools import start_cluster

    return start_cluster()


def status_row(env: dict[str, str], run: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", "--json", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    (row,) = json.loads(done.stdout)
    return row


def sacct_lives(env: dict[str, str], job_id: str) -> list[tuple[int, dict[str, int]]]:
    """(ElapsedRaw, AllocTRES counts) of each life of the job, as sacct itself prints them."""
    done = subprocess.run(
        ["sacct", "-n", "-P", "-X", "--duplicates", "-j", job_id, "-o", "ElapsedRaw,AllocTRES,State"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lives = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
    return [(int(elapsed), parse_tres(tres)) for elapsed, tres, _ in lives if tres]


def test_a_gpu_job_costs_what_sacct_says(cluster_env: dict[str, str], tmp_path: Path) -> None:
    from slurmtools import job_output, submit, wait_finished

    run = tmp_path / "run"
    (job_id,), _ = submit(
        cluster_env,
        run,
        "trainer.max_steps=2",
        "trainer.eval_every=0",
        "slurm.nodes=1",
        f"slurm.gpus_per_node={GPUS_PER_NODE}",
    )
    assert wait_finished(cluster_env, job_id) == "COMPLETED", job_output(run)
    # slurmctld tells slurmdbd of the end through a queue: until then sacct may say RUNNING.
    deadline = time.monotonic() + 60
    row = status_row(cluster_env, run)
    while (row["state"], row["source"]) != ("COMPLETED", "sacct") and time.monotonic() < deadline:
        time.sleep(1)
        row = status_row(cluster_env, run)
    assert (row["state"], row["source"]) == ("COMPLETED", "sacct"), row
    lives = sacct_lives(cluster_env, job_id)
    assert len(lives) == 1, lives
    elapsed, tres = lives[0]
    gpus = tres.get("gres/gpu", tres["node"] * GPUS_PER_NODE)
    cost = row["cost"]
    print(f"job {job_id}: sacct ElapsedRaw {elapsed} s, AllocTRES {tres}; hpctrain-status: {cost}")
    assert cost["source"] == "sacct"
    assert cost["gpus_source"] == ("sacct" if "gres/gpu" in tres else "records")
    assert cost["node_hours"] == pytest.approx(elapsed * tres["node"] / 3600, abs=1e-6)
    assert cost["gpu_hours"] == pytest.approx(elapsed * gpus / 3600, abs=1e-6)
    assert 0 < cost["kept_gpu_hours"] <= cost["gpu_hours"]
    (allocation,) = cost["allocations"]
    assert (allocation["job_id"], allocation["restart"], allocation["nodes"], allocation["gpus"]) == (
        job_id,
        0,
        tres["node"],
        gpus,
    )
    # The records alone (a site without accounting): from the batch script's start to the
    # `finish`; sacct counts on to the batch script's end (the control step after the training).
    events = read_events(run / "events.jsonl")
    records = run_cost(events, goodput(events, read_jsonl(run / "metrics.jsonl")), read_plan(run / "config.yaml"), {})
    print(f"records alone: {records.to_json()}")
    assert records.source == "records" and records.allocations[0].gpus == gpus
    assert 0 < records.node_s <= elapsed * tres["node"] + 1.0
    assert records.gpu_s == pytest.approx(records.node_s * GPUS_PER_NODE)
