"""What the gated-cell tests on the dev cluster share (test_slurm_start_faults.py,
test_slurm_start_preemption.py, test_slurm_start_node_faults.py): a short paced run whose first
life outlasts its start, and the fault points that hold a process at a phase of it.

A cell's job is held at a fault point's gate (hpctrain.faults, gate:S), the fault is sent while it
waits there, and the gate is opened: the fault lands at exactly that moment however slow the
machine.
"""

from __future__ import annotations

from pathlib import Path

from slurmtools import submit, wait_at_gate

from helpers.paced import PACED, PAUSE_ENV
from hpctrain import faults

STEPS = 120
TRAIN = [
    *PACED,
    f"trainer.max_steps={STEPS}",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
]
ONE_TASK = ["slurm.nodes=1", "slurm.ntasks_per_node=1"]
PAUSE_S = "0.05"  # a step takes at least this (helpers.paced): the first life outlasts its start
GATE_S = 300  # a bound for a test that never opens a gate; each opens within seconds
FIRST_LIFE_STOP = 20  # the resume cells: the first life stops itself from this step on (SIGTERM)
END_TIMEOUT_S = 600  # a cell's job to its end: two or three lives, requeue holds lifted


def at_resume(action: str, rank: str = "") -> str:
    """The arming for a cell at the second life's `trainer.resume_loading` (rank: `#R` or ''): its
    first life SIGTERMs its own task from step 20 (a stop, saved, requeued), and `action` fires once
    the second life has read its newest checkpoint."""
    return f"trainer.step=term@{FIRST_LIFE_STOP},trainer.resume_loading={action}/2{rank}"


def submit_armed(env: dict[str, str], run_dir: Path, gates: Path, arming: str, *overrides: str) -> str:
    """hpctrain-submit with the fault points armed (gates in `gates`), paced: the job id."""
    armed = {**env, PAUSE_ENV: PAUSE_S, faults.ENV: arming, faults.GATES_ENV: str(gates)}
    (job_id,), _ = submit(armed, run_dir, *overrides)
    return job_id


def wait_held(env: dict[str, str], job_id: str, gates: Path, point: str) -> Path:
    """Until the job's process is held at `point`'s gate: the file that opens it."""
    reached, opened = faults.gate_files(gates, point)
    wait_at_gate(env, job_id, reached, END_TIMEOUT_S)
    return opened
