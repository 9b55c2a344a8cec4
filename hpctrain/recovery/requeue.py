"""A job's own `scontrol requeue`, and one that got no answer: look first, then ask again.

The batch script's control step asks for its own job's requeue (`control requeue`). When slurmctld does
not answer (a restart, a failover), scontrol says "Unexpected message received for job N", on
Slurm 22.05 for a stopped and for a dead controller alike (tests/fixtures/slurm/no_answer/), and
the requeue may be carried out all the same: a stopped slurmctld carried it out once it went on.
So the requeue is asked again only once `scontrol show job` answers that this life was not
requeued (Restarts not past it), and a second job is never submitted while the first may still
come back into the same run dir.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose

EXCLUDE_TRIES = 20


@dataclass(frozen=True)
class Settled:
    requeued: bool  # Slurm requeued this life (the first request or a later one)
    refusal: str | None = None  # slurmctld answered again and refused: its words
    # Neither: slurmctld gave no answer before `until`; Slurm may still requeue the job.


def ask_requeue(job_id: str, until: float) -> client.Reply:
    """`scontrol requeue` of this job (`<array>_<task>` in an array: the array's own number
    would requeue every task). Slurm's reply; an unsure one goes to requeue_without_answer."""
    return client.requeue(job_id, Purpose.REQUEUE, until=until)


def requeue_without_answer(job_id: str, restart: int, until: float) -> Settled:
    for _ in range(3):  # a repeated requeue that again gets no answer: look again
        shown = client.show_job(job_id, Purpose.REQUEUE_LOOK, until=until)
        record = shown.value
        if record is None:
            return Settled(False, shown.reply.last_line() if shown.answered else None)
        if (record.restarts or 0) > restart:
            return Settled(True)
        asked = ask_requeue(job_id, until)
        if asked.ok:
            return Settled(True)
        if asked.answered:
            return Settled(False, asked.last_line())
    return Settled(False)


def exclude_nodes(job_id: str, excluded: str, until: float) -> client.Reply:
    """ExcNodeList of a requeued job: slurm.exclude and the nodes failed now (empty too, so a
    node Slurm returned to service is allowed back). Slurm's last reply."""
    return _update_pending(job_id, until, {"ExcNodeList": excluded})


def lower_node_count(job_id: str, nodes: int, tasks: int, until: float) -> client.Reply:
    """A requeued job's node count lowered to what can run it now (its spares given up), and its
    task count with it: the job's --ntasks-per-node made that nodes x tasks per node, and with
    more tasks than its nodes hold Slurm calls the job never runnable ("Requested node
    configuration is not available"). Slurm lets a job's owner lower the node count of a
    pending job (seen on the dev cluster)."""
    return _update_pending(job_id, until, {"NumNodes": nodes, "NumTasks": tasks})


def _update_pending(job_id: str, until: float, settings: dict[str, str | int]) -> client.Reply:
    """One try at a time (UPDATE_PENDING), up to EXCLUDE_TRIES a second apart: an ExcNodeList
    set twice is set once, and Slurm refuses the update for a few seconds after it removed a
    failed node from the job."""
    done = client.update_job(job_id, settings, Purpose.UPDATE_PENDING, until=until)
    for _ in range(EXCLUDE_TRIES - 1):
        if done.ok or time.monotonic() + 1 > until:
            break
        time.sleep(1)
        done = client.update_job(job_id, settings, Purpose.UPDATE_PENDING, until=until)
    return done
