"""When the chaos soak (scripts/chaos.py) injects each fault: once the job trains again since the
last one (or, overlapping, seconds after it) and the fault can apply.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from chaos_cluster import (
    StuckWatch,
    batch_host,
    carried_on,
    follow,
    job_state,
    lift_hold,
    rank_pid,
    resume_nodes,
    slurm,
    victim_node,
)
from chaos_faults import INJECT
from chaos_soak import (
    DRAINED_WAIT_S,
    ENDED,
    FAULT_WAIT_S,
    STUCK_S,
    ChaosError,
    Fault,
    Soak,
    checkpoints,
    metrics_records,
    note_next_step,
    recovered_after,
)


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


def _wait_ready(env: dict[str, str], soak: Soak, fault: Fault) -> bool:
    """Until the fault's time has come, the job RUNNING and training again since the last fault,
    and the fault can apply. False (the fault skipped, and the rest) when the job has ended.
    An overlapping fault waits only for its delay after the last one, and until it can apply."""
    if fault.overlap_s is not None and soak.injected:
        return _wait_overlapping(env, soak, fault)
    try:
        _wait_training(env, soak, since=lambda: recovered_after(soak))
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
        return victim_node(env, soak, fault) is not None
    if fault.kind in ("kill_rank", "stop_rank"):
        return rank_pid(soak, fault.rank) is not None
    if fault.kind == "torn_checkpoint":
        return len(checkpoints(soak.run_dir)) >= 2  # one to tear and one to resume from
    if fault.kind in ("batch_node_down", "batch_freeze"):
        return batch_host(env, soak) is not None
    if fault.kind in ("time_limit", "admin_requeue"):  # signals and requeues of a running job
        return job_state(env, soak.job_ids[-1])[0] == "RUNNING"
    return True
