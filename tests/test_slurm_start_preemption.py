"""A preemption at the worst moments of a life, on the real dev cluster: with a grace (GraceTime
20, the dev cluster's `batch`) and without one (GraceTime 0, Slurm's default and many sites'), at
the rendezvous of a first life and at the resume of a second, in the batch script's own moments,
and while a checkpoint is written.

Sixteen cells of the phase-by-fault matrix (docs/fault-matrix.md), three rounds: four to six
one-task jobs held at a fault point's gate side by side (`worker.before_rendezvous`, or the second
life's `trainer.resume_loading`; then `slurm.setup`, before `control begin` and before the asking
for a decided requeue, the batch shell held; then a write in flight), then one job of the `urgent`
partition that needs every node preempts them all at once, then the gates open. Half of the jobs
run in a partition made for the test, `nograce`, the same nodes with GraceTime 0.

- with a grace: SIGTERM to the tasks; the batch script requeues (`preempt`, by the batch script).
- without a grace: Slurm requeues the job at once, SIGTERM to the batch shell and the tasks
  together, SIGKILL KillWait (5 s) later; the shell's trap records Slurm's requeue (`preempt`,
  by slurm).

Either way the task's stop handlers hold the signal through the gate (and the rendezvous, or the
loading): the task stops at its first step boundary (step 1, or the resumed step's next vote),
saves it within the time Slurm gives, and the next life starts exactly there: nothing redone.

Held in the batch script (in `slurm.setup`, or before `control begin`), no task runs yet. With a
grace, `control begin` sees the job's PreemptTime and launches nothing (a step started inside the
grace would be SIGTERMed as it starts at the grace's end, warned by nobody; one that srun was still
starting when the SIGTERM came died with 143, charged as a crash), and after-step requeues it as
a preemption. Without a grace, Slurm's own requeue, recorded by the shell's trap. The next life
trains from step 0. In the same round, the batch shell held as it is about to ask for a requeue
it decided (the first life stopped itself from step 20 and saved): with a grace the requeue is
asked before the grace ends; without one Slurm requeues first and the control step, reading the
job's Restarts before asking, asks nothing. Either way one requeue, charged once, and the next
life resumes from the stop step.

A third round, while a checkpoint is written: the first life's step-50 periodic write held in its
writer thread half-written (`checkpoint.periodic_in_flight`) or between its `.pt`'s rename and its
`.json` (`checkpoint.between_renames`), and the training held too, two steps on (`trainer.step`),
so that the preemption lands with the write in flight however long the other jobs take to be held.
With a grace the ranks agree on the stop at their next step boundary; the forced save waits for
the write under way or abandons it, whichever loses less, and saves the stop step; the batch
script requeues. Without a grace the same within KillWait (5 s), or SIGKILL first: then the next
life resumes from the newest checkpoint complete before it, the held write counting only if it
completed (a `.pt` without its `.json` is resumed from only when nothing newer is usable). And a
forced save itself in flight (`checkpoint.forced_in_flight`: the first life's own stop from step
20, its save held half-written) when the preemption comes: the second SIGTERM changes nothing;
the save, held past its deadline (KillWait from its own SIGTERM), is `overran` and cancelled, or
SIGKILL ends it; the stop was journaled before it, so no crash is charged, and the next life
resumes from the newest complete checkpoint.

No cell charges a budget but `preempt`'s; every job ends COMPLETED and bit-identical to an
uninterrupted run.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import gated
from helpers.gated import END_TIMEOUT_S, FIRST_LIFE_STOP, GATE_S, STEPS
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    Reference,
    cancel_run,
    current_job,
    events,
    job_field,
    job_output,
    job_restarts,
    of,
    preempt_everything,
    run_ends,
    same_weights,
    start_cluster,
    wait_finished,
    with_test_helpers,
)

from hpctrain import faults

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# Its ranks are held at a step gate for minutes in the write cells: no hang.
TRAIN = [*gated.TRAIN, *gated.ONE_TASK, "trainer.step_hang_timeout_s=0"]
HELD_STEP = 52  # the write cells' training held here, the step-50 write still in flight
PHASES = {
    "rendezvous": ("worker.before_rendezvous", f"worker.before_rendezvous=gate:{GATE_S}"),
    "resume": ("trainer.resume_loading", gated.at_resume(f"gate:{GATE_S}")),
    # The batch script's own moments, before any task runs (the gate holds the batch shell).
    "setup": ("batch.setup", f"batch.setup=gate:{GATE_S}/1"),
    "begin": ("batch.before_begin", f"batch.before_begin=gate:{GATE_S}/1"),
    # The first life's own stop from step 20 (a SIGTERM to its task), saved; the batch shell held
    # once it decided the requeue, before it asks Slurm.
    "requeue": ("batch.before_requeue", f"trainer.step=term@{FIRST_LIFE_STOP},batch.before_requeue=gate:{GATE_S}/1"),
    # The step-50 periodic write held (half-written, or between its renames) and the training held
    # at step 52 (the step's gate is the one waited for: reached after the write's).
    "periodic": ("trainer.step", f"checkpoint.periodic_in_flight=gate:{GATE_S},trainer.step=gate:{GATE_S}@{HELD_STEP}"),
    "renames": ("trainer.step", f"checkpoint.between_renames=gate:{GATE_S},trainer.step=gate:{GATE_S}@{HELD_STEP}"),
    # The first life's own stop from step 20 (a SIGTERM to its task): its forced save held half-written.
    "forced": (
        "checkpoint.forced_in_flight",
        f"trainer.step=term@{FIRST_LIFE_STOP},checkpoint.forced_in_flight=gate:{GATE_S}",
    ),
}
WRITES = ("periodic", "renames", "forced")
# The write a phase holds besides its training, opened first once the preemption's SIGTERMs are delivered.
WRITE_POINTS = {"periodic": "checkpoint.periodic_in_flight", "renames": "checkpoint.between_renames"}
PARTITIONS = {"grace": "batch", "no_grace": "nograce"}
CELLS = {f"preempt_{grace}_at_{phase}": (phase, grace) for phase in PHASES for grace in PARTITIONS}


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """The dev cluster with a partition `nograce`: `batch`'s nodes, priority and PreemptMode, and
    GraceTime 0. Removed again at the end (a partition made by scontrol lives until slurmctld
    restarts)."""
    env = start_cluster()
    batch = subprocess.run(
        ["scontrol", "show", "partition", "-o", "batch"], env=env, capture_output=True, text=True, check=True
    ).stdout
    nodes = re.search(r"\bNodes=(\S+)", batch)
    assert nodes, batch
    subprocess.run(
        ["scontrol", "delete", "PartitionName=nograce"], env=env, capture_output=True
    )  # left by an interrupted run
    subprocess.run(
        [
            "scontrol",
            "create",
            "PartitionName=nograce",
            f"Nodes={nodes.group(1)}",
            "PriorityTier=1",
            "PreemptMode=REQUEUE",
            "GraceTime=0",
            "OverSubscribe=NO",
            "MaxTime=INFINITE",
            "State=UP",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    yield env
    subprocess.run(["scontrol", "delete", "PartitionName=nograce"], env=env, capture_output=True)


def held(env: dict[str, str], run_dir: Path, gates: Path, phase: str, grace: str) -> str:
    """Submit the cell's job and wait until its task is held at the phase's gate: its job id."""
    point, arming = PHASES[phase]
    job_id = gated.submit_armed(env, run_dir, gates, arming, *TRAIN, f"slurm.partition={PARTITIONS[grace]}")
    gated.wait_held(env, job_id, gates, point)
    if phase in WRITE_POINTS:
        gated.wait_held(env, job_id, gates, WRITE_POINTS[phase])
    return job_id


def open_gates(gates: Path, phase: str) -> None:
    """Let the cell's held processes go (the write's gate first: it was reached first)."""
    if phase in WRITE_POINTS:
        faults.gate_files(gates, WRITE_POINTS[phase])[1].touch()
    faults.gate_files(gates, PHASES[phase][0])[1].touch()


def wait_chosen(env: dict[str, str], job_id: str, timeout_s: float = 60) -> None:
    """Until Slurm has chosen the job for preemption (its record shows a PreemptTime, or, without a
    grace, it is requeued already): the scheduler may take a cycle or two after the urgent job's
    submission on a loaded machine, and a gate opened before would let the job start unpreempted."""
    deadline = time.monotonic() + timeout_s
    while job_field(env, job_id, "PreemptTime") in (None, "None") and not job_restarts(env, job_id):
        assert time.monotonic() < deadline, f"job {job_id} not chosen for preemption within {timeout_s:.0f} s"
        time.sleep(0.2)


def preempt_held(env: dict[str, str], tmp_path: Path, cells: list[str]) -> dict[str, tuple[str, str]]:
    """The cells' jobs held at their gates, one urgent job preempting them all, the gates opened:
    each cell's (first job's end state, last job's end state)."""
    runs = {name: tmp_path / name for name in cells}
    gates = {name: tmp_path / "gates" / name for name in cells}
    try:
        with ThreadPoolExecutor(max_workers=len(cells)) as pool:
            holding = {name: pool.submit(held, env, runs[name], gates[name], *CELLS[name]) for name in cells}
            jobs = {name: future.result() for name, future in holding.items()}
            # Every job held at its gate: one urgent job needing every node preempts them all.
            urgent = preempt_everything(env)
            for job_id in jobs.values():
                wait_chosen(env, job_id)
            time.sleep(1.0)  # the SIGTERMs delivered while the jobs are still held
            for name in cells:
                open_gates(gates[name], CELLS[name][0])
            assert wait_finished(env, urgent, timeout_s=END_TIMEOUT_S) == "COMPLETED"
            ending = {name: pool.submit(run_ends, env, runs[name], jobs[name], END_TIMEOUT_S) for name in cells}
            return {name: future.result() for name, future in ending.items()}
    finally:
        for run_dir in runs.values():
            cancel_run(env, run_dir)


def preempt_round(slurm_env: dict[str, str], tmp_path: Path, phases: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """The cells of these phases preempted together, beside the uninterrupted run (tmp_path /
    "reference"): each cell's (first, last) end state."""
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    trained = Reference(env, tmp_path / "reference", TRAIN)
    states = preempt_held(env, tmp_path, [name for name, (phase, _) in CELLS.items() if phase in phases])
    trained.trained()
    return states


def ended_exact(name: str, run_dir: Path, ended: tuple[str, str], reference: Path) -> tuple[list[dict], str]:
    """What every trained cell must show: COMPLETED, no budget charged but preempt's, trained to
    the end once, bit-identical. Returns its journal and the text a failed assertion shows."""
    journal = events(run_dir)
    told = f"{name}: {ended}\n{journal}\n{job_output(run_dir)}"
    assert ended[1] == "COMPLETED", told
    assert of("failure", run_dir) == [] and of("cancelled", run_dir) == [], told  # preempt's budget only
    assert same_weights(run_dir, reference), f"{name}: not bit-identical to the uninterrupted run"
    assert [f["step"] for f in of("finish", run_dir)] == [STEPS], told
    return journal, told


def test_a_preemption_with_and_without_grace_at_the_rendezvous_and_the_resume(slurm_env, tmp_path: Path) -> None:
    states = preempt_round(slurm_env, tmp_path, ("rendezvous", "resume"))
    cells = list(states)

    for name in cells:
        phase, grace = CELLS[name]
        run_dir = tmp_path / name
        journal, told = ended_exact(name, run_dir, states[name], tmp_path / "reference")

        # The resume cells' first life stopped itself from step 20 (a SIGTERM to its task).
        before = [("preempt", None)] if phase == "resume" else []
        by = None if grace == "grace" else "slurm"  # without a grace Slurm requeues at once
        assert [(e["cause"], e.get("by")) for e in of("requeue", run_dir)] == [*before, ("preempt", by)], told

        # Preempted at the phase's moment, the stop agreed at the first step boundary the task
        # reached (step 1, or the resumed step's next vote), saved within the time Slurm gives,
        # and the next life starts exactly there: no step redone. Without a grace that time is
        # KillWait (5 s) from the SIGTERM, and a loaded machine may spend it on the rendezvous
        # or the loading: then SIGKILL comes first, nothing of this life is saved and nothing is
        # lost either (it trained no step), and the next life starts where this one did.
        faulted = 0 if phase == "rendezvous" else 1
        starts = of("start", run_dir)
        mine = [e for e in of("stop", run_dir) if e["restart"] == faulted]
        saved = {c["step"] for c in of("checkpoint", run_dir) if c["reason"] == "preempt"}
        if grace == "grace" or mine and mine[0]["step"] in saved:
            (preempted,) = mine
            assert preempted["reason"] == "preempt" and preempted["step"] in saved, told
            assert starts[-1]["resumed_from_step"] == preempted["step"], told
            limit = 20 if grace == "grace" else 5  # GraceTime, or KillWait without a grace
            assert 0 < preempted["deadline_s"] <= limit, told
            assert preempted["step"] == (1 if phase == "rendezvous" else starts[1]["resumed_from_step"] + 1), told
        else:
            assert starts[-1]["resumed_from_step"] == (0 if phase == "rendezvous" else starts[1]["resumed_from_step"])
        if phase == "resume":
            # The first life stopped itself from step 20; the second resumed there.
            first = of("stop", run_dir)[0]
            assert first["restart"] == 0 and first["step"] >= FIRST_LIFE_STOP, told
            assert starts[1]["resumed_from_step"] == first["step"], told


def test_a_preemption_with_and_without_grace_at_the_batch_scripts_own_moments(slurm_env, tmp_path: Path) -> None:
    states = preempt_round(slurm_env, tmp_path, ("setup", "begin", "requeue"))
    for name in states:
        phase, grace = CELLS[name]
        run_dir = tmp_path / name
        told = f"{name}: {states[name]}\n{events(run_dir)}\n{job_output(run_dir)}"
        assert states[name][1] == "COMPLETED", told
        assert same_weights(run_dir, tmp_path / "reference"), f"{name}: not bit-identical to the uninterrupted run"
        if phase == "requeue":
            # The requeue the batch script had decided for the first life's own stop, asked (or, with
            # Slurm requeuing first, found done) once: one requeue, nothing else charged, and the
            # next life starts at the stop step.
            assert of("failure", run_dir) == [] and of("cancelled", run_dir) == [], told
            assert [(e["cause"], e.get("by")) for e in of("requeue", run_dir)] == [("preempt", None)], told
            (stop,) = of("stop", run_dir)
            saved = [c["step"] for c in of("checkpoint", run_dir) if c["reason"] == "preempt"]
            assert stop["step"] >= FIRST_LIFE_STOP and saved == [stop["step"]], told
            assert [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(0, 0), (1, stop["step"])]
            assert job_restarts(slurm_env, current_job(run_dir)) == 1, told
            if grace == "no_grace":
                assert "hpctrain: Slurm is requeuing this job already" in job_output(run_dir), told
            continue
        # No task ran in the preempted life: nothing trained, nothing charged but preempt's (before:
        # a step srun was starting got Slurm's SIGTERM before its task could hold it, exit 143,
        # charged as a crash), one requeue, and the next life trains from step 0.
        assert of("failure", run_dir) == [] and of("cancelled", run_dir) == [], told
        by = None if grace == "grace" else "slurm"
        assert [(e["cause"], e.get("by")) for e in of("requeue", run_dir)] == [("preempt", by)], told
        assert [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(1, 0)], told
        if grace == "grace":
            # `control begin` saw the grace (PreemptTime) and launched nothing.
            assert "a preemption's grace runs): no launch" in job_output(run_dir), told


def test_a_preemption_with_and_without_grace_while_a_checkpoint_is_written(slurm_env, tmp_path: Path) -> None:
    states = preempt_round(slurm_env, tmp_path, WRITES)
    for name in states:
        phase, grace = CELLS[name]
        run_dir = tmp_path / name
        journal, told = ended_exact(name, run_dir, states[name], tmp_path / "reference")
        by = None if grace == "grace" else "slurm"
        assert [(e["cause"], e.get("by")) for e in of("requeue", run_dir)] == [("preempt", by)], told

        # Preempted with the step-50 write in flight and the training held at step 52: the ranks
        # agree on the stop at the first vote after the gates open, and its forced save decides
        # with the write under way (`forced_save`: waited for it, or abandoned it).
        stops = of("stop", run_dir)
        assert [(e["reason"], e["restart"]) for e in stops] == [("preempt", 0)], told
        stop_step = stops[0]["step"]
        assert stop_step >= (FIRST_LIFE_STOP if phase == "forced" else HELD_STEP), told
        forced = [e["forced_save"] for e in of("forced_save", run_dir)]
        saved = [c["step"] for c in of("checkpoint", run_dir) if c["reason"] == "preempt"]
        starts = of("start", run_dir)
        if forced and forced[0] in ("written", "waited", "abandoned_inflight"):
            # Saved at the stop step within the time Slurm gives; the next life starts exactly there.
            assert saved == [stop_step] and starts[-1]["resumed_from_step"] == stop_step, told
            # GraceTime, or KillWait without a grace or for the forced cells' own stop (no
            # preemption yet when it came).
            limit = 20 if grace == "grace" and phase != "forced" else 5
            assert 0 < stops[0]["deadline_s"] <= limit, told
        else:
            # The plan kept only the write under way (its estimate of a write is the held write's
            # time, long on a loaded machine), or nothing fit, or a forced save held past its
            # deadline is `overran`; without a grace SIGKILL may also come before the save ends (no
            # `forced_save`). The next life resumes from the newest checkpoint complete before it
            # (the held step-50 write if it completed, a `.pt` without its `.json` else) or newer.
            assert forced or grace == "no_grace", told
            assert saved == [], told
            assert starts[-1]["resumed_from_step"] >= newest_checkpoint_before(journal, -1), told
