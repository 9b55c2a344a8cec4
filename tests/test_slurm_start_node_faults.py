"""A node or a rank lost while a life starts, on the real dev cluster: the rank cells side by side,
then the node cells one after the other (a node set down ends every job on it).

Cells of the phase-by-fault matrix (docs/fault-matrix.md) for a task's start before it imports
torch (`worker.before_imports`) and the rendezvous of a first life
(`worker.before_rendezvous`: stop handlers in, the process group not joined) and the resume of a
second (`trainer.resume_loading`: the newest checkpoint read, not applied; the first life stopped
itself by a SIGTERM to its task from step 20 on), crossed with:

- a node down: a 2-node job (one task a node); rank 1, on the node that does not run the batch
  script, is held at a gate; the test sets that node down (`scontrol update state=down`, as an
  administrator or a health check does), then lets the rank go. The step ends, the control step
  charges `node_failure` and requeues; the job trains again on the nodes left (or, when the other
  cell took a node down too, once the test brings the nodes back) and resumes from the newest
  complete checkpoint. Also while rank 0's step-50 periodic write is in flight
  (`checkpoint.periodic_in_flight`, half-written) or between its renames
  (`checkpoint.between_renames`): rank 1's node set down while the write is held, the write
  never let go (srun ends rank 0 with the step). The half-written one never counts (the next
  life starts at 0); the renamed `.pt` without its `.json` is whole and the newest usable one:
  the next life resumes from step 50.
- one rank SIGKILLed (the kernel's OOM killer): a 2-task job whose rank 1 kills itself at the
  moment; no save, a `crash` charged, trained again in the job, where the armed point kills it
  again; the second crash is requeued (crash budget 2 here), from the newest complete checkpoint.
- one rank SIGSTOPped (alive and silent): the peer's watchdog, running from before the
  rendezvous and through the loading, reports a `hang` after `trainer.hang_timeout_s` (30 s
  here), not a crash after the collective timeout; trained again in the job, where the armed point
  stops it again; the second hang is requeued, from the newest complete checkpoint.

Every job ends COMPLETED and bit-identical to an uninterrupted run of its config.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import gated
from helpers.gated import END_TIMEOUT_S, GATE_S, STEPS
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    Reference,
    cancel_run,
    events,
    job_field,
    job_output,
    node_state,
    of,
    run_ends,
    same_weights,
    start_cluster,
    with_test_helpers,
)

from hpctrain.slurm.hostlist import expand

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    *gated.TRAIN,
    # A stopped rank: its peer's watchdog reports the hang after 30 s without progress (a stage
    # of the start done, a step); 20 s was short for a healthy start-up on a loaded CI machine.
    "trainer.hang_timeout_s=30",
    "trainer.collective_timeout_s=600",
]
SHAPES = {
    "node_down": ["slurm.nodes=2", "slurm.ntasks_per_node=1"],
    # The armed kill fires in every launch of its life: the crash's relaunch in the job dies too,
    # and the second crash, requeued, needs a budget of 2 (the default is 1).
    "rank_sigkilled": ["slurm.nodes=1", "slurm.ntasks_per_node=2", "slurm.restart_budget.crash=2"],
    "rank_sigstopped": ["slurm.nodes=1", "slurm.ntasks_per_node=2"],
}
POINTS = {
    "imports": "worker.before_imports",
    "rendezvous": "worker.before_rendezvous",
    "resume": "trainer.resume_loading",
    # Rank 0's step-50 periodic write held in its writer thread (rank 0 writes the checkpoints),
    # half-written or between its two renames, while rank 1's node is set down.
    "periodic": "checkpoint.periodic_in_flight",
    "renames": "checkpoint.between_renames",
}
WRITES = ("periodic", "renames")
# What rank 1 does at the phase's point (first life, or the second life for the resume).
ACTIONS = {"node_down": f"gate:{GATE_S}", "rank_sigkilled": "kill", "rank_sigstopped": "stop"}
# The node cells take every phase; the rank cells the three start phases (a rank stopped or killed
# while a checkpoint is written: tests/test_stopped_rank_while_writing.py, test_fault_points_run.py).
CELLS = {
    f"{fault}_at_{phase}": (phase, fault)
    for phase in POINTS
    for fault in SHAPES
    if fault == "node_down" or phase not in WRITES
}
FAILURE_CAUSE = {"node_down": "node_failure", "rank_sigkilled": "crash", "rank_sigstopped": "hang"}
NODES = ("node1", "node2", "node3")


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def arming(phase: str, fault: str) -> str:
    point = POINTS[phase]
    if phase in WRITES:
        return f"{point}={ACTIONS[fault]}#0"
    if phase != "resume":
        return f"{point}={ACTIONS[fault]}#1"
    return gated.at_resume(ACTIONS[fault], "#1")


def run_cell(env: dict[str, str], run_dir: Path, gates: Path, phase: str, fault: str) -> tuple[str, str, str]:
    """The cell's job to its end: (first job's end state, last job's end state, node set down)."""
    job_id = gated.submit_armed(env, run_dir, gates, arming(phase, fault), *TRAIN, *SHAPES[fault])
    downed = ""
    if fault == "node_down":
        opened = gated.wait_held(env, job_id, gates, POINTS[phase])
        nodes = expand(job_field(env, job_id, "NodeList") or "")
        (downed,) = [n for n in nodes if n != job_field(env, job_id, "BatchHost")]
        node_state(env, downed, "down")
        if phase not in WRITES:
            time.sleep(1.0)  # Slurm ends the step's tasks on the node it set down
            opened.touch()
        # A write cell's held write is never let go: srun ends the step, rank 0 with it (SIGKILL
        # KillWait after its SIGTERM), while the write is still in flight.
    return (*run_ends(env, run_dir, job_id, END_TIMEOUT_S), downed)


@pytest.fixture(scope="module")
def reference(slurm_env, tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """The uninterrupted run, 2 processes (both shapes are a world of 2), trained beside the first
    test's jobs: call it for its run dir once they ended."""
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    return functools.cache(Reference(env, run_dir, [*TRAIN, "trainer.nprocs=2"]).trained)


def failed(run_dir: Path) -> bool:
    return (run_dir / "events.jsonl").exists() and bool(of("failure", run_dir))


def bring_back_when_failed(env: dict[str, str], runs: dict[str, Path], ends: dict[str, Future]) -> None:
    """Bring the downed nodes back once each run journaled its failure: the two cells may have
    set two different nodes down, leaving one node for 2-node jobs until then."""
    pending = set(runs)
    while pending:
        pending = {name for name in pending if not (failed(runs[name]) or ends[name].done())}
        time.sleep(0.5)
    time.sleep(5.0)  # the requeues' exclusions set
    for node in NODES:
        node_state(env, node, "resume")


def run_side_by_side(env: dict[str, str], tmp_path: Path, cells: list[str]) -> dict[str, tuple[str, str, str]]:
    runs = {name: tmp_path / name for name in cells}
    try:
        with ThreadPoolExecutor(max_workers=len(cells)) as pool:
            ends = {
                name: pool.submit(run_cell, env, runs[name], tmp_path / "gates" / name, *CELLS[name]) for name in cells
            }
            if CELLS[cells[0]][1] == "node_down":
                bring_back_when_failed(env, runs, ends)
            return {name: future.result() for name, future in ends.items()}
    finally:
        for run_dir in runs.values():
            cancel_run(env, run_dir)
        for node in NODES:
            node_state(env, node, "resume")


def assert_cell(name: str, run_dir: Path, ended: tuple[str, str, str], reference: Path) -> None:
    phase, fault = CELLS[name]
    journal = events(run_dir)
    first, last, downed = ended
    told = f"{name}: {first} {last} {downed}\n{journal}\n{job_output(run_dir)}"
    assert last == "COMPLETED", told
    assert of("cancelled", run_dir) == [], told
    assert same_weights(run_dir, reference), f"{name}: not bit-identical"
    assert [f["step"] for f in of("finish", run_dir)] == [STEPS], told
    for life, start in enumerate(of("start", run_dir)):
        assert start["resumed_from_step"] >= newest_checkpoint_before(journal, life), told

    # The resume cells' first life stopped itself (preempt, saved, nothing redone); then the
    # fault, charged to its own cause (the stopped rank's own watchdog may say so too, once
    # Slurm's SIGCONT lets it go), and one requeue for it.
    before = ["preempt"] if phase == "resume" else []
    cause = FAILURE_CAUSE[fault]
    assert {f["cause"] for f in of("failure", run_dir)} == {cause}, told
    assert [e["cause"] for e in of("requeue", run_dir)] == [*before, cause], told
    if fault == "node_down":
        assert downed in of("failure", run_dir)[0]["nodes"], told
    if fault == "rank_sigstopped":
        assert of("failure", run_dir)[0]["rank"] == 0, told  # the peer's watchdog saw it
    if fault != "node_down":
        # A hang or a crash on live nodes is trained again in the job first; the armed point
        # stops or kills the relaunched step too (it fires in every launch of a life), and the
        # second hang or crash requeues.
        assert [e["cause"] for e in of("relaunch", run_dir)] == [cause], told
    # Nothing of the faulted life was saved: the last life starts at the first life's stop
    # (resume cells) or at step 0 (the first life's cells). The step-50 write lost half-written
    # never counts; lost between its renames, its `.pt` without the `.json` is whole and nothing
    # newer is usable: the next life resumes from it.
    resumed = of("start", run_dir)[-1]["resumed_from_step"]
    expected = {"resume": of("stop", run_dir)[0]["step"] if phase == "resume" else 0, "renames": 50}
    assert resumed == expected.get(phase, 0), told
    if phase in WRITES:
        assert newest_checkpoint_before(journal, -1) == 0, told  # the held write never journaled


def test_a_rank_killed_or_stopped_as_a_life_starts(slurm_env, reference, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    cells = [name for name, (_, fault) in CELLS.items() if fault != "node_down"]
    ends = run_side_by_side(env, tmp_path, cells)
    for name in cells:
        assert_cell(name, tmp_path / name, ends[name], reference())


def test_a_node_down_as_a_life_starts_or_a_checkpoint_is_written(slurm_env, reference, tmp_path: Path) -> None:
    # One at a time, apart from the rank cells: a node set down ends every job on it, and the
    # two 2-node jobs would share one.
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    cells = [name for name, (_, fault) in CELLS.items() if fault == "node_down"]
    ends = {name: run_side_by_side(env, tmp_path, [name])[name] for name in cells}
    for name in cells:
        assert_cell(name, tmp_path / name, ends[name], reference())
