"""A run on a range of nodes (slurm.nodes=1-3 or 2-3, trainer.elastic=true) loses a node for good,
on the real dev cluster: it goes on training on the two left, in the same job, sample-exact.

The job gets all three nodes of the cluster; at step 60 or later the test sets a node that does
not run the batch script DOWN (as an administrator or a health check does) and leaves it down.
There is no spare and no node to replace it, so instead of requeueing to wait, the control step
relaunches the step on the survivors (`relaunch`, its `nodes` two of them); the new step resumes
the newest complete checkpoint at two processes (hpctrain.trainer.layout: the global batch kept,
each process's share grown by gradient accumulation). Compared with an uninterrupted local run at
three processes: every step trained the same samples in the same global batches (recorded by each
process, helpers/recorded.py), and the final weights are equal within floating-point reduction
order. Once with ddp (a ConvNet, 45 samples a step: two processes take 23 and 22, the range's
middle size not dividing the global batch), once with fsdp (a sharded GPT: its checkpoint's
shards, written by three processes, resharded onto two through DCP).

The ddp run then goes back to three: its relaunched step is held at a gate (step 170) while the
lost node is returned to service and an administrator requeues the job (`scontrol requeue`); it
saves at the requeue's SIGTERM, and Slurm starts the requeued job on all three nodes (its
min-max), where it resumes at three processes.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from conftest import assert_ok, load_weights, run_train
from helpers.paced import DEFAULT_STEP_PAUSE_S, PACED, PAUSE_ENV
from helpers.recorded import ENV, steps_in_layout, steps_of
from slurmtools import (
    cancel_run,
    events,
    job_field,
    job_output,
    job_restarts,
    lift_requeue_hold,
    node_state,
    of,
    start_cluster,
    submit,
    wait_at_gate,
    wait_finished,
    wait_for_step,
    with_test_helpers,
)
from test_fsdp import TINY_MODEL

from hpctrain import faults

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
GATE_S = 300  # a bound for a gate the test never opens; opened within seconds

TESTS = Path(__file__).parent
STEPS = 240
# Per process at three. ddp: a global batch of 45, which two processes share unequally (23 and 22,
# each in 2 micro-batches: 12 + 11 and 11 + 11, weighted by their samples), on a range of 1-3 nodes
# whose middle size does not divide it; fsdp: 36, 18 a process at two (2 micro-batches of 9).
BATCH = {"ddp": 15, "fsdp": 12}
NODES = {"ddp": "1-3", "fsdp": "2-3"}
AT_TWO = {
    "ddp": {"world_size": 2, "micro_batch": 12, "grad_accum": 2, "global_batch": 45},
    "fsdp": {"world_size": 2, "micro_batch": 9, "grad_accum": 2, "global_batch": 36},
}
COMMON = [
    "trainer.step_hang_timeout_s=0",  # its ranks are held at a step gate for minutes: no hang
    f"trainer.max_steps={STEPS}",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=40",
    "trainer.elastic=true",
]
# The paced ConvNet (ddp) without dropout (what a process draws at random follows its rank, so a
# resize changes it), on the digits: 1,437 samples, 39 steps an epoch, so the run crosses five
# epoch ends. The sharded GPT (fsdp) on token sequences: 512, 14 steps an epoch.
STRATEGIES = {
    "ddp": [
        *PACED,
        "model.dropout1=0",
        "model.dropout2=0",
        "data.dataset._target_=helpers.recorded.recorded_digits",
        f"data.batch_size={BATCH['ddp']}",
    ],
    "fsdp": [
        *TINY_MODEL,
        "model._target_=helpers.paced.PacedGPT",
        "data.dataset._target_=helpers.recorded.recorded_tokens",
        f"data.batch_size={BATCH['fsdp']}",
        "trainer.strategy=fsdp",
    ],
}


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def trained_steps(run_dir: Path, samples: Path) -> list[list[int]]:
    """Every kept step's samples, step after step: each srun step's records (one file set per
    launch, in launch order) read in the layout its `start` gives, up to where the next resumed."""
    launches = sorted({p.name.rsplit(".rank", 1)[0] for p in samples.parent.glob(f"{samples.name}.*.rank0")})
    starts = of("start", run_dir)
    assert len(launches) == len(starts), (launches, starts)
    steps: list[list[int]] = []
    for index, (launch, start) in enumerate(zip(launches, starts, strict=True)):
        assert start["resumed_from_step"] <= len(steps), start
        del steps[start["resumed_from_step"] :]  # the steps after the checkpoint it resumed are redone
        end = starts[index + 1]["resumed_from_step"] if index + 1 < len(starts) else STEPS
        layout = start["layout"]
        kept = end - start["resumed_from_step"]
        steps += steps_in_layout(str(samples.parent / launch), layout, kept)
    return steps


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_node_lost_for_good_leaves_the_run_training_on_the_survivors_sample_exact(
    strategy: str, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, samples = tmp_path / "elastic", tmp_path / "samples" / "job"
    samples.parent.mkdir()
    train = [*STRATEGIES[strategy], *COMMON]
    config = [*train, f"slurm.nodes={NODES[strategy]}", "slurm.ntasks_per_node=1"]
    gates = tmp_path / "gates"
    # ddp, and back: the relaunched step held at its 130th step (step 170) while the lost node is
    # returned and an administrator requeues the job: Slurm starts it on 3 nodes again.
    back = strategy == "ddp"
    arming = {faults.ENV: f"trainer.step=gate:{GATE_S}@130", faults.GATES_ENV: str(gates)} if back else {}
    (job_id,), _ = submit({**env, PAUSE_ENV: DEFAULT_STEP_PAUSE_S, ENV: str(samples), **arming}, run_dir, *config)
    victim = ""
    try:
        wait_for_step(run_dir, 60)
        (first,) = of("start", run_dir)
        assert first["world_size"] == 3 and len(first["nodes"]) == 3, first
        batch_host = job_field(slurm_env, job_id, "BatchHost")
        victim = next(node for node in first["nodes"] if node != batch_host)
        failed_at = time.time()
        node_state(slurm_env, victim, "down")  # and it stays down: no node replaces it
        if back:
            reached, opened = faults.gate_files(gates, "trainer.step")
            wait_at_gate(slurm_env, job_id, reached, GATE_S)
            node_state(slurm_env, victim, "resume")
            wait_until_in_service(slurm_env, victim)
            subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, capture_output=True)
            opened.touch()
            lift_requeue_hold(slurm_env, job_id)
        assert wait_finished(slurm_env, job_id, timeout_s=600) == "COMPLETED", job_output(run_dir)
    finally:
        if victim:
            node_state(slurm_env, victim, "resume")
        cancel_run(slurm_env, run_dir)

    # Relaunched on the two nodes left, at two processes, from a checkpoint: not requeued for it.
    assert job_restarts(slurm_env, job_id) == (1 if back else 0), job_output(run_dir)
    assert [(r["cause"], r.get("by")) for r in of("requeue", run_dir)] == ([("preempt", "slurm")] if back else [])
    (relaunch,) = of("relaunch", run_dir)
    assert relaunch["failed"] == [victim] and len(relaunch["nodes"]) == 2 and victim not in relaunch["nodes"]
    first, second, *requeued = of("start", run_dir)
    if back:  # the requeued job got all 3 nodes and resumed the step it saved at the requeue's SIGTERM
        (third,) = requeued
        (stop,) = of("stop", run_dir)
        assert (third["restart"], third["world_size"], third["resumed_from_step"]) == (1, 3, stop["step"]), third
        global_batch = 3 * BATCH[strategy]
        assert third["layout"] == {
            "world_size": 3,
            "micro_batch": BATCH[strategy],
            "grad_accum": 1,
            "global_batch": global_batch,
        }
    else:
        assert requeued == []
    assert (second["world_size"], sorted(second["nodes"])) == (2, sorted(relaunch["nodes"])), second
    assert second["layout"] == AT_TWO[strategy], second
    checkpoints = [c["step"] for c in of("checkpoint", run_dir) if c["time"] < second["time"]]
    assert second["resumed_from_step"] == max(checkpoints) > 0, events(run_dir)
    assert [f["step"] for f in of("finish", run_dir)] == [STEPS]
    print(
        f"elastic {strategy}: {second['time'] - failed_at:.1f} s from the node failure to the step on 2 nodes "
        f"(resumed from the checkpoint of step {second['resumed_from_step']}, set down at step 60 or later)"
    )

    # An uninterrupted local run of the same config at three processes.
    reference, reference_samples = tmp_path / "reference", tmp_path / "reference-samples"
    done = run_reference(reference, reference_samples, train)
    assert_ok(done)
    expected = steps_of(str(reference_samples), 3, BATCH[strategy], 1)
    assert trained_steps(run_dir, samples) == expected  # the same samples in the same global batches
    mine, theirs = load_weights(run_dir), load_weights(reference)
    assert mine.keys() == theirs.keys()
    # Sums taken in another grouping from the resize on, 180 steps of it: as tests/test_fsdp.py.
    difference = max((mine[name] - theirs[name]).abs().max().item() for name in mine)
    print(f"elastic {strategy}: max |dw| {difference:.3g} from the uninterrupted run")
    assert difference < 1e-4


def wait_until_in_service(env: dict[str, str], node: str, timeout_s: float = 60) -> None:
    """Until Slurm shows NODE idle or in use again (a node resumed re-registers first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True)
        if state.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated"):
            return
        assert time.monotonic() < deadline, f"{node} still {state.stdout.strip()!r} after {timeout_s:.0f} s"
        time.sleep(0.5)


def run_reference(run_dir: Path, samples: Path, train: list[str]) -> subprocess.CompletedProcess[str]:
    return run_train(run_dir, [*train, "trainer.nprocs=3"], TESTS, {ENV: str(samples)})
