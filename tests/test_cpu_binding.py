"""CPU binding on the dev cluster (TaskPlugin=task/affinity, like a site): each training task runs on
exactly slurm.cpus_per_task CPUs, and tasks sharing a node do not share CPUs. The proof is what
each rank's own os.sched_getaffinity(0) said, as the `start` event records it (ranks[].cpus)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

# (slurm.nodes, slurm.ntasks_per_node, slurm.cpus_per_task) on nodes of 2 CPUs: two jobs at once
# take 2 + 1 of the cluster's 3 nodes.
LAYOUTS = {"two-tasks-a-node": (2, 2, 1), "one-task-two-cpus": (1, 1, 2)}


def test_each_task_gets_its_cpus_and_no_other_tasks(tmp_path: Path) -> None:
    from slurmtools import events, job_output, start_pinned_cluster, submit, wait_finished

    env = start_pinned_cluster()
    jobs = {}
    for name, (nodes, tasks, cpus) in LAYOUTS.items():
        (job_id,), _ = submit(
            env,
            tmp_path / name,
            "trainer.max_steps=2",
            "trainer.eval_every=0",
            f"slurm.nodes={nodes}",
            f"slurm.ntasks_per_node={tasks}",
            f"slurm.cpus_per_task={cpus}",
        )
        jobs[name] = job_id
    for name, (nodes, tasks, cpus) in LAYOUTS.items():
        run_dir = tmp_path / name
        assert wait_finished(env, jobs[name]) == "COMPLETED", job_output(run_dir)
        (start,) = [e for e in events(run_dir) if e["event"] == "start"]
        assert len(start["ranks"]) == nodes * tasks
        by_node: dict[str, list[list[int]]] = defaultdict(list)
        for rank in start["ranks"]:
            assert len(rank["cpus"]) == cpus, (name, start["ranks"])
            by_node[rank["node"]].append(rank["cpus"])
        assert len(by_node) == nodes
        for node, per_task in by_node.items():
            used = [cpu for task_cpus in per_task for cpu in task_cpus]
            assert len(set(used)) == len(used) == tasks * cpus, (name, node, per_task)
