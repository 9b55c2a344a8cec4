"""The control step's facts: from the environment, the run dir's journal and config, and Slurm.

Every Slurm call goes through hpctrain.slurm.client's verbs within the step's deadline (Within);
one that fails is said on stderr (the job's output) with what it means for the decision, and the
fact takes its fallback. The facts are plain values (hpctrain.recovery.facts, .history) that
hpctrain.recovery.decide reads; nothing here decides.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from hpctrain.config.slurm import SlurmConfig
from hpctrain.recovery import outage
from hpctrain.recovery.constraints import nodes_meeting, parse_sinfo_features
from hpctrain.recovery.facts import (
    Budgets,
    ClusterView,
    JobSeen,
    NodeState,
    Outcome,
    Refusal,
    Requested,
    parse_sinfo_nodes,
    parse_time_left,
)
from hpctrain.recovery.history import History, last_relaunch_excluded, lineage
from hpctrain.recovery.node_sizes import memory_mb, nodes_big_enough, parse_sinfo_sizes
from hpctrain.recovery.requeue import Settled, requeue_without_answer
from hpctrain.run import launch_marks
from hpctrain.run.events import read_events
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.env import parse_node_list
from hpctrain.slurm.node_columns import NodeColumns, split_columns
from hpctrain.slurm.records import JobRecord

_T = TypeVar("_T")


@dataclass
class Within:
    """The deadline (time.monotonic()) all of one control step's Slurm calls share."""

    until: float

    def renew(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds


def heard(reply: client.Reply, meaning: str) -> client.Reply:
    """Slurm's reply, said on stderr unless it is a plain yes, with what it means here. Through
    slurm.task_prefix the control steps may run in an image without Slurm's commands."""
    if reply.kind is client.Kind.MISSING:
        print(
            f"hpctrain: {reply.why()}; {meaning}: set slurm.control_python to a Python outside the container",
            file=sys.stderr,
        )
    elif not reply.ok:
        print(f"hpctrain: `{' '.join(reply.command)}` failed ({reply.why()}); {meaning}", file=sys.stderr)
    return reply


class Gatherer:
    def __init__(self, run: RunDir, env: Mapping[str, str], slurm: SlurmConfig, within: Within) -> None:
        self.run = run
        self.env = env
        self.slurm = slurm
        self.within = within
        # `<array>_<task>` in an array task (what submission.json, the events and hpctrain-cancel
        # call it): its SLURM_JOB_ID may name the whole array to scontrol.
        life = LifeStamp.from_env(env)
        self.job_id = life.job_id or ""
        self.restart = life.restart
        self.number = life.number or ""  # SLURM_JOB_ID, which the SIGTERM trap's mark carries
        self._listed: dict[NodeColumns, str] = {}  # the last sinfo of the nodes (`cluster`)
        self._answered = True  # slurmctld answered the last look at the job

    # ---- the run dir and the config ----------------------------------------------------------

    def budgets(self) -> Budgets:
        slurm = self.slurm
        return Budgets(
            slurm.restart_budget, slurm.max_restarts, slurm.no_progress_lives, slurm.health.keep_out_after_lives
        )

    def history(self, launched_at: float | None = None) -> History:
        events = lineage(read_events(self.run.events), self.job_id)
        since = () if launched_at is None else tuple(e for e in events if e.time >= launched_at)
        return History(self.job_id, self.restart, events, since, (), self.previous_shell_terminated())

    def previous_shell_terminated(self) -> bool:
        """The life before this one marked its SIGTERM (the batch shell's trap, first thing)."""
        return self.restart > 0 and self.run.sigterm_mark(self.number, self.restart - 1).exists()

    def outcome(
        self,
        exit_code: int | None,
        terminated: bool,
        warned: bool,
        excluded: tuple[str, ...] | list[str],
        launched_at: float | None = None,
    ) -> Outcome:
        exclude = self.slurm.exclude
        began = None if launched_at is None or exit_code is None else launch_marks.began(self.run.root, launched_at)
        return Outcome(
            exit_code=exit_code,
            terminated=terminated,
            warned=warned,
            excluded=tuple(excluded),
            user_exclude=tuple(parse_node_list(exclude)) if exclude else (),
            nodes_wanted=self.slurm.max_nodes,
            nodes_least=self.slurm.min_nodes,
            signal_delay_s=float(self.slurm.signal_delay_s),
            task_began=began,
        )

    def last_step(self, history: History) -> Outcome:
        """The keeper's view of this life's last step: no exit seen, its relaunches' exclusions."""
        return self.outcome(None, False, False, last_relaunch_excluded(history))

    def requested(self) -> Requested:
        listed = self.env.get("SLURM_JOB_NODELIST", "")
        return Requested(
            exclude=self.slurm.exclude or "",
            elastic=self.slurm.elastic_nodes,
            life_nodes=len(parse_node_list(listed)) if listed else None,
        )

    # ---- Slurm -------------------------------------------------------------------------------

    def cluster(self) -> ClusterView:
        original = self.env.get("SLURM_JOB_NODELIST", "")
        record = self.job(meaning="using SLURM_JOB_NODELIST")
        self._listed = self._list_nodes()  # one sinfo for states, features and sizes
        answered = self._answered
        return ClusterView(
            answered=answered,
            nodes=self._node_states(),
            allocated=tuple(self._allocated_nodes(record)),
            original=tuple(parse_node_list(original)) if original else (),
            time_left_s=self._time_left(),
            requeued_by_slurm=self.seen_in(record).requeued_past(self.restart),
            timed_out=record is not None and record.timed_out,
            preempting=None if record is None else record.preempt_time is not None,
            partition_nodes=tuple(self._partition_nodes(record)),
            constraint_nodes=self._constraint_nodes(record),
            big_enough_nodes=self._big_enough_nodes(),
        )

    def job(self, meaning: str, purpose: Purpose = Purpose.IN_JOB) -> JobRecord | None:
        shown = client.show_job(self.job_id, purpose, until=self.within.until)
        heard(shown.reply, meaning)
        # No answer (not merely no scontrol here): slurmctld is away.
        self._answered = shown.reply.answered or shown.reply.kind is client.Kind.MISSING
        return shown.value

    def slurm_answers(self, meaning: str) -> bool:
        """One look at the job: whether slurmctld answered it (a job it no longer knows is an
        answer too; only no answer at all is its outage)."""
        self.job(meaning)
        return self._answered

    def seen(self, meaning: str, purpose: Purpose = Purpose.IN_JOB) -> JobSeen:
        return self.seen_in(self.job(meaning, purpose))

    @staticmethod
    def seen_in(record: JobRecord | None) -> JobSeen:
        if record is None:
            return JobSeen()
        return JobSeen(True, record.state, record.restarts, record.being_ended)

    def sigterm_from_slurm(self) -> tuple[bool, bool]:
        """For the SIGTERM trap: (Slurm is requeuing the job, its time limit ended it). Slurm
        kills the shell KillWait seconds after its SIGTERM, so one short look; without an answer
        the SIGTERM counts as the scancel it usually is."""
        record = self.job(meaning="taking the SIGTERM as a scancel", purpose=Purpose.AFTER_SIGTERM)
        return self.seen_in(record).requeued_past(self.restart), record is not None and record.timed_out

    def refusal(self, answered: bool, message: str, wait_s: float) -> Refusal:
        """What came of a requeue Slurm did not take. No answer: Slurm may still requeue this job,
        so it is looked at and asked again (hpctrain.recovery.requeue) for up to `wait_s`. The
        job's record is read, and the run dir looked at, only once the requeue is refused."""
        refusal = Refusal(message, answered, waited_s=wait_s)
        if not answered:
            settled, waited_s = self._wait_out_outage(wait_s)
            refusal = Refusal(message, answered, settled.requeued, settled.refusal, waited_s)
        if refusal.refused is None:
            return refusal
        record = self.job(meaning="taking the requeue as refused")
        script = self.run.job_script
        return Refusal(
            refusal.message,
            refusal.answered,
            refusal.requeued,
            refusal.refusal,
            wait_s,
            requeued_anyway=self.seen_in(record).requeued_past(self.restart),
            job_script=script,
            job_script_found=script.is_file(),
        )

    def outage_deadline(self, wait_s: float) -> float:
        """How long (monotonic) an outage is waited out: hpctrain.recovery.outage.deadline."""
        return outage.deadline(LifeStamp.from_env(self.env).allocated_at, self.slurm.time, wait_s)

    def _wait_out_outage(self, wait_s: float) -> tuple[Settled, float]:
        """Ask again and look, with growing pauses, until Slurm answers (requeued, or refused) or
        the outage deadline; (what came of it, seconds waited)."""

        def ask() -> tuple[bool, Settled]:
            settled = requeue_without_answer(self.job_id, self.restart, self.within.until)
            return settled.requeued or settled.refusal is not None, settled

        return self._until_answered(ask, wait_s, "asking again")

    def wait_for_slurm(self, wait_s: float) -> bool:
        """Look at the job, with growing pauses, until slurmctld answers or the outage deadline:
        whether it answered."""

        def look() -> tuple[bool, bool]:
            self.job(meaning="waiting for slurmctld")
            return self._answered, self._answered

        answered, _ = self._until_answered(look, wait_s, "looking again")
        return answered

    def _until_answered(self, ask: Callable[[], tuple[bool, _T]], wait_s: float, doing: str) -> tuple[_T, float]:
        """outage.until_answered, each ask within this step's Slurm budget renewed."""
        return outage.until_answered(ask, self.within, self.outage_deadline(wait_s), wait_s, doing)

    def _big_enough_nodes(self) -> frozenset[str] | None:
        """The nodes with the job's GPUs and memory per node (asked of sinfo only when the job
        asks for either: one call more)."""
        mem_mb = memory_mb(self.slurm.mem)
        if self.slurm.gpus_per_node <= 0 and mem_mb is None:
            return None
        meaning = "every node counts for a requeue's exclusion, whatever its GPUs and memory"
        listed = self._listed.get(NodeColumns.SIZES)
        if listed is None:
            print(f"hpctrain: no node list from sinfo; {meaning}", file=sys.stderr)
            return None
        try:
            return nodes_big_enough(parse_sinfo_sizes(listed), self.slurm.gpus_per_node, mem_mb)
        except ValueError as error:
            print(f"hpctrain: {error}; {meaning}", file=sys.stderr)
            return None

    def _constraint_nodes(self, record: JobRecord | None) -> frozenset[str] | None:
        if record is None or record.features is None:
            return None  # no --constraint (or no record): every node counts
        meaning = "every node counts for a requeue's exclusion, whatever the job's --constraint"
        listed = self._listed.get(NodeColumns.FEATURES)
        if listed is None:
            print(f"hpctrain: no node list from sinfo; {meaning}", file=sys.stderr)
            return None
        try:
            return nodes_meeting(record.features, parse_sinfo_features(listed))
        except ValueError as error:
            print(f"hpctrain: {error}; {meaning}", file=sys.stderr)
            return None

    def _partition_nodes(self, record: JobRecord | None) -> list[str]:
        if record is None or record.partition is None:
            return []
        meaning = "every node sinfo lists counts for a requeue's exclusion"
        shown = client.show_partition(record.partition, Purpose.IN_JOB, until=self.within.until)
        heard(shown.reply, meaning)
        nodes = shown.value.get("Nodes")
        try:
            return parse_node_list(nodes) if nodes and nodes != "(null)" else []
        except ValueError as error:
            print(f"hpctrain: {error}; {meaning}", file=sys.stderr)
            return []

    def _list_nodes(self) -> dict[NodeColumns, str]:
        """Every node's state, features and sizes from one sinfo; {} unless Slurm answered."""
        listed = client.nodes(NodeColumns.ALL, Purpose.IN_JOB, until=self.within.until)
        heard(listed.reply, "node failures go unseen")
        if not listed.ok:
            return {}
        try:
            return split_columns(listed.value)
        except ValueError as error:
            print(f"hpctrain: {error}; node failures go unseen", file=sys.stderr)
            return {}

    def _node_states(self) -> dict[str, NodeState]:
        listed = self._listed.get(NodeColumns.STATES)
        if listed is None:
            return {}
        try:
            return parse_sinfo_nodes(listed)
        except ValueError as error:
            print(f"hpctrain: {error}; node failures go unseen", file=sys.stderr)
            return {}

    def _allocated_nodes(self, record: JobRecord | None) -> list[str]:
        """The job's nodes now: with --no-kill a failed node leaves the allocation."""
        if record is None or record.node_list is None:
            listed = self.env.get("SLURM_JOB_NODELIST", "")
            return parse_node_list(listed) if listed else []
        return parse_node_list(record.node_list)

    def _time_left(self) -> float | None:
        left = client.time_left(self.job_id, Purpose.IN_JOB, until=self.within.until)
        heard(left.reply, "no relaunch is risked")
        try:
            return parse_time_left(left.value) if left.ok else None
        except ValueError as error:
            print(f"hpctrain: {error}; no relaunch is risked", file=sys.stderr)
            return None
