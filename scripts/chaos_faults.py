"""The chaos soak's faults (scripts/chaos.py): each injects one kind into the running job, as
hardware, Slurm or an administrator would, and says what it hit (INJECT, by kind).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from chaos_cluster import batch_host, job_state, rank_pid, slurm, submit, victim_node
from chaos_soak import ENDED, THAW_AFTER_S, ChaosError, Fault, Injected, Soak, checkpoints, last_step


def _injected(soak: Soak, fault: Fault, target: str, note: str = "") -> Injected:
    return Injected(fault, time.time(), target, soak.job_ids[-1], last_step(soak), note)


def node_state(env: dict[str, str], soak: Soak, fault: Fault, state: str) -> Injected:
    node = victim_node(env, soak, fault)
    assert node is not None  # _applies checked it
    done = _injected(soak, fault, node)
    slurm(env, "scontrol", "update", f"nodename={node}", f"state={state}", "reason=chaos")
    soak.touched_nodes.add(node)
    return done


def batch_node_down(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    """The node running the batch script lost: Slurm ends the job FAILED (it runs with
    --no-kill) and the run's guardian submits it again; the soak follows the new job."""
    node = batch_host(env, soak)
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


def node_freeze(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    node = victim_node(env, soak, fault)
    assert node is not None  # _applies checked it
    return freeze(env, soak, fault, node, "a training node")


def batch_freeze(env: dict[str, str], soak: Soak, fault: Fault, config: list[str]) -> Injected:
    """The batch host silent: its keeper submits the run again and cancels the job; the thawed
    batch shell then finds its life replaced (fencing) and writes nothing."""
    node = batch_host(env, soak)
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
    pid = rank_pid(soak, fault.rank)
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
    newest = checkpoints(soak.run_dir)[-1].with_suffix(".pt")
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
