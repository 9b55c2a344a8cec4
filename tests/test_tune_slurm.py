"""hpctrain-tune end to end on the Slurm dev cluster: 12 trials on the digits, 3 at a time, the
median pruner on; the submitting command returns at once and every later trial is submitted by
an ending trial's job."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmtools import job_output, start_cluster, wait_finished

pytestmark = pytest.mark.slurm

TRIALS, PARALLEL = 12, 3
TINY = [
    "trainer.max_steps=12",
    "trainer.log_every=4",
    "trainer.eval_every=4",
    "trainer.ckpt_every=0",
    "data.batch_size=16",
]


def final_value(run_dir: Path, metric: str) -> float | None:
    """The metric at the last logged step of a trial's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return records[-1].get(metric) if records else None


def test_a_search_runs_to_its_end_after_the_command_returned(tmp_path: Path) -> None:
    env = start_cluster()
    sweep = tmp_path / "search"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.cli.tune",
            f"hydra.sweep.dir={sweep}",
            "cluster=devcluster",
            *TINY,
            "optim.lr=float(1e-4,3e-1,log)",
            "tune.metric=eval_accuracy",
            "tune.direction=maximize",
            f"tune.n_trials={TRIALS}",
            f"tune.parallel={PARALLEL}",
            "tune.pruner=median",
            "tune.pruner_startup_trials=2",
            "tune.seed=3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    returned_s = time.monotonic() - started
    returned_at = time.time()  # the trials' journals tell time by the same clock
    assert done.returncode == 0, done.stdout + done.stderr
    # The first wave: one job array (slurm.array), a run dir line per trial.
    assert re.findall(r"^Submitted batch job \d+$", done.stdout, re.M), done.stdout
    first_trials = re.findall(r"^  run dir: ", done.stdout, re.M)
    assert len(first_trials) == PARALLEL and f"sweep dir: {sweep}" in done.stdout

    summary_path = sweep / "tune.json"
    deadline = time.monotonic() + 300
    summary: dict = {}
    while time.monotonic() < deadline:
        summary = json.loads(summary_path.read_text())
        counts = summary["counts"]
        if counts["running"] == 0 and counts["complete"] + counts["pruned"] + counts["failed"] == TRIALS:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the search did not end: {summary.get('counts')}\n" + job_output(sweep / "0"))
    search_s = time.monotonic() - started

    counts = summary["counts"]
    assert counts["failed"] == 0, [t for t in summary["trials"] if t["state"] == "FAIL"]
    assert len(summary["trials"]) == TRIALS  # never more than the budget
    records = [json.loads(line) for line in (sweep / "tune.jsonl").read_text().splitlines()]
    submitted = [r for r in records if r["state"] == "RUNNING"]
    assert sorted(r["number"] for r in submitted) == list(range(TRIALS))
    # Every trial after the first wave was submitted by an ending trial's job, not by the command.
    assert all(r.get("by_job") for r in submitted if r["number"] >= PARALLEL)
    # Never more than PARALLEL trials queued or running at once: replay submissions and tells.
    running, most = 0, 0
    for record in records:
        running += 1 if record["state"] == "RUNNING" else -1
        most = max(most, running)
    assert most <= PARALLEL

    complete = {}
    told_at = []
    for trial in summary["trials"]:
        run_dir = Path(trial["run_dir"])
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        names = [e["event"] for e in events]
        assert names[0] == "start" and names.count("trial") == 1, (run_dir, names)  # told once
        told = next(e for e in events if e["event"] == "trial")
        assert told["state"] == trial["state"]
        told_at.append(told["time"])
        # Told before its job ends: the control step writes tune.json, then the batch script exits.
        assert wait_finished(env, trial["job_id"], timeout_s=60) == "COMPLETED", job_output(run_dir)
        if trial["state"] == "PRUNED":
            assert "pruned" in names and "finish" not in names
        else:
            assert "finish" in names
            complete[trial["number"]] = final_value(run_dir, "eval_accuracy")
            assert trial["value"] == pytest.approx(complete[trial["number"]])
    # The command returned once the first wave was queued, and the search went on without it: the
    # last trial was told after it returned. (Not a number of seconds: a submission's time is the
    # machine's load as much as its own.)
    assert returned_at < max(told_at), (returned_at, told_at)
    best = max(complete, key=lambda n: complete[n])
    assert summary["best"]["number"] == best and summary["best"]["value"] == pytest.approx(complete[best])

    status = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", str(sweep)], env=env, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"best: trial {best} eval_accuracy=" in status.stdout
    assert f"{TRIALS} of {TRIALS} trials ended" in status.stdout and "search over" in status.stdout
    print(f"\nsearch: returned in {returned_s:.1f} s, {TRIALS} trials ended after {search_s:.0f} s; {counts}")
