"""One authority per run dir on a real Slurm cluster: a user's `hpctrain-submit --retry` and the
run's guardian race to submit the same ended run, and exactly one job trains.

The run's job ends before its batch script decided anything (its batch shell SIGKILLed before
`control begin`, as an OOM killer would): the job ends FAILED and its guardian starts (its
`afternotok` dependency met) to submit the run again. The user, seeing FAILED, runs `--retry` at
the same moment. Each takes the run dir's next generation before its sbatch
(hpctrain.run.generations); the guardian is held at its fault points so that each order is tried
exactly:
- the retry first (the guardian held before it takes its generation): the retry's job trains;
  the guardian finds the run taken over and submits nothing;
- the guardian first (held after it took its generation, before its sbatch): the retry is
  refused, saying the guardian is submitting, and queues nothing; the guardian's job trains.
Either way Slurm's own accounting lists one new training job, and the journal one `start`.

And the guardian against a job that came back: the ended job requeued (`scontrol requeue` of a
FAILED batch job, as an administrator or a script does) before the guardian looked at it. Slurm
shows it PENDING again; the guardian leaves it, and the job's next life trains the run alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmtools import (
    ENDED,
    job_output,
    of,
    start_cluster,
    submit,
    wait_at_gate,
    wait_finished,
    wait_for_state,
    with_test_helpers,
)

from hpctrain import faults
from hpctrain.run import generations

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    "trainer.max_steps=40",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=20",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]


def retry(env: dict[str, str], run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.submit", "--retry", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def jobs_named(env: dict[str, str], first: str) -> list[tuple[str, str]]:
    """Slurm's accounting of every job since `first`: (id, name), the guardians' included."""
    deadline = time.monotonic() + 60
    listed: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName", "-S", "now-1hour"],
            env=env,
            capture_output=True,
            text=True,
        )
        listed = [tuple(line.split("|")[:2]) for line in done.stdout.split() if "|" in line]  # type: ignore[misc]
        listed = [(j, n) for j, n in listed if j.isdigit() and int(j) >= int(first)]
        if len(listed) >= 4:
            break
        time.sleep(1.0)
    return listed


def acts(run_dir: Path) -> list[tuple[str, str, str | None]]:
    """The run dir's generations: (kind, by, job) each."""
    found = [generations.read(run_dir, n) for n in generations.numbers(run_dir)]
    return [(g.kind, g.by, g.job_id) for g in found if g is not None]


def ended_job(env: dict[str, str], run_dir: Path, gates: Path, arming: str) -> tuple[str, str, Path]:
    """The run submitted with its batch shell killed before `control begin` and its guardian
    armed: (the job, its guardian, the guardian's gate folder), the guardian held at its gate."""
    armed = {**env, faults.ENV: f"batch.before_begin=kill,{arming}", faults.GATES_ENV: str(gates)}
    (job,), _ = submit(armed, run_dir, *TRAIN)
    assert wait_finished(env, job, timeout_s=300) == "FAILED", job_output(run_dir)
    guardian = json.loads((run_dir / "submission.json").read_text())["guardian_job_id"]
    return job, guardian, gates


def test_a_retry_before_the_guardian_takes_the_run_and_the_guardian_submits_nothing(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = tmp_path / "run", tmp_path / "gates"
    job, guardian, _ = ended_job(env, run_dir, gates, "guardian.before_claim=gate:300")
    reached, opened = faults.gate_files(gates, "guardian.before_claim")
    wait_at_gate(slurm_env, guardian, reached, 300)
    new_job = ""
    try:
        retried = retry(env, run_dir)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        (new_job,) = re.findall(r"^Submitted batch job (\d+)$", retried.stdout, re.M)
        opened.touch()
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "COMPLETED"  # it left the run, on purpose
        said = (run_dir / f"guardian-{guardian}.out").read_text()
        assert "taken over" in said and "retry" in said and "nothing to do" in said, said
        assert wait_finished(slurm_env, new_job, timeout_s=300) == "COMPLETED", job_output(run_dir)
    finally:
        subprocess.run(["scancel", *(j for j in (new_job,) if j)], env=slurm_env, capture_output=True)
    assert [s["job_id"] for s in of("start", run_dir)] == [new_job]
    assert len(of("finish", run_dir)) == 1
    assert json.loads((run_dir / "submission.json").read_text())["job_id"] == new_job
    kinds = [
        (g.kind, g.by, g.job_id) for g in map(lambda n: generations.read(run_dir, n), generations.numbers(run_dir))
    ]
    assert kinds == [("submit", "hpctrain-submit", job), ("submit", "retry", new_job), ("life", "slurm", new_job)]
    training = [j for j, name in jobs_named(slurm_env, job) if not name.endswith(".guardian")]
    assert training == [job, new_job], jobs_named(slurm_env, job)


def test_a_retry_while_the_guardian_submits_is_refused_and_the_guardians_job_trains(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = tmp_path / "run", tmp_path / "gates"
    job, guardian, _ = ended_job(env, run_dir, gates, "guardian.before_sbatch=gate:300")
    reached, opened = faults.gate_files(gates, "guardian.before_sbatch")
    wait_at_gate(slurm_env, guardian, reached, 300)
    new_job = ""
    try:
        retried = retry(env, run_dir)
        assert retried.returncode == 2, retried.stdout + retried.stderr
        assert "taken over" in retried.stderr and "by guardian" in retried.stderr, retried.stderr
        assert "nothing was queued" in retried.stderr, retried.stderr
        assert "Submitted batch job" not in retried.stdout
        opened.touch()
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "COMPLETED"
        deadline = time.monotonic() + 120
        while (new_job := json.loads((run_dir / "submission.json").read_text())["job_id"]) == job:
            assert time.monotonic() < deadline, "the guardian named no new job in submission.json"
            time.sleep(0.5)
        assert wait_finished(slurm_env, new_job, timeout_s=300) == "COMPLETED", job_output(run_dir)
    finally:
        subprocess.run(["scancel", *(j for j in (new_job,) if j)], env=slurm_env, capture_output=True)
    assert [s["job_id"] for s in of("start", run_dir)] == [new_job]
    kinds = [
        (g.kind, g.by, g.job_id) for g in map(lambda n: generations.read(run_dir, n), generations.numbers(run_dir))
    ]
    assert kinds == [("submit", "hpctrain-submit", job), ("submit", "guardian", new_job), ("life", "slurm", new_job)]
    training = [j for j, name in jobs_named(slurm_env, job) if not name.endswith(".guardian")]
    assert training == [job, new_job], jobs_named(slurm_env, job)


def test_the_guardian_leaves_a_job_that_slurm_requeued_after_it_ended(tmp_path: Path) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = tmp_path / "run", tmp_path / "gates"
    job, guardian, _ = ended_job(env, run_dir, gates, "guardian.before_look=gate:300")
    reached, opened = faults.gate_files(gates, "guardian.before_look")
    wait_at_gate(slurm_env, guardian, reached, 300)
    try:
        requeued = subprocess.run(["scontrol", "requeue", job], env=slurm_env, capture_output=True, text=True)
        assert requeued.returncode == 0, requeued.stderr
        assert wait_for_state(slurm_env, job, {"PENDING"}, 60) == "PENDING"
        opened.touch()
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "COMPLETED"
        said = (run_dir / f"guardian-{guardian}.out").read_text()
        assert f"job {job} is PENDING again: it goes on by itself" in said, said
        assert wait_finished(slurm_env, job, timeout_s=300, lift_holds=True) == "COMPLETED", job_output(run_dir)
    finally:
        subprocess.run(["scancel", job], env=slurm_env, capture_output=True)
    assert [(s["job_id"], s["restart"]) for s in of("start", run_dir)] == [(job, 1)]
    assert json.loads((run_dir / "submission.json").read_text())["job_id"] == job
    assert acts(run_dir) == [("submit", "hpctrain-submit", job), ("life", "slurm", job)]
    training = [j for j, name in jobs_named(slurm_env, job) if not name.endswith(".guardian")]
    assert training == [job], jobs_named(slurm_env, job)
