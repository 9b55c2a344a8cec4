"""Three rows of the recovery table (tests/test_decide.py) on the real dev cluster, side by side:
a drained spare when the time-limit warning comes, a training node failing after the warning, and
a life that dies before `start` after a time-limit stop.

The warning is sent as Slurm sends it at `--signal=B:USR2@N`: to the batch shell only
(`scancel --batch --signal=USR2`), at a chosen step rather than at a time the machine's speed
decides. Node use is planned: the two three-node jobs never run a fault while the other trains,
and the one-node job stays off the node that is set down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.paced import PACED, PAUSE_ENV
from helpers.resumes import newest_checkpoint_before
from slurmtools import (
    ENDED,
    Reference,
    events,
    job_field,
    job_output,
    job_state,
    of,
    same_weights,
    signal_batch,
    start_cluster,
    submit,
    wait_for_state,
    wait_for_step,
    with_test_helpers,
)

from hpctrain.slurm.env import parse_node_list

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# A small paced model: each step takes at least 100 ms in a job (PAUSE_ENV), so a signal sent at
# step 20 finds it training; the unpaced reference trains the same config to the same weights.
TRAIN = [
    *PACED,
    "trainer.max_steps=120",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=20",
]
PAUSE_S = "0.1"
# Two training nodes, one CPU each, and an idle spare: all three nodes of the dev cluster, one
# of each node's two CPUs, so a second such job or the one-node job fits beside it.
WITH_SPARE = ["slurm.nodes=2", "slurm.ntasks_per_node=1", "slurm.spare_nodes=1"]
USR2_BIT = 1 << (signal.SIGUSR2 - 1)  # its bit in /proc/PID/status's pending-signal masks
# A requeued job's ~120 s hold, lifted two seconds on: slurmd refuses a start in the very second
# of the requeue ("Killing non-startable batch job: Job credential revoked", and the job ends
# FAILED), since it compares the new credential's time with the revocation's in whole seconds.
# Slurm's own hold is there for that; two seconds are enough.
SAFE_START = "StartTime=now+2"


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return start_cluster()


def scontrol(env: dict[str, str], *words: str) -> None:
    done = subprocess.run(["scontrol", *words], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"scontrol {' '.join(words)}: {done.stderr.strip()}"


def resume(env: dict[str, str], node: str) -> None:
    """Back in service. ReturnToService=2 brings a downed node back by itself once its slurmd
    answers: Slurm then refuses `resume` ("Invalid node state"), and the node is up all the same."""
    update = ["scontrol", "update", f"nodename={node}", "state=resume"]
    done = subprocess.run(update, env=env, capture_output=True, text=True)
    state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True).stdout
    assert done.returncode == 0 or state.split()[:1] in (["idle"], ["mixed"], ["allocated"]), done.stderr + state


def warn(env: dict[str, str], job_id: str) -> None:
    """The time-limit warning as `--signal=B:USR2@N` delivers it: to the batch shell only."""
    signal_batch(env, job_id)  # tried again while slurmctld answers "Invalid job id" under load


def worker_pid(job_id: str, node: str, timeout_s: float = 30) -> int:
    """The training process of `job_id` on fake node `node` (every node runs on this machine):
    the one slurmstepd started, not a process it forked itself."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = {}
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if wanted <= set(environ.read_bytes().split(b"\0")) and is_worker(environ.parent):
                    workers[int(environ.parent.name)] = parent_pid(environ.parent)
            except OSError:  # it ended meanwhile
                continue
        started_by_slurm = [pid for pid, parent in workers.items() if parent not in workers]
        if len(started_by_slurm) == 1:
            return started_by_slurm[0]
        time.sleep(0.2)
    raise AssertionError(f"no single training process of job {job_id} on {node} within {timeout_s:.0f} s")


def is_worker(proc: Path) -> bool:
    return b"hpctrain.worker" in (proc / "cmdline").read_bytes()


def parent_pid(proc: Path) -> int:
    status = (proc / "status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("PPid:")).split()[1])


def wait_pending_signal(pid: int, bit: int, timeout_s: float = 30) -> None:
    """Until `pid` (stopped, so it cannot take it) holds the signal `bit` pending."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
        if any(mask & bit for mask in masks):
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} got no USR2 within {timeout_s:.0f} s")


def latest_step(run_dir: Path) -> int:
    """The last step in the run's metrics.jsonl (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    complete = [json.loads(line) for line in lines if line.strip().endswith("}")]
    return complete[-1]["step"] if complete else 0


def wait_all_ended(env: dict[str, str], jobs: dict[str, str], timeout_s: float) -> dict[str, str]:
    """Until every job has ended, starting each requeued one at once (its ~120 s BeginTime hold
    lifted, as tests/slurmtools.py's lift_holds does for one job); returns name -> end state."""
    deadline, states = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        states = {name: job_state(env, job_id) for name, job_id in jobs.items()}
        if all(state in ENDED for state in states.values()):
            return states
        for name, job_id in jobs.items():
            if states[name] == "PENDING" and job_field(env, job_id, "Reason") == "BeginTime":
                # Not `now`: see SAFE_START.
                subprocess.run(["scontrol", "update", f"jobid={job_id}", SAFE_START], env=env, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"not all ended after {timeout_s:.0f} s: {states}")


def fail_a_node_after_the_warning(env: dict[str, str], job_id: str, run_dir: Path, touched: set[str]) -> str:
    """The warning, then a training node set down before the step ended; returns the node."""
    wait_for_step(run_dir, 20, timeout_s=180)
    victim = of("start", run_dir)[0]["nodes"][1]  # not the batch node
    # The victim's task is stopped first, so the step cannot end between the warning and
    # the node failure; the warning is seen pending on it (it went shell -> srun -> tasks).
    stopped = worker_pid(job_id, victim)
    os.kill(stopped, signal.SIGSTOP)
    warn(env, job_id)
    wait_pending_signal(stopped, USR2_BIT)
    touched.add(victim)
    scontrol(env, "update", f"nodename={victim}", "state=down", "reason=hpctrain-test")
    wait_for_state(env, job_id, {"PENDING"}, 120)
    # Two nodes are left for the three it held: the requeue keeps the failed one out and gives up
    # the spare, so the job starts again while the node is still down (before: it kept none out
    # and waited, 3 nodes held, for the node's repair). The ~120 s hold is lifted as every
    # recovery test does; no other help.
    scontrol(env, "update", f"jobid={job_id}", SAFE_START)
    wait_for_state(env, job_id, {"RUNNING"}, 120)
    resume(env, victim)  # back for the 3-node job submitted next
    return victim


def fault_at_step_20(env: dict[str, str], jobs: dict[str, str], runs: dict[str, Path], touched: set[str]) -> str:
    """Each gets its fault at step 20, whichever of the two starts first (they compete for CPUs):
    the one-node job the warning alone; the other, its idle spare drained, then the warning.
    Returns the drained spare (it may be the node the first job lost, back in service since)."""
    drained: list[str] = []

    def drain_spare_and_warn() -> None:
        allocated = parse_node_list(job_field(env, jobs["drained_spare"], "NodeList") or "")
        (spare,) = set(allocated) - set(of("start", runs["drained_spare"])[0]["nodes"])
        touched.add(spare)
        drained.append(spare)
        scontrol(env, "update", f"nodename={spare}", "state=drain", "reason=maintenance")
        warn(env, jobs["drained_spare"])

    faults = {
        "dies_before_start": lambda: warn(env, jobs["dies_before_start"]),
        "drained_spare": drain_spare_and_warn,
    }
    deadline = time.monotonic() + 240
    while faults and time.monotonic() < deadline:
        for name in [name for name in faults if latest_step(runs[name]) >= 20]:
            faults.pop(name)()
        time.sleep(0.2)
    assert not faults, f"{sorted(faults)}: no step 20 within 240 s"
    # Requeued for the time limit, the job starts again on its two training nodes, its spare
    # given up, while the spare is still drained (before: it waited for the maintenance's end).
    return drained[0]


def test_recovery_after_the_time_limit_warning_side_by_side(slurm_env, tmp_path: Path) -> None:
    env = {**slurm_env, "PYTHONPATH": with_test_helpers(slurm_env)}
    paced = {**env, PAUSE_ENV: PAUSE_S}
    runs = {name: tmp_path / name for name in ("node_fails", "dies_before_start", "drained_spare")}
    reference = Reference(env, tmp_path / "reference", [*TRAIN, "trainer.nprocs=2"])
    jobs: dict[str, str] = {}
    touched: set[str] = set()  # nodes drained or set down here: resumed whatever happens
    try:
        jobs["node_fails"] = submit(paced, runs["node_fails"], *TRAIN, *WITH_SPARE)[0][0]
        victim = fail_a_node_after_the_warning(slurm_env, jobs["node_fails"], runs["node_fails"], touched)

        # ---- the other two, submitted together once no node will fail any more -------------
        # The one-node job's tasks start through a wrapper that cannot start in a restarted
        # life (like a container image that no longer starts); its control steps run outside it.
        wrapper = '[ "$(printenv SLURM_RESTART_COUNT || echo 0)" = 0 ] || exit 3; exec "$@"'
        configs = {
            "dies_before_start": [
                *TRAIN,
                "slurm.restart_budget.crash=1",
                f"slurm.task_prefix=[bash,-c,'{wrapper}',wrapper]",
                f"slurm.control_python={sys.executable}",
            ],
            "drained_spare": [*TRAIN, *WITH_SPARE],
        }
        with ThreadPoolExecutor() as pool:
            submitted = {name: pool.submit(submit, paced, runs[name], *config) for name, config in configs.items()}
            jobs.update({name: future.result()[0][0] for name, future in submitted.items()})

        spare = fault_at_step_20(slurm_env, jobs, runs, touched)
        states = wait_all_ended(slurm_env, jobs, 600)
    finally:
        for node in touched:  # a node back in service already refuses `resume`: not an error here
            subprocess.run(
                ["scontrol", "update", f"nodename={node}", "state=resume"], env=slurm_env, capture_output=True
            )
        for job_id in jobs.values():
            subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True)
    reference.trained()

    for name in ("node_fails", "drained_spare"):
        assert states[name] == "COMPLETED", job_output(runs[name])
        assert of("relaunch", runs[name]) == [], events(runs[name])
        assert [e["cause"] for e in of("requeue", runs[name])] == ["timelimit"], events(runs[name])
        assert same_weights(runs[name], tmp_path / "reference")

    # The node failed while the stop was under way: no time-limit save; the step was requeued
    # as the time limit says (never relaunched with seconds left) and resumed from the newest
    # complete periodic checkpoint (helpers/resumes.py): 20 once its write had ended, which the
    # test does not wait for (it goes on when step 20 is logged).
    failing = runs["node_fails"]
    failed = of("failure", failing)
    assert [(e["cause"], e["nodes"], e["restart"]) for e in failed] == [("node_failure", [victim], 0)], events(failing)
    requeue = of("requeue", failing)[0]
    assert (requeue["excluded"], requeue["nodes"]) == ([victim], 2), events(failing)
    assert [c["reason"] for c in of("checkpoint", failing)].count("timelimit") == 0
    starts = of("start", failing)
    assert [s["restart"] for s in starts] == [0, 1], events(failing)
    assert victim not in starts[1]["nodes"] and len(starts[1]["nodes"]) == 2, events(failing)
    assert starts[1]["resumed_from_step"] >= newest_checkpoint_before(events(failing), 1), events(failing)

    # The drained spare is neither a failure nor a node to relaunch on: a plain time-limit requeue
    # that resumes at the step it saved.
    drained = runs["drained_spare"]
    assert of("failure", drained) == []
    assert [e["nodes"] for e in of("requeue", drained)] == [2], events(drained)
    assert spare not in of("start", drained)[1]["nodes"], events(drained)
    saved = [c["step"] for c in of("checkpoint", drained) if c["reason"] == "timelimit"]
    starts = of("start", drained)
    assert len(saved) == 1 and [s["resumed_from_step"] for s in starts] == [0, saved[0]], events(drained)

    # Stopped by the time limit once, its next steps die before `start`, before any task's mark:
    # launched again twice (charged to nothing), then each a crash (never taken for the earlier
    # time limit, whose budget is 50); the first is trained again in the job at once, and the
    # second, right after that relaunch, spends crash's budget of 1.
    dying = runs["dies_before_start"]
    assert states["dies_before_start"] == "FAILED", job_output(dying)
    assert [e["cause"] for e in of("requeue", dying)] == ["timelimit"], events(dying)
    assert [e["cause"] for e in of("relaunch", dying)] == ["launch", "launch", "crash"], events(dying)
    assert [s["restart"] for s in of("start", dying)] == [0]
    failures = [(e["cause"], e["restart"]) for e in of("failure", dying)]
    assert failures == [("crash", 1), ("crash", 1), ("budget", 1)], events(dying)
    assert "crash" in of("failure", dying)[-1]["reason"]
