"""The checkpoint filesystem full in a Slurm job: the newest complete checkpoint stays usable.

The run dir lies on a tmpfs of its own (mounted for the test; the dev cluster's nodes are this
machine), shrunk once the submission wrote its code snapshot to what it holds and room for one
checkpoint (1.8 MB) and the logs: the step-50 checkpoint fits, the step-100 one does not. The
write fails with ENOSPC; the job says so in its journal (a `failure`, cause `user_error`:
retrying on the same full disk would fail alike) and ends FAILED, with the step-50 checkpoint
whole and the partial file removed. Its guardian leaves it (a user's mistake). Once there is room
again (the tmpfs grown, as a user clears their quota), `hpctrain-submit --retry RUN_DIR` resumes
it from step 50 and it ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.disks import fill, small_tmpfs
from helpers.paced import PAUSE_ENV
from slurmtools import (
    ENDED,
    Reference,
    job_output,
    job_restarts,
    of,
    same_weights,
    start_cluster,
    submit,
    wait_at_gate,
    wait_finished,
    wait_for_state,
    with_test_helpers,
)

from hpctrain import faults
from hpctrain.checkpoint import store

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TRAIN = [
    "model._target_=helpers.paced.PacedConvNet",
    "trainer.max_steps=200",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.ckpt_every=50",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]
ROOMY = "64m"
# Room for one checkpoint of TRAIN's model (1,839,933 bytes and its 0.6 kB manifest, each in
# whole 4 KiB pages) and 0.8 MB of logs and journal, not for a second checkpoint. Measured from
# what the disk holds once the code snapshot is written, not a fixed size: the snapshot grows
# with the code (a fixed 3.3 MB left no room for the first checkpoint once it passed 1.5 MB).
ONE_CHECKPOINT_AND_LOGS = 1_843_200 + 4096 + 800 * 1024


def room_for_one_checkpoint(disk: Path) -> None:
    """Shrink the tmpfs at `disk` to what it holds now and room for one checkpoint and the logs."""
    stat = os.statvfs(disk)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    subprocess.run(["mount", "-o", f"remount,size={used + ONE_CHECKPOINT_AND_LOGS}", str(disk)], check=True)


def jobs_since(env: dict[str, str], started: str, first: str, until_listed: set[str]) -> tuple[list[str], str]:
    """sacct's ids of the jobs since `started`, from job `first` on, and its output. slurmctld hands
    ended jobs to slurmdbd on its own time: on a loaded machine sacct lists a job seconds after it
    ended, so this asks again (up to a minute) until every job of `until_listed` is there."""
    deadline = time.monotonic() + 60
    while True:
        listed = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State", "-S", started],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        since = [line.split("|")[0] for line in listed.split() if int(line.split("|")[0]) >= int(first)]
        if until_listed <= set(since) or time.monotonic() > deadline:
            return since, listed
        time.sleep(1.0)


def armed_env(env: dict[str, str], gates: Path, arming: str) -> dict[str, str]:
    """A submission's environment with fault points armed, paced, writing no bytecode beside the
    run dir's code snapshot (Python would write about 1.2 MB there, and the disk is sized for the
    checkpoints)."""
    return {**env, PAUSE_ENV: "0.1", "PYTHONDONTWRITEBYTECODE": "1", faults.ENV: arming, faults.GATES_ENV: str(gates)}


def retry_with_room(env: dict[str, str], disk: Path, filler: Path, run_dir: Path, jobs: list[str]) -> None:
    """Room again (the filler gone, the disk grown for every checkpoint), then the retry to its
    end (its job added to `jobs`, which the test cancels whatever happens)."""
    filler.unlink()
    subprocess.run(["mount", "-o", f"remount,size={ROOMY}", str(disk)], check=True)
    jobs.append(retry(env, run_dir))
    assert wait_finished(env, jobs[-1], timeout_s=300) == "COMPLETED", job_output(run_dir)


def retry(env: dict[str, str], run_dir: Path, says: str = "") -> str:
    """`hpctrain-submit --retry RUN_DIR` (paced like the first job): the new job's id."""
    retried = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.submit", "--retry", str(run_dir)],
        env={**env, PAUSE_ENV: "0.1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert says in retried.stdout, retried.stdout
    (new_job,) = re.findall(r"^Submitted batch job (\d+)$", retried.stdout, re.M)
    return new_job


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """The uninterrupted run every test's run must match, trained once for the module beside the
    first test's job: call it for its run dir once a test's jobs ended."""
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    return functools.cache(Reference(env, run_dir, TRAIN).trained)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", ROOMY) as mount:
        yield mount


def test_a_full_checkpoint_disk_keeps_the_newest_checkpoint_and_the_retry_resumes_from_it(
    small_disk: Path, reference: Callable[[], Path], tmp_path: Path
) -> None:
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir = small_disk / "run"
    jobs: list[str] = []
    try:
        # No bytecode beside the run dir's code snapshot: Python would write about 1.2 MB of it
        # there (the suite lets it, tests/conftest.py), and the disk is sized for the checkpoints.
        (job,), _ = submit({**env, PAUSE_ENV: "0.1", "PYTHONDONTWRITEBYTECODE": "1"}, run_dir, *TRAIN)
        jobs.append(job)
        room_for_one_checkpoint(small_disk)  # seconds before its first checkpoint (torch still imports)
        assert wait_finished(slurm_env, job, timeout_s=300) == "FAILED", job_output(run_dir)

        # The step-100 write failed for want of room; step 50 is whole and nothing partial is left.
        (failure,) = of("failure", run_dir)
        assert failure["cause"] == "user_error", failure
        assert "No space left on device" in failure["message"], failure
        assert [c["step"] for c in of("checkpoint", run_dir)] == [50]
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
            "step_00000050.json",
            "step_00000050.pt",
        ]
        found = store.load_newest(run_dir / "checkpoints")
        assert found is not None and found[0].step == 50
        assert "No space left on device" in job_output(run_dir)

        # Room again: the retry resumes from step 50, the run's newest complete checkpoint.
        subprocess.run(["mount", "-o", f"remount,size={ROOMY}", str(small_disk)], check=True)
        new_job = retry(env, run_dir, says="resumes from step 50")
        jobs.append(new_job)
        assert wait_finished(slurm_env, new_job, timeout_s=300) == "COMPLETED", job_output(run_dir)
    finally:
        subprocess.run(["scancel", *jobs], env=slurm_env, capture_output=True)

    starts = [(s["job_id"], s["resumed_from_step"]) for s in of("start", run_dir)]
    assert starts == [(jobs[0], 0), (jobs[1], 50)], starts
    assert same_weights(run_dir, reference())


def test_a_run_dir_with_no_room_is_not_submitted_again_by_the_guardian(
    small_disk: Path, reference: Callable[[], Path], tmp_path: Path
) -> None:
    """The run dir's filesystem all but full (another job's output, a user's files: 16 KiB left)
    when the batch script dies before anything was recorded: the guardian would submit the run
    again (nobody ended it on purpose), but it probes the run dir first (64 KiB written, synced,
    removed) and submits nothing, saying why: the new job would fail at its first checkpoint.
    Once there is room, `hpctrain-submit --retry` runs it to the end, bit-identical."""
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = small_disk / "run", tmp_path / "gates"
    # Held at slurm.setup while the test fills the disk, then the batch shell killed before its
    # `control begin` (as an OOM killer would): the job ends FAILED, nothing recorded.
    armed = armed_env(env, gates, "batch.setup=gate:300,batch.before_begin=kill")
    jobs: list[str] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    try:
        (job,), _ = submit(armed, run_dir, *TRAIN)
        jobs.append(job)
        reached, opened = faults.gate_files(gates, "batch.setup")
        wait_at_gate(slurm_env, job, reached, 180)
        # 16 KiB left: room for a few lines of output (the guardian says why it stops), not for
        # a job's start, metrics and checkpoints.
        filler = fill(small_disk, leave=16 * 1024)
        opened.touch()
        assert wait_finished(slurm_env, job, timeout_s=300) == "FAILED", job_output(run_dir)
        guardian = json.loads((run_dir / "submission.json").read_text())["guardian_job_id"]
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "FAILED"  # it said why, and left it
        assert json.loads((run_dir / "submission.json").read_text())["job_id"] == job  # nothing new
        assert "has no room (No space left on device)" in (run_dir / f"guardian-{guardian}.out").read_text()
        # Slurm's own list of every job since this one: the run's job and its guardian, no third.
        since, listed = jobs_since(slurm_env, started, job, until_listed={job, guardian})
        assert sorted(since) == sorted([job, guardian]), listed  # ids grow: none before this job

        # Room again: the retry trains it from the start (nothing was recorded) to the end.
        retry_with_room(env, small_disk, filler, run_dir, jobs)
    finally:
        subprocess.run(["scancel", *jobs], env=slurm_env, capture_output=True)
    assert [s["job_id"] for s in of("start", run_dir)] == [jobs[1]]
    assert of("requeue", run_dir) == []  # the guardian recorded nothing: there was no room
    assert same_weights(run_dir, reference())


def test_a_disk_full_before_control_begin_ends_the_job_and_the_retry_trains_it(
    small_disk: Path, reference: Callable[[], Path], tmp_path: Path
) -> None:
    """The run dir's disk filled while the batch script waits before `control begin` (nothing
    recorded yet): `control begin` cannot take the life's generation (hpctrain.run.generations)
    and says so in one line; nothing is launched (before generations, the training process
    launched and left with the user's error, exit 78; before that, an OSError traceback, exit 1,
    charged as a crash and retried on the same full disk). The job ends FAILED, never requeued,
    nothing written to the run dir's journal; its guardian finds no room and submits nothing.
    Once there is room, `hpctrain-submit --retry` trains the run from the start to the end,
    bit-identical.

    (Why this moment and not `after-step`: a full tmpfs still takes an append that fits in the
    last page a file already holds, so whether a later journal line fails depends on where the
    file ends. The `start` is the journal's first line: its page must be new.)"""
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = small_disk / "run", tmp_path / "gates"
    armed = armed_env(env, gates, "batch.before_begin=gate:300")
    jobs: list[str] = []
    try:
        (job,), _ = submit(armed, run_dir, *TRAIN)
        jobs.append(job)
        reached, opened = faults.gate_files(gates, "batch.before_begin")
        wait_at_gate(slurm_env, job, reached, 300)
        filler = fill(small_disk)
        opened.touch()
        assert wait_finished(slurm_env, job, timeout_s=300) == "FAILED", job_output(run_dir)
        assert job_restarts(slurm_env, job) == 0, job_output(run_dir)
        # No training step was launched: the life could not even take its generation.
        steps = subprocess.run(
            ["sacct", "-n", "-P", "-j", f"{job}.0", "-o", "ExitCode"], env=slurm_env, capture_output=True, text=True
        )
        assert steps.stdout.split() == [], steps.stdout
        said = job_output(run_dir)
        assert f"the run dir {run_dir} has no room (No space left on device)" in said, said
        assert "Traceback" not in said, said
        assert not [p for p in (run_dir / "generations").iterdir() if p.name.startswith(".")]  # no torn try
        guardian = json.loads((run_dir / "submission.json").read_text())["guardian_job_id"]
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "FAILED"  # no room: it left it
        assert json.loads((run_dir / "submission.json").read_text())["job_id"] == job  # nothing new
        assert not (run_dir / "events.jsonl").exists() or of("start", run_dir) == []

        # Room again: the retry trains it from the start to the end.
        retry_with_room(env, small_disk, filler, run_dir, jobs)
    finally:
        subprocess.run(["scancel", *jobs], env=slurm_env, capture_output=True)
    assert [(s["job_id"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(jobs[1], 0)]
    assert of("requeue", run_dir) == []  # no decision was kept
    assert same_weights(run_dir, reference())


def end_at_page(path: Path, past: int = 0) -> None:
    """Append a blank line (spaces: every reader skips it) so that `path` ends `past` bytes after a
    page boundary of its filesystem: 0 leaves its last page no room, so the next append needs a
    new page; 1 gives it a fresh page with all but a byte free. A real file ends anywhere in its
    last page; this puts it at the end that the test needs, before the disk is filled."""
    page = os.statvfs(path).f_frsize
    size = path.stat().st_size
    pad = (past - size) % page
    if pad == 0:
        return
    with open(path, "ab") as file:
        file.write(b" " * (pad - 1) + b"\n")
    assert path.stat().st_size % page == past


def test_a_disk_full_while_after_step_judges_ends_the_job_and_the_retry_resumes(
    small_disk: Path, reference: Callable[[], Path], tmp_path: Path
) -> None:
    """The run dir's disk filled while the control step is about to judge a step that ended with
    a rank killed (a requeue, had there been room): the decision cannot be journaled, so it is
    not acted on. The control step says why in one line (no traceback); the job ends FAILED, not
    requeued; its guardian finds no room and submits nothing; once there is room,
    `hpctrain-submit --retry` resumes from step 50 and ends bit-identical.

    A full tmpfs takes an append that fits in the page a file already holds: the journal is made
    to end at a page boundary before the disk is filled (its next line needs a new page, as at a
    real journal's page end), and the job's output to start a fresh page (so its last lines, the
    one-line reason, still fit)."""
    slurm_env = start_cluster()
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    run_dir, gates = small_disk / "run", tmp_path / "gates"
    armed = armed_env(env, gates, "trainer.step=kill@70,control.after_step=gate:300")
    jobs: list[str] = []
    try:
        (job,), _ = submit(armed, run_dir, *TRAIN)
        jobs.append(job)
        reached, opened = faults.gate_files(gates, "control.after_step")
        wait_at_gate(slurm_env, job, reached, 300)
        journal, output = run_dir / "events.jsonl", run_dir / f"slurm-{job}.out"
        before = journal.read_bytes()
        end_at_page(journal)
        end_at_page(output, past=1)
        filler = fill(small_disk)
        opened.touch()
        assert wait_finished(slurm_env, job, timeout_s=300) == "FAILED", job_output(run_dir)
        assert job_restarts(slurm_env, job) == 0, job_output(run_dir)
        said = job_output(run_dir)
        assert f"the run dir {run_dir} has no room (No space left on device)" in said, said
        assert "Traceback" not in said, said
        # Nothing of the decision was kept: the journal is what it was at the gate (and the pad).
        assert journal.read_bytes().rstrip() == before.rstrip()
        guardian = json.loads((run_dir / "submission.json").read_text())["guardian_job_id"]
        assert wait_for_state(slurm_env, guardian, ENDED, 300) == "FAILED"  # no room: it left it
        assert json.loads((run_dir / "submission.json").read_text())["job_id"] == job  # nothing new

        # Room again: the retry resumes from step 50, the newest complete checkpoint.
        retry_with_room(env, small_disk, filler, run_dir, jobs)
    finally:
        subprocess.run(["scancel", *jobs], env=slurm_env, capture_output=True)
    assert [(s["job_id"], s["resumed_from_step"]) for s in of("start", run_dir)] == [(jobs[0], 0), (jobs[1], 50)]
    assert of("requeue", run_dir) == []  # the first life's requeue was never kept
    assert same_weights(run_dir, reference())
