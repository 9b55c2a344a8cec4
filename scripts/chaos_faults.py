"""The chaos soak's hands on the cluster (scripts/chaos.py): submit, inject, wait, clean up.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_report import alive_processes, render, report  # noqa: F401  (chaos.py calls them here)
from job_processes import processes, rank_pids

from hpctrain.run.events import Start, read_events

REPO = Path(__file__).resolve().parents[1]
PAUSE_ENV = "HPCTRAIN_TEST_STEP_PAUSE_S"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
# A frozen node comes back this long after: while its run is still recovering or just after (the
# thaw races the relaunch, the keeper's new job, Slurm's DOWN). The batch host later: its keeper
# acts about 30 s after the freeze at the defaults (10 s of silence, a look, a 20 s probe), more
# on a loaded machine; thawed at 40 s it had not acted yet in a soak here.
THAW_AFTER_S = {"node_freeze": 40.0, "batch_freeze": 75.0}
FAULT_WAIT_S = 300.0  # how long a fault may wait for the job to be RUNNING and training again
STUCK_S = 60.0  # PENDING this long for a reason no wait cures: the soak says so and stops
WAITING_REASONS = {"BeginTime", "Priority", "Resources", "None"}
DRAIN_WATCH_S = 10.0  # a job on a drained node should train on: watched this long
# A drained node stays drained (an administrator's maintenance waits for the jobs on it) until the
# job has left it for its spare, or this long: the drain watch's look every slurm.drain_poll_s
# (30 s) and the save at the next step. Resumed any sooner, the watch may never see the drain.
DRAIN_NOTICE_S = 45.0
# A job PENDING this long (for Resources, or Slurm's "Nodes required for job are DOWN, DRAINED...")
# while a node the soak drained is still drained: the drain ends (an administrator's maintenance
# does), see _end_maintenance. Below STUCK_S, so the soak does not give up first.
DRAINED_WAIT_S = 30.0
PACE_S = 0.05  # each step of the job takes at least this long (helpers.paced, from the environment)


class ChaosError(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    number: int
    at_s: float  # earliest injection, seconds after training first logged a step
    kind: str
    rank: int  # for kill_rank / stop_rank: which rank's process
    node_pick: int  # for node_down / node_drain: which training node other than the batch node
    # Overlap mode: injected this many seconds after the fault before it, while the job is still
    # recovering from that one (not once it trains again); None: after the recovery.
    overlap_s: float | None = None


@dataclass
class Injected:
    fault: Fault
    at: float  # UNIX time of the injection
    target: str  # what was hit: node, rank and pid, checkpoint file, the new job id
    job_id: str
    step: int | None  # the last logged step when it was injected
    note: str = ""
    # The first step finished once over the fault (a later life's, or training on after a drain),
    # seen while polling: the next life drops the lines of steps it trains again.
    next_step_at: float | None = None
    next_step: int | None = None


@dataclass
class Soak:
    seed: int
    minutes: float
    run_dir: Path
    reference: Path
    job_ids: list[str] = field(default_factory=list)
    guardian_ids: list[str] = field(default_factory=list)  # the guardians submission.json named
    injected: list[Injected] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    t0: float = 0.0  # when training first logged a step: fault times count from here
    touched_nodes: set[str] = field(default_factory=set)  # downed or drained, to resume
    cluster_dir: str | None = None  # the dev cluster's folder (devcluster.py freeze/thaw act there)
    thaws: list[threading.Timer] = field(default_factory=list)  # frozen nodes' thaws to come
    udp_blocked: bool = False  # --udp-blocked: no heartbeat or keeper ping arrives
    final_state: str = "UNKNOWN"
    jobs_left: list[str] = field(default_factory=list)
    processes_left: list[int] = field(default_factory=list)


# ---- the cluster and the job -------------------------------------------------------------------


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
    held = set() if every else _drain_held(soak)
    for node in sorted(soak.touched_nodes - held):
        shown = slurm(env, "scontrol", "show", "node", "-o", node).stdout
        state = re.search(r"\bState=(\S+)", shown)
        if state and re.search(r"DOWN|DRAIN|FAIL", state.group(1)):
            slurm(env, "scontrol", "update", f"nodename={node}", "state=resume")
    soak.touched_nodes &= held


def _drain_held(soak: Soak) -> set[str]:
    """The node the last fault drained, while the job has not got over that drain yet."""
    if not soak.injected or soak.injected[-1].fault.kind != "node_drain":
        return set()
    return {soak.injected[-1].target} if _recovered_after(soak, settle_s=0.0) is None else set()


def metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    from hpctrain.run.jsonlines import read_jsonl

    return read_jsonl(run_dir / "metrics.jsonl")


def starts_of(run_dir: Path) -> list[Start]:
    """The run's `start` events, oldest first."""
    return [e for e in read_events(run_dir / "events.jsonl") if isinstance(e, Start)]


# ---- the schedule ------------------------------------------------------------------------------


def run_schedule(env: dict[str, str], soak: Soak, plan: list[Fault], config: list[str]) -> None:
    soak.t0 = _wait_training(env, soak, since=lambda: 0.0)
    for fault in plan:
        if not _wait_ready(env, soak, fault):
            return
        injected = INJECT[fault.kind](env, soak, fault, config)
        if fault.overlap_s is not None and soak.injected:
            overlapped = f"{injected.at - soak.injected[-1].at:.1f} s after #{soak.injected[-1].fault.number}"
            injected.note = "; ".join(filter(None, [f"overlapping: {overlapped}", injected.note]))
        soak.injected.append(injected)
        print(
            f"chaos: #{fault.number} {fault.kind} at {injected.at - soak.t0:.1f} s, step {injected.step}: "
            f"{injected.target}{(' (' + injected.note + ')') if injected.note else ''}",
            flush=True,
        )


def _wait_training(env: dict[str, str], soak: Soak, since: Callable[[], float | None]) -> float:
    """Until a step is logged after `since()` (None: not yet known) with the job RUNNING;
    returns that record's time."""
    deadline, stuck = time.monotonic() + FAULT_WAIT_S, StuckWatch()
    pending_since: float | None = None
    while time.monotonic() < deadline:
        follow(soak)
        job = soak.job_ids[-1]
        lift_hold(env, job)
        state, reason = job_state(env, job)
        if (state in ENDED or state is None) and not carried_on(env, soak):
            raise ChaosError(f"job {job} ended ({state}) before training went on")
        if stuck.stuck(state, reason):
            raise ChaosError(f"job {job} stuck: PENDING with Reason={reason} for {STUCK_S:.0f} s")
        waiting = state == "PENDING" and reason not in ("BeginTime", "Dependency")  # the hold is lifted above
        pending_since = (pending_since or time.monotonic()) if waiting else None
        if pending_since is not None and time.monotonic() - pending_since > DRAINED_WAIT_S:
            _end_maintenance(env, soak)
            pending_since = None
        note_next_step(soak)
        after = since()
        fresh = [r for r in metrics_records(soak.run_dir) if after is not None and (r.get("time") or 0) > after]
        if fresh and state == "RUNNING":
            return float(fresh[-1]["time"])
        time.sleep(0.5)
    raise ChaosError(f"not training again within {FAULT_WAIT_S:.0f} s")


def _end_maintenance(env: dict[str, str], soak: Soak) -> None:
    """The job waits for nodes, and a node the soak drained is still drained: an administrator
    ends the maintenance (the soak resumes it), as on a site. Slurm requeued the job on its own
    (an admin's requeue, a preemption) before the drain came, so nobody lowered its node count:
    it asks for its spares too, and waits for the drained node (the row's note says so)."""
    drained = [
        node
        for node in sorted(soak.touched_nodes)
        if re.search(r"\bState=\S*DRAIN", slurm(env, "scontrol", "show", "node", "-o", node).stdout)
    ]
    if not drained or not soak.injected:
        return
    resume_nodes(env, soak, every=True)
    note = f"the requeued job waited {DRAINED_WAIT_S:.0f} s for drained {','.join(drained)}: resumed"
    soak.injected[-1].note = "; ".join(filter(None, [soak.injected[-1].note, note]))
    print(f"chaos: {note}", flush=True)


def _recovered_after(soak: Soak, settle_s: float = DRAIN_WATCH_S) -> float | None:
    """After when a logged step shows the job over the last fault: the start of a new life (every
    fault but a drain ends one; a drain, where the job has a free spare), or some seconds of
    training on once the drain watch had time to act and did not (a drained node is ridden out)."""
    if not soak.injected:
        return 0.0
    last = soak.injected[-1]
    starts = [e.time for e in starts_of(soak.run_dir) if e.time > last.at]
    if starts:
        return starts[0]
    if last.fault.kind == "node_drain" and time.time() > last.at + DRAIN_NOTICE_S:
        return last.at + DRAIN_NOTICE_S + settle_s
    return None


def note_next_step(soak: Soak) -> None:
    """The last fault's first step finished after it (for a drain: any step after it)."""
    if not soak.injected or soak.injected[-1].next_step_at is not None:
        return
    after = _recovered_after(soak, settle_s=0.0)
    fresh = [r for r in metrics_records(soak.run_dir) if after is not None and (r.get("time") or 0) > after]
    if fresh:
        soak.injected[-1].next_step_at, soak.injected[-1].next_step = fresh[0]["time"], fresh[0].get("step")


def _wait_ready(env: dict[str, str], soak: Soak, fault: Fault) -> bool:
    """Until the fault's time has come, the job RUNNING and training again since the last fault,
    and the fault can apply. False (the fault skipped, and the rest) when the job has ended.
    An overlapping fault waits only for its delay after the last one, and until it can apply."""
    if fault.overlap_s is not None and soak.injected:
        return _wait_overlapping(env, soak, fault)
    try:
        _wait_training(env, soak, since=lambda: _recovered_after(soak))
    except ChaosError as error:
        soak.skipped.append(f"#{fault.number} {fault.kind} and later: {error}")
        return False
    resume_nodes(env, soak)
    while time.time() < soak.t0 + fault.at_s or not _applies(env, soak, fault):
        state, _ = job_state(env, soak.job_ids[-1])
        if state != "RUNNING":
            return _wait_ready(env, soak, fault)  # stopped meanwhile (finished, or an earlier fault)
        time.sleep(0.5)
    return True


def _wait_overlapping(env: dict[str, str], soak: Soak, fault: Fault) -> bool:
    """`overlap_s` after the last fault, as soon as this one can apply (a rank to kill needs the
    next life's task: a kill right after a requeued life starts). Skipped alone if it cannot
    apply within FAULT_WAIT_S; False when the run is over."""
    due, deadline = soak.injected[-1].at + (fault.overlap_s or 0.0), time.monotonic() + FAULT_WAIT_S
    while time.time() < due or not _applies(env, soak, fault):
        follow(soak)
        lift_hold(env, soak.job_ids[-1])
        if not carried_on(env, soak):
            soak.skipped.append(f"#{fault.number} {fault.kind} and later: the run ended")
            return False
        if time.monotonic() > deadline:
            soak.skipped.append(f"#{fault.number} {fault.kind}: could not apply within {FAULT_WAIT_S:.0f} s")
            return True  # the next fault waits for the recovery as usual
        time.sleep(0.3)
    return True


def _applies(env: dict[str, str], soak: Soak, fault: Fault) -> bool:
    if fault.kind in ("node_down", "node_drain", "node_freeze"):
        return _victim_node(env, soak, fault) is not None
    if fault.kind in ("kill_rank", "stop_rank"):
        return _rank_pid(soak, fault.rank) is not None
    if fault.kind == "torn_checkpoint":
        return len(_checkpoints(soak.run_dir)) >= 2  # one to tear and one to resume from
    if fault.kind in ("batch_node_down", "batch_freeze"):
        return _batch_host(env, soak) is not None
    if fault.kind in ("time_limit", "admin_requeue"):  # signals and requeues of a running job
        return job_state(env, soak.job_ids[-1])[0] == "RUNNING"
    return True


def _batch_host(env: dict[str, str], soak: Soak) -> str | None:
    """The node running the job's batch script, while the job runs."""
    done = slurm(env, "scontrol", "show", "job", "-o", soak.job_ids[-1], check=False)
    state, batch = re.search(r"\bJobState=(\S+)", done.stdout), re.search(r"\bBatchHost=(\S+)", done.stdout)
    return batch.group(1) if state and state.group(1) == "RUNNING" and batch else None


def _victim_node(env: dict[str, str], soak: Soak, fault: Fault) -> str | None:
    """A training node of the running life other than the batch node (whose loss ends the job)."""
    starts = starts_of(soak.run_dir)
    done = slurm(env, "scontrol", "show", "job", "-o", soak.job_ids[-1], check=False)
    batch = re.search(r"\bBatchHost=(\S+)", done.stdout)
    if not starts or not batch:
        return None
    candidates = sorted(n for n in starts[-1].nodes if n != batch.group(1))
    return candidates[fault.node_pick % len(candidates)] if candidates else None


def _rank_pid(soak: Soak, rank: int) -> int | None:
    """Rank `rank` of the running life's newest step (a relaunch's, not the one it replaced)."""
    pids = rank_pids(soak.job_ids[-1], rank, processes(str(soak.run_dir)))
    return pids[0] if len(pids) == 1 else None


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*.json"))


def _last_step(soak: Soak) -> int | None:
    records = metrics_records(soak.run_dir)
    return records[-1].get("step") if records else None


# ---- the faults --------------------------------------------------------------------------------


def _injected(soak: Soak, fault: Fault, target: str, note: str = "") -> Injected:
    return Injected(fault, time.time(), target, soak.job_ids[-1], _last_step(soak), note)


def node_state(env: dict[str, str], soak: Soak, fault: Fault, state: str) -> Injected:
    node = _victim_node(env, soak, fault)
    assert node is not None  # _applies checked it
    done = _injected(soak, fault, node)
    slurm(env, "scontrol", "update", f"nodename={node}", f"state={state}", "reason=chaos")
    soak.touched_nodes.add(node)
    return done


def batch_node_down(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    """The node running the batch script lost: Slurm ends the job FAILED (it runs with
    --no-kill) and the run's guardian submits it again; the soak follows the new job."""
    node = _batch_host(env, soak)
    assert node is not None  # _applies checked it
    done = _injected(soak, fault, f"{node} (the batch host)")
    slurm(env, "scontrol", "update", f"nodename={node}", "state=down", "reason=chaos")
    soak.touched_nodes.add(node)
    return done


def freeze(env: dict[str, str], soak: Soak, fault: Fault, node: str, what: str) -> Injected:
    """Every process of `node` stopped at once, as a node that dies silently (devcluster.py freeze),
    and continued THAW_AFTER_S later (by kind), as a node whose hang or partition heals: what was frozen
    (the old step's ranks, a batch shell) wakes while the run has moved on."""
    import devcluster

    folder = soak.cluster_dir or devcluster.DEFAULT_DIR
    after_s = THAW_AFTER_S[fault.kind]
    done = _injected(soak, fault, f"{node} ({what}), thawed {after_s:g} s later")
    devcluster.freeze_node(folder, node)
    thaw = threading.Timer(after_s, devcluster.thaw_node, args=(folder, node))
    thaw.daemon = True
    thaw.start()
    soak.thaws.append(thaw)
    soak.touched_nodes.add(node)  # Slurm may have set it DOWN meanwhile
    return done


def thaw_all(soak: Soak) -> None:
    """Every thaw still to come, now (the soak's end: no process left stopped)."""
    for thaw in soak.thaws:
        if thaw.is_alive():
            thaw.cancel()
            thaw.function(*thaw.args)
    soak.thaws.clear()


def node_freeze(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    node = _victim_node(env, soak, fault)
    assert node is not None  # _applies checked it
    return freeze(env, soak, fault, node, "a training node")


def batch_freeze(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    """The batch host silent: its keeper submits the run again and cancels the job; the thawed
    batch shell then finds its life replaced (fencing) and writes nothing."""
    node = _batch_host(env, soak)
    assert node is not None  # _applies checked it
    return freeze(env, soak, fault, node, "the batch host")


def admin_requeue(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    done = _injected(soak, fault, f"scontrol requeue {soak.job_ids[-1]}")
    slurm(env, "scontrol", "requeue", soak.job_ids[-1])
    return done


def preempt(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    done = _injected(soak, fault, "")
    urgent = slurm(
        env, "sbatch", "--parsable", "-p", "urgent", "--exclusive", "-N", "3", "-o", "/dev/null", "--wrap", "sleep 2"
    )
    done.target = f"urgent job {urgent.stdout.strip().split(';')[0]}"
    return done


def signal_rank(soak: Soak, fault: Fault, signum: int) -> Injected:
    pid = _rank_pid(soak, fault.rank)
    assert pid is not None
    done = _injected(soak, fault, f"rank {fault.rank} pid {pid}")
    os.kill(pid, signum)
    return done


def time_limit(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    # What `#SBATCH --signal=B:USR2@N` makes Slurm do N seconds before the limit: USR2 to the
    # batch shell alone.
    done = _injected(soak, fault, "USR2 to the batch shell")
    slurm(env, "scancel", "--signal=USR2", "--batch", soak.job_ids[-1])
    return done


def torn_checkpoint(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    """Preempt the job, and while it waits to run again, truncate its newest checkpoint."""
    done = preempt(env, soak, fault, config)
    deadline = time.monotonic() + 180
    while job_state(env, soak.job_ids[-1])[0] != "PENDING":
        if time.monotonic() > deadline or job_state(env, soak.job_ids[-1])[0] in ENDED:
            done.note = f"the job never went back to PENDING ({job_state(env, soak.job_ids[-1])[0]}): nothing torn"
            return done
        time.sleep(0.5)
    newest = _checkpoints(soak.run_dir)[-1].with_suffix(".pt")
    size = newest.stat().st_size
    os.truncate(newest, size // 2)
    done.target += f"; {newest.name} cut to {size // 2} of {size} bytes"
    return done


def cancel_resubmit(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    done = _injected(soak, fault, f"scancel {soak.job_ids[-1]}")
    slurm(env, "scancel", soak.job_ids[-1])
    deadline = time.monotonic() + 180
    while (state := job_state(env, soak.job_ids[-1])[0]) not in ENDED and state is not None:
        if time.monotonic() > deadline:
            raise ChaosError(f"job {soak.job_ids[-1]} still {state} 180 s after scancel")
        time.sleep(0.5)
    soak.job_ids.append(submit(env, soak.run_dir, config))
    done.target += f", then hpctrain-submit: job {soak.job_ids[-1]}"
    return done


INJECT = {
    "node_down": lambda env, soak, fault, config: node_state(env, soak, fault, "down"),
    "node_drain": lambda env, soak, fault, config: node_state(env, soak, fault, "drain"),
    "preempt": preempt,
    "kill_rank": lambda env, soak, fault, config: signal_rank(soak, fault, signal.SIGKILL),
    "stop_rank": lambda env, soak, fault, config: signal_rank(soak, fault, signal.SIGSTOP),
    "time_limit": time_limit,
    "torn_checkpoint": torn_checkpoint,
    "cancel_resubmit": cancel_resubmit,
    "admin_requeue": admin_requeue,
    "batch_node_down": batch_node_down,
    "node_freeze": node_freeze,
    "batch_freeze": batch_freeze,
}


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


def clean_up(env: dict[str, str], soak: Soak) -> None:
    """Note what outlived the run (a check), then make sure nothing does."""
    thaw_all(soak)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_jobs_left(env, soak) or alive_processes(soak.run_dir)):
        time.sleep(1.0)
    soak.jobs_left = _jobs_left(env, soak)
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


def _jobs_left(env: dict[str, str], soak: Soak) -> list[str]:
    done = slurm(env, "squeue", "-h", "-o", "%i")
    return [job for job in done.stdout.split() if job in (*soak.job_ids, *soak.guardian_ids)]
