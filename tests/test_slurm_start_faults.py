"""Faults while a life starts or a checkpoint is written, on the real dev cluster, side by side:
the process held at an exact moment (a fault point's gate), the fault sent by Slurm's own
commands, then the process let go.

Cells of the phase-by-fault matrix (docs/fault-matrix.md), in two rounds. The start of a life:

- the batch script before `control begin` (`batch.before_begin`: the batch shell held, no task
  runs yet, nothing journaled) of the first life;
- a task's start before it imports torch (`worker.before_imports`: the stop signals held from the
  first moment, nothing read yet) of the first life;
- the rendezvous (`worker.before_rendezvous`: stop handlers installed, the process group not
  joined) of the first life;
- the resume (`trainer.resume_loading`: the newest checkpoint read, not yet applied) of the second
  life, after a first life that a preemption's SIGTERM to the task stopped at step 20 or soon after;

then a checkpoint being written, the tasks training on meanwhile: the first life's step-50
periodic write held in its writer thread half-written (`checkpoint.periodic_in_flight`), or
between its `.pt`'s rename and its `.json` (`checkpoint.between_renames`); the forced save the
fault brings waits for it or abandons it, whichever loses less; and a forced save itself, the
first life's own stop from step 20 held half-written (`checkpoint.forced_in_flight`);

crossed with three faults:

- `scancel`: the job ends CANCELLED with one `cancelled`, never requeued again (Restarts stays);
- an administrator's `scontrol requeue`: Slurm's own requeue, recorded as `preempt` by slurm, no
  budget but preempt's charged; the next life resumes from the newest complete checkpoint;
- the time-limit warning (`scancel --batch --signal=USR2`, what `--signal=B:USR2@N` makes Slurm
  do): the tasks stop at their first step boundary with a `timelimit` save, the batch script
  requeues, and the next life resumes at exactly that step (nothing redone).

Every run that is not cancelled ends COMPLETED and bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import subprocess
import time
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
    job_output,
    job_restarts,
    of,
    run_ends,
    same_weights,
    start_cluster,
    with_test_helpers,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [*gated.TRAIN, *gated.ONE_TASK]
PHASES = {
    "begin": ("batch.before_begin", f"batch.before_begin=gate:{GATE_S}"),
    "imports": ("worker.before_imports", f"worker.before_imports=gate:{GATE_S}"),
    "rendezvous": ("worker.before_rendezvous", f"worker.before_rendezvous=gate:{GATE_S}"),
    "resume": ("trainer.resume_loading", gated.at_resume(f"gate:{GATE_S}")),
    # The step-50 checkpoint's background write held half-written, or between its two renames,
    # while training goes on.
    "periodic": ("checkpoint.periodic_in_flight", f"checkpoint.periodic_in_flight=gate:{GATE_S}"),
    "renames": ("checkpoint.between_renames", f"checkpoint.between_renames=gate:{GATE_S}"),
    # The first life's own stop from step 20 (a SIGTERM to its task): its forced save held half-written.
    "forced": (
        "checkpoint.forced_in_flight",
        f"trainer.step=term@{FIRST_LIFE_STOP},checkpoint.forced_in_flight=gate:{GATE_S}",
    ),
}
STARTS = ("begin", "imports", "rendezvous", "resume")
FAULTS = ("scancel", "admin_requeue", "warning")
CELLS = {f"{fault}_at_{phase}": (phase, fault) for phase in PHASES for fault in FAULTS}


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def send(env: dict[str, str], job_id: str, fault: str) -> None:
    command = {
        "scancel": ["scancel", job_id],
        "admin_requeue": ["scontrol", "requeue", job_id],
        "warning": ["scancel", "--batch", "--signal=USR2", job_id],
    }[fault]
    subprocess.run(command, env=env, check=True, capture_output=True)


def run_cell(env: dict[str, str], run_dir: Path, gates: Path, phase: str, fault: str) -> tuple[str, str]:
    point, arming = PHASES[phase]
    job_id = gated.submit_armed(env, run_dir, gates, arming, *TRAIN)
    opened = gated.wait_held(env, job_id, gates, point)
    send(env, job_id, fault)
    if fault == "warning":
        time.sleep(1.0)  # the shell's trap passes USR2 on to srun, srun to the task
    opened.touch()
    return run_ends(env, run_dir, job_id, END_TIMEOUT_S)


def test_scancel_admin_requeue_and_warning_as_a_life_starts(slurm_env, tmp_path: Path) -> None:
    run_round(slurm_env, tmp_path, [name for name, (phase, _) in CELLS.items() if phase in STARTS])


def test_scancel_admin_requeue_and_warning_while_a_checkpoint_is_written(slurm_env, tmp_path: Path) -> None:
    run_round(slurm_env, tmp_path, [name for name, (phase, _) in CELLS.items() if phase not in STARTS])


def run_round(slurm_env: dict[str, str], tmp_path: Path, cells: list[str]) -> None:
    """The cells' jobs side by side, each to its end, then each asserted."""
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    reference = tmp_path / "reference"
    trained = Reference(env, reference, TRAIN)
    runs = {name: tmp_path / name for name in cells}
    try:
        with ThreadPoolExecutor(max_workers=len(cells)) as pool:
            ends = {
                name: pool.submit(run_cell, env, runs[name], tmp_path / "gates" / name, *CELLS[name]) for name in cells
            }
            states = {name: future.result() for name, future in ends.items()}
    finally:
        for run_dir in runs.values():
            cancel_run(slurm_env, run_dir)
    trained.trained()

    for name in cells:
        phase, fault = CELLS[name]
        run_dir = runs[name]
        journal = events(run_dir)
        told = f"{name}: {states[name]}\n{journal}\n{job_output(run_dir)}"
        requeues = [(e["cause"], e.get("by")) for e in of("requeue", run_dir)]
        # The second life's cells began with the first life's own stop from step 20: a preemption's
        # SIGTERM to the task, saved, requeued by the batch script, nothing redone.
        before = [("preempt", None)] if phase == "resume" else []
        if phase == "resume":
            # (The ranks agree on a stop at their next vote, a quarter second of steps on.)
            first_stop = of("stop", run_dir)[0]
            assert first_stop["reason"] == "preempt" and first_stop["step"] >= FIRST_LIFE_STOP, told
            assert of("start", run_dir)[1]["resumed_from_step"] == first_stop["step"], told
        assert of("failure", run_dir) == [], told  # no budget but preempt's and timelimit's charged

        if fault == "scancel":
            assert states[name] == ("CANCELLED", "CANCELLED"), told
            assert len(of("cancelled", run_dir)) == 1 and of("finish", run_dir) == [], told
            assert requeues == before, told
            assert job_restarts(slurm_env, current_job(run_dir)) == len(before), told
            continue

        assert states[name][1] == "COMPLETED", told
        assert of("cancelled", run_dir) == [], told
        assert same_weights(run_dir, reference), f"{name}: not bit-identical to the uninterrupted run"
        finish = of("finish", run_dir)
        assert len(finish) == 1 and finish[0]["step"] == STEPS, told
        # Every life resumed from the newest checkpoint complete before it (helpers/resumes.py).
        for life, start in enumerate(of("start", run_dir)):
            assert start["resumed_from_step"] >= newest_checkpoint_before(journal, life), told
        if fault == "admin_requeue":
            # Slurm's requeue, told by the shell's trap; the tasks may or may not have reached a
            # step boundary to save within KillWait (5 s): either way resumed as checked above.
            assert requeues == [*before, ("preempt", "slurm")], told
        elif phase == "forced":
            # The warning came while the stop's save was being written: the save goes on, and the
            # step is requeued for the time limit (the warning wins), from the stop step.
            # The save was held at its gate: when the gate opened past its deadline (a loaded
            # machine) it is `overran`, cancelled so the job exits in time, and the next life
            # resumes from the newest complete checkpoint (checked above) instead.
            assert requeues == [("timelimit", None)], told
            (stop,) = of("stop", run_dir)
            (forced,) = of("forced_save", run_dir)
            saved = [c["step"] for c in of("checkpoint", run_dir) if c["reason"] == "preempt"]
            assert stop["reason"] == "preempt" and stop["step"] >= FIRST_LIFE_STOP, told
            if forced["forced_save"] == "overran":
                assert saved == [], told
            else:
                assert saved == [stop["step"]], told
                assert of("start", run_dir)[-1]["resumed_from_step"] == stop["step"], told
        elif phase == "begin":
            # Held before `control begin`: the shell's trap records the warning, `control begin`
            # launches nothing, after-step requeues for the time limit; no task ran, nothing was
            # trained or saved, and the next life starts at 0.
            assert requeues == [("timelimit", None)], told
            assert of("stop", run_dir) == [] and of("checkpoint", run_dir)[0]["reason"] == "periodic", told
            assert [(s["restart"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(1, 0)], told
        elif phase == "imports":
            # Held before torch was imported: the task leaves without joining, nothing to save
            # (a `stop` at the newest checkpoint's step, none), the next life starts at 0.
            assert requeues == [("timelimit", None)], told
            (stop,) = of("stop", run_dir)
            assert (stop["reason"], stop["step"], stop["deadline_s"]) == ("timelimit", 0, 0), told
            assert [s["resumed_from_step"] for s in of("start", run_dir)] == [0], told
        else:
            # The warning held until the task could act: a `timelimit` save at its first step
            # boundary, the batch script's requeue, and the next life starts exactly there.
            assert requeues == [*before, ("timelimit", None)], told
            stop = of("stop", run_dir)[-1]
            saved = [c["step"] for c in of("checkpoint", run_dir) if c["reason"] == "timelimit"]
            assert stop["reason"] == "timelimit" and saved == [stop["step"]], told
            assert of("start", run_dir)[-1]["resumed_from_step"] == stop["step"], told
