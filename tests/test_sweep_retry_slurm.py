"""Cancel and retry points of a sweep on the real dev cluster (hpctrain-cancel, hpctrain-submit
--retry): a point cancelled while RUNNING, one cancelled while PENDING, one FAILED with its crash
budget spent; all three retried into their own run dirs, resumed from their checkpoints, and
ending with the weights of an uninterrupted run. One sweep of three short jobs, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.crash_once import CRASH_AT_ENV, MARKER
from helpers.paced import PAUSE_ENV
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    events,
    job_output,
    of,
    same_weights,
    start_cluster,
    submit,
    wait_finished,
)

pytestmark = pytest.mark.slurm

TRAIN = [
    "model._target_=helpers.crash_once.CrashOnceConvNet",
    "trainer.max_steps=60",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=5",
]
# Every job is submitted held (so the test says which runs when); the retried jobs are too,
# since they run the same job.sbatch. slurm.job_name is the swept value: the points train alike.
SWEEP = [*TRAIN, "slurm.restart_budget.crash=0", "slurm.extra=['--hold']", "slurm.job_name=p0,p1,p2"]


def helpers_env(env: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, PAUSE_ENV: "0.15", CRASH_AT_ENV: "8"}


def command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def hpctrain(env: dict[str, str], script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return command(env, str(Path(sys.executable).parent / script), *args)


def release(env: dict[str, str], *job_ids: str) -> None:
    done = command(env, "scontrol", "release", ",".join(job_ids))
    assert done.returncode == 0, done.stderr


def wait_for_checkpoint(run_dir: Path, step: int, timeout_s: float = 300) -> None:
    """Until the journal records a complete checkpoint of `step` or later (the bound: as long as
    slurmtools.wait_for_step gives a run to reach a step)."""
    deadline = time.monotonic() + timeout_s
    journal = run_dir / "events.jsonl"  # written at the run's first start
    while not (journal.exists() and any(e["step"] >= step for e in of("checkpoint", run_dir))):
        assert time.monotonic() < deadline, f"no checkpoint of step {step} or later in {timeout_s:.0f} s"
        time.sleep(0.3)


def test_cancel_and_retry_points_of_a_sweep(tmp_path: Path) -> None:
    env = helpers_env(start_cluster())
    sweep = tmp_path / "sweep"
    job_ids, _ = submit(env, sweep, *SWEEP, multirun=True)
    assert len(job_ids) == 3
    running, pending, crashing = (sweep / str(n) for n in range(3))
    (crashing / MARKER).touch()
    release(env, job_ids[0], job_ids[2])
    # The uninterrupted reference trains meanwhile (unarmed, unpaced: same weights).
    reference = tmp_path / "reference"
    local = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={reference}", *TRAIN],
        env={**env, PAUSE_ENV: "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    # ---- cancel one point while it runs, one while it waits: one scancel ----
    # Once a checkpoint of step 10 or later is complete (recorded), not merely step 10 logged:
    # its write runs in the background, so the retry has step 10 or later to resume from at any pace.
    wait_for_checkpoint(running, 10)
    # Their guardians go in the same scancel: a cancelled job would start its guardian for nothing.
    guardians = [json.loads((p / "submission.json").read_text())["guardian_job_id"] for p in (running, pending)]
    dry = hpctrain(env, "hpctrain-cancel", "--dry-run", str(sweep), "0", "1")
    scancel = f"scancel -v {job_ids[0]} {job_ids[1]} {guardians[0]} {guardians[1]}"
    assert dry.returncode == 0 and f"would run: {scancel}" in dry.stdout, dry
    done = hpctrain(env, "hpctrain-cancel", str(sweep), "0", str(pending))
    assert done.returncode == 0, done.stderr
    assert f"cancelled 0: job {job_ids[0]} (RUNNING)" in done.stdout, done.stdout
    assert f"cancelled 1: job {job_ids[1]} (PENDING)" in done.stdout, done.stdout
    assert wait_finished(env, job_ids[0]) == "CANCELLED"
    assert wait_finished(env, job_ids[1]) == "CANCELLED"
    assert wait_finished(env, job_ids[2]) == "FAILED", job_output(crashing)
    assert [wait_finished(env, g) for g in guardians] == ["CANCELLED", "CANCELLED"]
    assert not [*running.glob("guardian-*.out"), *pending.glob("guardian-*.out")], "a cancelled guardian never ran"
    # One cancel recorded per life, whether the job's trap or the command wrote it first.
    assert len(of("cancelled", running)) == 1, events(running)
    assert [e.get("by") for e in of("cancelled", pending)] == ["hpctrain-cancel"]
    assert [e["cause"] for e in of("failure", crashing)] == ["crash", "budget"]
    unknown = hpctrain(env, "hpctrain-cancel", str(sweep), "7")
    assert unknown.returncode == 2 and "its points are 0, 1, 2" in unknown.stderr, unknown

    # ---- retry: the dry run lists all three and queues nothing ----
    before = {p: json.loads((p / "submission.json").read_text()) for p in (running, pending, crashing)}
    dry = hpctrain(env, "hpctrain-submit", "--retry", "--dry-run", str(sweep))
    assert dry.returncode == 0, dry.stderr
    assert f"would retry 0: job {job_ids[0]} ended CANCELLED; resumes from step" in dry.stdout, dry.stdout
    assert f"would retry 1: job {job_ids[1]} ended CANCELLED; starts from step 0" in dry.stdout, dry.stdout
    assert f"would retry 2: job {job_ids[2]} ended FAILED (budget); resumes from step 5" in dry.stdout, dry.stdout
    assert all(json.loads((p / "submission.json").read_text()) == r for p, r in before.items())

    done = hpctrain(env, "hpctrain-submit", "--retry", str(sweep))
    assert done.returncode == 0, done.stderr
    new_ids = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("Submitted batch job ")]
    assert len(new_ids) == 3 and not set(new_ids) & set(job_ids), done.stdout
    release(env, *new_ids)
    for run_dir, old, new in zip((running, pending, crashing), job_ids, new_ids):
        assert wait_finished(env, new) == "COMPLETED", job_output(run_dir)
        record = json.loads((run_dir / "submission.json").read_text())
        assert (record["job_id"], record["resubmitted_from"]) == (new, [old])
        assert [(e["job_id"], e["previous_job_id"]) for e in of("retry", run_dir)] == [(new, old)]
        assert of("finish", run_dir)[-1]["step"] == 60
    # The cancelled point resumed from its newest complete checkpoint (helpers/resumes.py): the
    # save its SIGTERM forced when that ended before Slurm's SIGKILL, else a periodic one.
    resumed = of("start", running)[-1]["resumed_from_step"]
    assert resumed >= newest_checkpoint_before(events(running), -1) >= 10, events(running)
    assert [s["resumed_from_step"] for s in of("start", pending)] == [0]
    assert of("start", crashing)[-1]["resumed_from_step"] == 5

    _, err = local.communicate(timeout=600)
    assert local.returncode == 0, err[-3000:]
    for run_dir in (running, pending, crashing):
        assert same_weights(run_dir, reference), run_dir.name
    nothing = hpctrain(env, "hpctrain-submit", "--retry", str(sweep), "0")
    assert nothing.returncode == 0 and "nothing to retry" in nothing.stdout, nothing
    assert "finished" in nothing.stdout
