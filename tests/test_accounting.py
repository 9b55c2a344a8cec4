"""hpctrain-status with accounting: sacct's text as the dev cluster printed it, then live sacct.

tests/data/sacct/ holds output captured from the dev cluster (Slurm 22.05, slurmdbd on MariaDB):
  duplicates.txt   `sacct -n -P -X --duplicates -j 1,...,10 -o JobIDRaw,State` after jobs that
                   completed (1, 7, 10), failed (2; exit 3), were cancelled (3), hit their time
                   limit (4), were requeued by hand then cancelled (5), were preempted, requeued,
                   lost their node, requeued, then were cancelled (9), and an array job 6 whose
                   tasks 6_2 and 6_1 have the raw ids 6 and 8;
  latest.txt       the same without --duplicates (one line a job: its latest life);
  disabled.stderr  what sacct says on a cluster without accounting (exit 1);
  slurmdbd_down.stderr  what it says when slurmdbd does not answer (exit 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.status import slurm_query
from hpctrain.status.slurm_query import SlurmJob

DATA = Path(__file__).parent / "data" / "sacct"
ALL_IDS = [str(i) for i in range(1, 11)]


def sacct_job(state: str, restarts: int) -> SlurmJob:
    return SlurmJob(state, None, restarts, "sacct")


@pytest.mark.parametrize(
    ("job_id", "expected"),
    [
        ("1", sacct_job("COMPLETED", 0)),
        ("2", sacct_job("FAILED", 0)),
        ("3", sacct_job("CANCELLED", 0)),  # "CANCELLED by 0": cancelled by root
        ("4", sacct_job("TIMEOUT", 0)),
        ("5", sacct_job("CANCELLED", 1)),  # REQUEUED, then CANCELLED by 0
        ("6", sacct_job("FAILED", 0)),  # array task 6_2
        ("8", sacct_job("FAILED", 0)),  # array task 6_1
        ("9", sacct_job("CANCELLED", 2)),  # PREEMPTED, NODE_FAIL, then CANCELLED by 0
        ("10", sacct_job("COMPLETED", 0)),
    ],
)
def test_every_life_of_a_job_counts_and_the_last_is_its_state(job_id: str, expected: SlurmJob) -> None:
    jobs = slurm_query.parse_sacct((DATA / "duplicates.txt").read_text(), ALL_IDS)
    assert jobs[job_id] == expected


def test_without_duplicates_sacct_hides_the_requeues() -> None:
    """Why the query asks for --duplicates: without it a requeued job looks like it never restarted."""
    jobs = slurm_query.parse_sacct((DATA / "latest.txt").read_text(), ALL_IDS)
    assert (jobs["9"].state, jobs["9"].restarts) == ("CANCELLED", 0)
    assert slurm_query.parse_sacct((DATA / "duplicates.txt").read_text(), ALL_IDS)["9"].restarts == 2


def test_only_the_asked_raw_ids_are_read() -> None:
    jobs = slurm_query.parse_sacct((DATA / "duplicates.txt").read_text(), ["6", "5"])
    assert set(jobs) == {"5", "6"}  # 8 (array task 6_1) was not asked for


@pytest.mark.parametrize(
    ("stderr_file", "note"),
    [
        ("disabled.stderr", None),  # no accounting: normal on small sites, not worth a note
        ("slurmdbd_down.stderr", "sacct failed: sacct: error: Problem talking to the database: Connection refused"),
    ],
)
def test_sacct_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr_file: str, note: str | None) -> None:
    """sacct alone on PATH, answering what the real one printed (exit 1)."""
    fake = tmp_path / "sacct"
    fake.write_text(f"#!/bin/sh\n/bin/cat '{DATA / stderr_file}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    answer = slurm_query.query(["5"])
    assert answer.jobs == {}
    sacct_notes = [n for n in answer.notes if n.startswith("sacct")]
    assert sacct_notes == ([note] if note else [])


# ---- live: a cluster that forgets ended jobs within seconds (MinJobAge 2) -----------------------

# sbatch arguments -> the state sacct reports once the job ended.
LIVE_JOBS = {
    "completed": (["--wrap", "true"], "COMPLETED"),
    "failed": (["--wrap", "exit 3"], "FAILED"),
    "cancelled": (["--wrap", "sleep 300"], "CANCELLED"),
    "timeout": (["--time=1", "--wrap", "sleep 300"], "TIMEOUT"),
}


def write_run(root: Path, job_id: str) -> Path:
    """A run dir as hpctrain-submit and the trainer's first start leave it."""
    root.mkdir(parents=True)
    (root / ".hydra").mkdir()
    (root / "config.yaml").write_text("trainer:\n  max_steps: 100\n  log_every: 10\nslurm:\n  nodes: 1\n")
    (root / "submission.json").write_text(json.dumps({"job_id": job_id, "submitted_at": 1.0}))
    start = {"event": "start", "time": 1.0, "job_id": job_id, "restart": 0, "world_size": 1, "nodes": ["node1"]}
    (root / "events.jsonl").write_text(json.dumps({**start, "resumed_from_step": 0, "total_steps": 100}) + "\n")
    return root


def scontrol_knows(env: dict[str, str], job_id: str) -> bool:
    done = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True)
    return done.returncode == 0


@pytest.mark.slurm
def test_status_after_minjobage_reads_sacct(tmp_path: Path) -> None:
    from slurmtools import start_forgetful_cluster, wait_for_state

    env = start_forgetful_cluster()
    job_ids = {}
    for name, (args, _) in LIVE_JOBS.items():
        done = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", f"--chdir={tmp_path}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        job_ids[name] = done.stdout.strip()
        write_run(tmp_path / name, job_ids[name])
    wait_for_state(env, job_ids["cancelled"], {"RUNNING"}, timeout_s=60)
    subprocess.run(["scancel", job_ids["cancelled"]], env=env, check=True, timeout=60)
    # The time limit is a minute (Slurm's smallest); then MinJobAge 2 s and the controller's purge pass.
    deadline = time.monotonic() + 240
    while any(scontrol_knows(env, j) for j in job_ids.values()):
        assert time.monotonic() < deadline, "scontrol still knows the jobs after 240 s"
        time.sleep(2)
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", "--json", *(str(tmp_path / n) for n in LIVE_JOBS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stderr == "", done.stderr  # every answer came, no note
    rows = {Path(row["run_dir"]).name: row for row in json.loads(done.stdout)}
    for name, (_, state) in LIVE_JOBS.items():
        row = rows[name]
        assert (row["job_id"], row["state"], row["source"], row["restarts"]) == (job_ids[name], state, "sacct", 0)
    assert done.returncode == 1  # failed, cancelled and timed-out runs make the exit code non-zero
