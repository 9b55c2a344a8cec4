"""A forced save meets the preemption's GraceTime on a real Slurm cluster, with a multi-GB state.

A 168M-parameter GPT with AdamW (2.0 GB of state) checkpoints every step in the background, so a
write is always under way when an `urgent` job preempts it. The partition's GraceTime (set to
GRACE_S on the dev cluster's `batch` for this test: the step of a 2 GB model on one shared CPU
takes ~10 s, and the signal is acted on at a step boundary) is read from Slurm at start-up and
bounds the forced save: whatever it
chooses (it depends on the disk's and the CPU's pace), the job is requeued and resumes from a
complete checkpoint, at the step the `forced_save` event names. Once it has resumed the test
cancels it: training on to the end would only add 2 GB writes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurmtools import (
    job_output,
    lift_requeue_hold,
    of,
    preempt_everything,
    set_grace,
    start_cluster,
    submit,
    wait_finished,
)

from hpctrain.checkpoint import store
from hpctrain.checkpoint.deadline import CHOICES
from hpctrain.checkpoint.forced import WRITES_STOP_STEP

pytestmark = pytest.mark.slurm

GRACE_S = 60
DEV_CLUSTER_GRACE_S = 20  # what scripts/devcluster.py configures, restored afterwards
MAX_STEPS = 8  # never reached: slack for the signal to land before the final step
# 12 x 1024 blocks + a 16384-token vocabulary: 168M parameters, x 12 bytes with AdamW = 2.0 GB.
BIG_GPT = [
    "model=gpt",
    "data=tokens",
    "model.n_layer=12",
    "model.n_embd=1024",
    "model.n_head=16",
    "data.dataset.vocab_size=16384",
    "data.dataset.seq_len=16",
    "data.dataset.num_train=64",
    "data.dataset.num_eval=4",
    "data.batch_size=1",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.ckpt_every=1",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.keep_checkpoints=2",
    "slurm.nodes=1",
    "slurm.ntasks_per_node=1",
]


def wait_for_a_written_checkpoint(run_dir: Path, timeout_s: float = 600) -> None:
    """Until a background write has completed (the forced save then has a measured pace)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "events.jsonl").exists() and of("checkpoint", run_dir):
            return
        time.sleep(0.5)
    raise AssertionError(f"no checkpoint within {timeout_s:.0f} s\n{job_output(run_dir)}")


def wait_for_restart(run_dir: Path, timeout_s: float = 600) -> None:
    """Until the requeued job has resumed (its second `start` event)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(of("start", run_dir)) >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"not restarted within {timeout_s:.0f} s\n{job_output(run_dir)}")


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    env = start_cluster()
    set_grace(env, GRACE_S)
    yield env
    set_grace(env, DEV_CLUSTER_GRACE_S)


def test_a_preempted_multi_gb_save_meets_the_grace_time_and_resumes_from_a_complete_checkpoint(
    env: dict[str, str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "big"
    (job_id,), _ = submit(env, run_dir, *BIG_GPT)
    wait_for_a_written_checkpoint(run_dir)
    urgent = preempt_everything(env)
    lift_requeue_hold(env, job_id, timeout_s=300)
    assert wait_finished(env, urgent) == "COMPLETED"
    wait_for_restart(run_dir)
    subprocess.run(["scancel", job_id], env=env, check=True)
    wait_finished(env, job_id)

    forced = of("forced_save", run_dir)[0]  # the preemption's (the scancel above makes another)
    output = job_output(run_dir)
    assert forced["reason"] == "preempt" and forced["forced_save"] in CHOICES, forced
    # The GraceTime came from Slurm (the default when unreadable is 30 s), counted from the signal.
    assert 0 < forced["deadline_s"] <= GRACE_S, forced
    assert forced["took_s"] < GRACE_S, forced  # done before Slurm's SIGKILL
    assert "could not read the partition's GraceTime" not in output
    # The agreement to stop was journaled before that save started, with the deadline it had.
    stop = of("stop", run_dir)[0]
    assert (stop["step"], stop["reason"], stop["deadline_s"]) == (forced["step"], "preempt", forced["deadline_s"])
    assert stop["time"] <= forced["time"] - forced["took_s"] + 0.01, (stop, forced)
    starts = of("start", run_dir)
    assert [s["restart"] for s in starts[:2]] == [0, 1], starts
    # The second life resumes where the event said, from a complete checkpoint.
    assert forced["time"] < starts[1]["time"] and forced["resume_step"] >= 1  # a checkpoint was complete
    assert starts[1]["resumed_from_step"] == forced["resume_step"], (starts, forced)
    assert forced["redo_steps"] == forced["step"] - forced["resume_step"]
    first_life = [e for e in of("checkpoint", run_dir) if e["time"] < starts[1]["time"]]
    stop_saves = [e for e in first_life if e["reason"] == "preempt"]
    if forced["forced_save"] in WRITES_STOP_STEP:
        assert [(e["step"], e["forced_save"]) for e in stop_saves] == [(forced["step"], forced["forced_save"])]
        assert forced["redo_steps"] == 0
    else:
        assert stop_saves == [] and forced["redo_steps"] > 0
    if forced["forced_save"] == "abandoned_inflight":
        assert forced["inflight_step"] not in [e["step"] for e in first_life]
    assert [e["cause"] for e in of("requeue", run_dir)][:1] == ["preempt"]
    # The checkpoint resumed from is whole (its sha256 is checked again) and multi-GB.
    resumed = store.paths_for(run_dir / "checkpoints", forced["resume_step"])
    if forced["resume_step"] in [e.step for e in store.entries(run_dir / "checkpoints")]:
        assert store.verify(resumed)["size"] > 2e9
    assert f"resumed from step {forced['resume_step']}" in job_output(run_dir)


def test_a_qos_grace_time_is_read_from_slurms_accounting() -> None:
    """Under PreemptType=preempt/qos a preempted job's grace is its QOS's GraceTime: read with
    sacctmgr from the dev cluster's slurmdbd, as it prints it (`00:00:00`; `00:02:00` once the
    QOS is given 120 s), and set back."""
    import os

    from hpctrain.checkpoint.deadline import _read_qos_grace

    env = start_cluster()  # the cluster with accounting (slurmdbd on MariaDB)
    saved = dict(os.environ)
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    os.environ["PATH"] = env.get("PATH", os.environ.get("PATH", ""))
    modify = ["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set"]
    try:
        assert _read_qos_grace("normal") == 0.0
        subprocess.run([*modify, "GraceTime=120"], env=env, check=True, capture_output=True)
        assert _read_qos_grace("normal") == 120.0
    finally:
        subprocess.run([*modify, "GraceTime=0"], env=env, capture_output=True)
        os.environ.clear()
        os.environ.update(saved)
