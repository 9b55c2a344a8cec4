"""The chaos soak's hands on the cluster (scripts/chaos.py): the reference, the job, its state,
its nodes and processes, and the clean-up at the end.

Every call to Slurm is checked; one that fails raises ChaosError with Slurm's own words, except
where a refusal is an answer (a node already back in service refuses `state=resume`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from chaos_report import alive_processes
from chaos_soak import (
    ENDED,
    PACE_S,
    PAUSE_ENV,
    REPO,
    STUCK_S,
    WAITING_REASONS,
    ChaosError,
    Fault,
    Soak,
    drain_held,
    note_next_step,
    starts_of,
)
from job_processes import processes, rank_pids


def cluster_env(directory: str | None, port_base: int | None) -> dict[str, str]:
    import devcluster

    slurm = devcluster.ensure_cluster(3, 2, directory or devcluster.DEFAULT_DIR, port_base=port_base)
    env = {**os.environ, **slurm, "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # helpers.paced (the paced ConvNet) lives with the tests; the job inherits this environment.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "tests"), env.get("PYTHONPATH", "")) if p)
    env.pop(PAUSE_ENV, None)
    return env


def slurm(env: dict[str, str], *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(command), env=env, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise ChaosError(f"`{' '.join(command)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done


def start_reference(env: dict[str, str], run_dir: Path, config: list[str]) -> subprocess.Popen[str]:
    """The uninterrupted run, on this machine, at low priority (the soak's job comes first)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # Starved by the soak, it may go 20 s without a step: no hang or collective timeouts here
    # (they change no weight).
    quiet = ["trainer.hang_timeout_s=0", "trainer.collective_timeout_s=1800", "trainer.nprocs=2"]
    command = [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={run_dir}", *config, *quiet]
    with open(run_dir.parent / "reference.log", "w") as log:  # the child keeps its own copy
        return subprocess.Popen(
            command,
            cwd=run_dir.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.nice(10),
        )


def finish_reference(reference: subprocess.Popen[str], timeout_s: float = 1800) -> None:
    if reference.wait(timeout=timeout_s) != 0:
        raise ChaosError(f"the reference run failed (exit {reference.returncode}); see reference.log")


def submit(env: dict[str, str], run_dir: Path, config: list[str]) -> str:
    paced = {**env, PAUSE_ENV: str(PACE_S)}
    command = [sys.executable, "-m", "hpctrain.cli.submit", f"hydra.run.dir={run_dir}", "cluster=devcluster", *config]
    done = subprocess.run(command, env=paced, capture_output=True, text=True, cwd=run_dir.parent, timeout=300)
    found = re.findall(r"^Submitted batch job (\d+)$", done.stdout, re.M)
    if done.returncode != 0 or len(found) != 1:
        raise ChaosError(f"hpctrain-submit failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return found[0]


def job_state(env: dict[str, str], job_id: str) -> tuple[str | None, str | None]:
    """(JobState, Reason); (None, None) once Slurm has forgotten the job."""
    done = slurm(env, "scontrol", "show", "job", "-o", job_id, check=False)
    state, reason = re.search(r"\bJobState=(\S+)", done.stdout), re.search(r"\bReason=(\S+)", done.stdout)
    return (state.group(1) if state else None), (reason.group(1) if reason else None)


class StuckWatch:
    """Tells a job that waits for something that will not come (BadConstraints: it asks for more
    nodes than its exclusions leave) from one waiting its turn or its requeue hold."""

    def __init__(self) -> None:
        self.since: float | None = None

    def stuck(self, state: str | None, reason: str | None) -> bool:
        waiting_badly = state == "PENDING" and reason not in WAITING_REASONS
        self.since = (self.since or time.monotonic()) if waiting_badly else None
        return self.since is not None and time.monotonic() - self.since > STUCK_S


def follow(soak: Soak) -> None:
    """The job that carries the run on, as submission.json names it: a guardian that found the
    job lost with its batch node, or a keeper that found its batch script gone, submits the run
    dir again, and the soak follows the new job."""
    try:
        submission = json.loads((soak.run_dir / "submission.json").read_text())
    except (OSError, ValueError):  # being rewritten: look again next time
        return
    job, guardian = submission.get("job_id"), submission.get("guardian_job_id")
    if guardian and guardian not in soak.guardian_ids:
        soak.guardian_ids.append(guardian)
    if job and job not in soak.job_ids:
        soak.job_ids.append(job)
        print(f"chaos: the run goes on in job {job} (submitted again by its guardian or keeper)", flush=True)


def carried_on(env: dict[str, str], soak: Soak) -> bool:
    """Whether the run may still go on after its job ended: its guardian has not run yet (it
    submits the run again when nobody ended it on purpose). Follows a new job."""
    follow(soak)
    state, _ = job_state(env, soak.job_ids[-1])
    if state not in ENDED and state is not None:
        return True
    guardian = soak.guardian_ids[-1] if soak.guardian_ids else None
    pending = guardian is not None and job_state(env, guardian)[0] not in (*ENDED, None)
    follow(soak)
    return pending or job_state(env, soak.job_ids[-1])[0] not in (*ENDED, None)


def lift_hold(env: dict[str, str], job_id: str) -> None:
    """A requeued job waits ~120 s for its BeginTime: start it now (root on the dev cluster)."""
    state, reason = job_state(env, job_id)
    if state == "PENDING" and reason == "BeginTime":
        # now+2, not now: Slurm refuses a start in the same second as the requeue (whole seconds
        # compared: "Job credential revoked") and the job ends FAILED.
        done = slurm(env, "scontrol", "update", f"jobid={job_id}", "StartTime=now+2", check=False)
        if done.returncode != 0:  # the job may have started meanwhile: say so, go on waiting
            print(f"chaos: could not lift job {job_id}'s hold: {done.stderr.strip()}", file=sys.stderr)


def resume_nodes(env: dict[str, str], soak: Soak, every: bool = False) -> None:
    """Bring downed and drained nodes back (ReturnToService may have done it for a down one),
    but for a node the last fault drained while the job has neither left it nor ridden the drain
    out (every=True: that one too, the soak's end)."""
    held = set() if every else drain_held(soak)
    for node in sorted(soak.touched_nodes - held):
        shown = slurm(env, "scontrol", "show", "node", "-o", node).stdout
        state = re.search(r"\bState=(\S+)", shown)
        if state and re.search(r"DOWN|DRAIN|FAIL", state.group(1)):
            slurm(env, "scontrol", "update", f"nodename={node}", "state=resume")
    soak.touched_nodes &= held


def batch_host(env: dict[str, str], soak: Soak) -> str | None:
    """The node running the job's batch script, while the job runs."""
    done = slurm(env, "scontrol", "show", "job", "-o", soak.job_ids[-1], check=False)
    state, batch = re.search(r"\bJobState=(\S+)", done.stdout), re.search(r"\bBatchHost=(\S+)", done.stdout)
    return batch.group(1) if state and state.group(1) == "RUNNING" and batch else None


def victim_node(env: dict[str, str], soak: Soak, fault: Fault) -> str | None:
    """A training node of the running life other than the batch node (whose loss ends the job)."""
    starts = starts_of(soak.run_dir)
    done = slurm(env, "scontrol", "show", "job", "-o", soak.job_ids[-1], check=False)
    batch = re.search(r"\bBatchHost=(\S+)", done.stdout)
    if not starts or not batch:
        return None
    candidates = sorted(n for n in starts[-1].nodes if n != batch.group(1))
    return candidates[fault.node_pick % len(candidates)] if candidates else None


def rank_pid(soak: Soak, rank: int) -> int | None:
    """Rank `rank` of the running life's newest step (a relaunch's, not the one it replaced)."""
    pids = rank_pids(soak.job_ids[-1], rank, processes(str(soak.run_dir)))
    return pids[0] if len(pids) == 1 else None


# ---- the end -----------------------------------------------------------------------------------


def wait_done(env: dict[str, str], soak: Soak, timeout_s: float) -> None:
    """Until the last job ends, lifting holds; a job stuck PENDING for another reason is told."""
    deadline, stuck = time.monotonic() + timeout_s, StuckWatch()
    while time.monotonic() < deadline:
        job = soak.job_ids[-1]
        resume_nodes(env, soak)
        lift_hold(env, job)
        note_next_step(soak)
        state, reason = job_state(env, job)
        if (state in ENDED or state is None) and not carried_on(env, soak):
            note_next_step(soak)
            soak.final_state = job_state(env, soak.job_ids[-1])[0] or "GONE"
            return
        if stuck.stuck(state, reason):
            soak.final_state = f"STUCK (PENDING, Reason={reason} for {STUCK_S:.0f} s)"
            return
        time.sleep(1.0)
    soak.final_state = f"TIMEOUT ({job_state(env, soak.job_ids[-1])[0]} after {timeout_s:.0f} s)"


def thaw_all(soak: Soak) -> None:
    """Every thaw still to come, now (the soak's end: no process left stopped)."""
    for thaw in soak.thaws:
        if thaw.is_alive():
            thaw.cancel()
            thaw.function(*thaw.args)
    soak.thaws.clear()


def clean_up(env: dict[str, str], soak: Soak) -> None:
    """Note what outlived the run (a check), then make sure nothing does."""
    thaw_all(soak)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (jobs_left(env, soak) or alive_processes(soak.run_dir)):
        time.sleep(1.0)
    soak.jobs_left = jobs_left(env, soak)
    soak.processes_left = [pid for pid, _ in alive_processes(soak.run_dir)]
    for job in soak.jobs_left:
        slurm(env, "scancel", job, check=False)
    for pid in soak.processes_left:
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    resume_nodes(env, soak, every=True)


def jobs_left(env: dict[str, str], soak: Soak) -> list[str]:
    done = slurm(env, "squeue", "-h", "-o", "%i")
    return [job for job in done.stdout.split() if job in (*soak.job_ids, *soak.guardian_ids)]
