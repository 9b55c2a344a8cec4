"""hpctrain-status names a job that waits for nodes it excludes itself, with the command that lets
it start (hpctrain.status.starved_note), on a real Slurm cluster: the job's ExcNodeList set as the
control step's requeue sets it (`scontrol update JobId=J ExcNodeList=node1`), another node drained,
so that the one node left is too few for its 2 (Reason=ReqNodeNotAvail). Nothing of hpctrain runs
while such a job waits; the user is told, and Slurm's own command from the note lets it start."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmtools import cancel_run, job_field, node_state, start_cluster, submit

pytestmark = [pytest.mark.slurm]

QUEUED_HELD = ["slurm.nodes=2", "slurm.ntasks_per_node=1", "trainer.max_steps=20", "slurm.extra=[--hold]"]


def status(env: dict[str, str], run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.status", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_for_reason(env: dict[str, str], job: str, word: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while not (reason := job_field(env, job, "Reason") or "").startswith(word):
        assert time.monotonic() < deadline, f"job {job}: Reason={reason}, never {word}"
        time.sleep(0.5)
    return reason


def test_a_job_starved_by_its_own_exclusion_is_named_with_the_command_that_lets_it_start(tmp_path: Path) -> None:
    env = start_cluster()
    run_dir = tmp_path / "run"
    (job,), _ = submit(env, run_dir, *QUEUED_HELD)
    try:
        subprocess.run(["scontrol", "update", f"JobId={job}", "ExcNodeList=node1"], env=env, check=True)
        node_state(env, "node3", "drain")
        subprocess.run(["scontrol", "release", job], env=env, check=True)
        wait_for_reason(env, job, "ReqNodeNotAvail")
        shown = status(env, run_dir)
        said = re.search(r"note: job (\d+) waits \(([^)]*)\) for nodes it excludes itself: (\S+) is back", shown.stderr)
        assert said and said.groups()[0] == job and said.groups()[2] == "node1", shown.stderr
        command = re.search(r"`(scontrol update [^`]*)`", shown.stderr)
        assert command and command.group(1) == f"scontrol update JobId={job} ExcNodeList=", shown.stderr
        # The user runs it: node1 is let in, and the job no longer waits for its own exclusion.
        subprocess.run(shlex.split(command.group(1)), env=env, check=True)
        assert job_field(env, job, "ExcNodeList") in (None, "(null)")
        deadline = time.monotonic() + 60
        while job_field(env, job, "JobState") == "PENDING":
            assert time.monotonic() < deadline, job_field(env, job, "Reason")
            time.sleep(0.5)
        assert "excludes itself" not in status(env, run_dir).stderr
    finally:
        cancel_run(env, run_dir)
        node_state(env, "node3", "resume")
