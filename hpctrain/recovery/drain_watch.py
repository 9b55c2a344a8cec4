"""A training node an administrator drains is left for a free spare, at a step boundary, no step
redone.

An administrator drains a node for maintenance (`scontrol update NodeName=X State=DRAIN
Reason=...`): Slurm starts nothing new there and lets the running jobs run on, and the
maintenance waits for them (or kills them). With a spare of the job idle, hpctrain need not wait:
the batch script's watcher (hpctrain.recovery.watch) asks Slurm about the step's nodes every
slurm.drain_poll_s, and when training nodes drain while the job holds as many spares in service,
it journals `draining` and sends the step's tasks SIGTERM (`scancel --signal=TERM JOB.STEP`).
The ranks agree to stop at the next step boundary and save that step (a forced save, as for a
preemption); the after-step sees the `draining` record (hpctrain.recovery.judge.classify: cause
`drain`) and relaunches at once on the nodes left, the drained ones excluded
(hpctrain.recovery.judge.relaunch), charged to no budget.

Without a free spare nothing moves: hpctrain-status says the node drains (hpctrain.status.drain_note).
`drain_move` is the decision, a pure function (tests/test_drain_watch.py); `DrainWatch` asks Slurm
from a thread of its own, so that a slow slurmctld never delays the watcher's heartbeat judging.
With trainer.straggler_action=relaunch the same look leaves a node whose rank the straggler watch
named (hpctrain.recovery.straggler_move); a drain goes first.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpctrain.recovery.facts import NodeState, Service, parse_sinfo_nodes
from hpctrain.recovery.straggler_move import JournalTail, StragglerMove, named_stragglers, straggler_move
from hpctrain.run.events import Draining, Event, Journal, Start, Straggler, StragglerCleared, StragglerLeaving
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.env import SlurmEnvError, parse_node_list
from hpctrain.slurm.node_columns import NodeColumns


@dataclass(frozen=True)
class DrainMove:
    nodes: list[str]  # the step's nodes Slurm shows draining
    reasons: list[str]  # each one's reason (sinfo %E)
    spares: list[str]  # the job's free spares in service that take their places


def drain_move(step_nodes: Sequence[str], job_nodes: Sequence[str], states: dict[str, NodeState]) -> DrainMove | None:
    """The step's draining nodes and the spares to take their places; None when no training node
    drains, or the job has too few spares in service for all of them (moving some would leave
    the step short, and a requeue would cost the queue: the run trains on)."""
    draining = sorted(n for n in step_nodes if n in states and states[n].service is Service.DRAINED)
    if not draining:
        return None
    free = sorted(n for n in job_nodes if n not in step_nodes and n in states and states[n].service is Service.UP)
    if len(free) < len(draining):
        return None
    return DrainMove(draining, [states[n].reason for n in draining], free[: len(draining)])


class DrainWatch:
    """Every `poll_s`, while `step()` names a running step (its id and its nodes),
    the step's nodes and the job's as Slurm lists them; on a move, `draining` and SIGTERM to the
    step's tasks, once per step."""

    def __init__(
        self,
        journal: Journal,
        job_id: str,
        restart: int,
        poll_s: float,
        step: Callable[[], tuple[str, list[str]] | None],
        env: dict[str, str],
        leave_stragglers: bool = False,
    ) -> None:
        self.journal, self.job_id, self.restart, self.poll_s = journal, job_id, restart, poll_s
        self.step, self.env = step, env
        self.moved: set[str] = set()  # steps this watch asked to stop
        # trainer.straggler_action=relaunch: the journal's straggler records, read as they come.
        self.tail = JournalTail(journal.path) if leave_stragglers else None
        self.life_records: list[Event] = []  # the newest life's start and straggler records
        self._stop = threading.Event()

    def start(self) -> None:
        if self.poll_s > 0:
            threading.Thread(target=self._run, name="hpctrain-drain-watch", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            running = self.step()
            if running is None or running[0] in self.moved:
                continue
            step_id, step_nodes = running
            try:
                move = self._look(step_nodes, self._stragglers())
            except (SlurmEnvError, OSError) as error:  # a node list hpctrain cannot read: never the watcher's end
                print(f"hpctrain: the drain watch could not look at the nodes: {error}", file=sys.stderr, flush=True)
                continue
            if isinstance(move, DrainMove):
                self._move(step_id, move)
            elif move is not None:
                self._leave_stragglers(step_id, move)

    def _stragglers(self) -> dict[str, float]:
        """The nodes of the running life with a rank named slow (none unless straggler_action=relaunch)."""
        if self.tail is None:
            return {}
        for event in self.tail.new_events():
            if isinstance(event, Start):
                self.life_records = [event]
            elif isinstance(event, (Straggler, StragglerCleared)):
                self.life_records.append(event)
        return named_stragglers(self.life_records)

    def _look(self, step_nodes: list[str], stragglers: dict[str, float]) -> DrainMove | StragglerMove | None:
        job_nodes = self._job_nodes()
        listed = client.nodes(NodeColumns.STATES, Purpose.IN_JOB, names=sorted(set(job_nodes) | set(step_nodes)))
        if not listed.ok:
            return None  # Slurm away: asked again at the next poll
        try:
            states = parse_sinfo_nodes(listed.value)
        except ValueError:
            return None
        drain = drain_move(step_nodes, job_nodes, states)
        return drain if drain is not None else straggler_move(stragglers, step_nodes, job_nodes, states)

    def _job_nodes(self) -> list[str]:
        """The nodes the job holds now (a failed one leaves under --no-kill); the start's list
        when Slurm does not answer."""
        record = client.show_job(self.env.get("SLURM_JOB_ID", self.job_id), Purpose.IN_JOB, env=self.env).value
        listed = record.node_list if record is not None and record.node_list else self.env.get("SLURM_JOB_NODELIST", "")
        return parse_node_list(listed) if listed else []

    def _move(self, step_id: str, move: DrainMove) -> None:
        record = Draining(
            job_id=self.job_id,
            restart=self.restart,
            nodes=move.nodes,
            reasons=move.reasons,
            spares=move.spares,
            step_id=step_id or None,
        )
        self._leave(step_id, record, f"Slurm drains {','.join(move.nodes)} ({'; '.join(move.reasons)})", move.spares)

    def _leave_stragglers(self, step_id: str, move: StragglerMove) -> None:
        record = StragglerLeaving(
            job_id=self.job_id,
            restart=self.restart,
            nodes=move.nodes,
            slowdown=move.slowdown,
            spares=move.spares,
            step_id=step_id or None,
        )
        said = ", ".join(f"{node} ({times:.2f}x)" for node, times in zip(move.nodes, move.slowdown, strict=True))
        self._leave(step_id, record, f"stragglers on {said}", move.spares)

    def _leave(self, step_id: str, record: Draining | StragglerLeaving, why: str, spares: list[str]) -> None:
        """Journal why the step's nodes are left (the after-step reads it), say so, stop the step."""
        self.moved.add(step_id)
        self.journal.write_event(record)
        print(
            f"hpctrain: {why}: saving at the next step and going on on {','.join(spares)}", file=sys.stderr, flush=True
        )
        self._stop_step(step_id)

    def _stop_step(self, step_id: str) -> None:
        """The step's tasks asked to save at the next step boundary and stop."""
        # To the step's tasks through Slurm, as a preemption's SIGTERM comes: srun itself would
        # take a SIGTERM as the end of the step and kill its tasks before they could save.
        step = f"{self.env.get('SLURM_JOB_ID', self.job_id)}.{step_id}"
        sent = client.signal(step, "TERM", Purpose.IN_JOB, env=self.env)
        if not sent.ok:
            print(f"hpctrain: the drain watch could not signal step {step}: {sent.why()}", file=sys.stderr, flush=True)
