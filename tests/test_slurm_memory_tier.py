"""The in-memory tier on the dev cluster: a node lost with a spare costs at most a step or two,
whatever trainer.ckpt_every is.

A 2-node job (one rank a node) with a spare copies every rank's state to the memory holders every
step (trainer.memory_ckpt_every=1) and writes no periodic checkpoint in the whole run
(trainer.ckpt_every past max_steps). At step 100 an administrator sets the training node that is
not the batch host down (`scontrol update state=down`): the step ends, the control step relaunches
on the batch node and the spare, and the new step's ranks resume from memory: rank 1's state from
its partner's holder (the batch node's), rank 0's from its own. The second `start` says
`resumed_from: memory` at a step at most 2 below the newest step the first life logged (every step
is logged: the redone steps are the repeated step numbers of metrics.jsonl), and the run ends
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.paced import DEFAULT_STEP_PAUSE_S, PACED, PAUSE_ENV
from slurmtools import (
    Reference,
    job_field,
    job_output,
    node_state,
    of,
    same_weights,
    start_cluster,
    submit,
    wait_finished,
    wait_for_step,
    with_test_helpers,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MAX_STEPS = 300
CONFIG = [
    *PACED,
    "trainer.log_every=1",
    "trainer.eval_every=0",
    f"trainer.ckpt_every={MAX_STEPS + 100}",  # no periodic checkpoint at all: the disk has nothing
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.memory_ckpt_every=1",
    "slurm.nodes=2",
    "slurm.ntasks_per_node=1",
]
LOST_AT_STEP = 100


def logged_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


def test_a_node_lost_with_a_spare_resumes_from_memory_with_at_most_two_steps_redone(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env), PAUSE_ENV: DEFAULT_STEP_PAUSE_S}
    run_dir = tmp_path / "run"
    reference = Reference(env, tmp_path / "reference", [*CONFIG, "trainer.nprocs=2"])
    (job,), _ = submit(env, run_dir, *CONFIG, "slurm.spare_nodes=1")
    wait_for_step(run_dir, LOST_AT_STEP, timeout_s=400)
    batch = job_field(env, job, "BatchHost")
    (victim,) = [node for node in of("start", run_dir)[0]["nodes"] if node != batch]
    assert sorted(p.name for p in (run_dir / "memory").glob("*.addr")) == [
        f"{node}.addr" for node in ("node1", "node2", "node3")
    ], "a holder on every node of the job, the spare's included"
    node_state(env, victim, "down")
    lost_at = time.time()
    try:
        assert wait_finished(env, job, timeout_s=600) == "COMPLETED", job_output(run_dir)
    finally:
        node_state(env, victim, "resume")
    trained = reference.trained(timeout_s=900)

    journal = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    first, second = of("start", run_dir)
    assert first.get("resumed_from") is None and first["resumed_from_step"] == 0, journal
    assert second["resumed_from"] == "memory", journal
    assert of("checkpoint", run_dir)[:-1] == [], "no disk checkpoint before the final one"
    (relaunch,) = of("relaunch", run_dir)
    assert relaunch["cause"] == "node_failure" and victim not in second["nodes"], journal
    steps = logged_steps(run_dir)
    redone = len(steps) - len(set(steps))  # each step trained twice is logged twice
    assert redone <= 2, (redone, second["resumed_from_step"], job_output(run_dir)[-3000:])
    assert sorted(set(steps)) == list(range(1, MAX_STEPS + 1))
    print(
        f"node set down at step {LOST_AT_STEP}+: resumed from memory at step {second['resumed_from_step']}, "
        f"{redone} steps redone, {second['time'] - lost_at:.1f} s from the loss to the relaunch's start"
    )
    assert same_weights(run_dir, trained), "not bit-identical to the uninterrupted run"
