"""What the control step knows when it decides: plain typed facts, and the parsers that make
them from Slurm's own text (so they are tested on text captured from a real cluster).

Nothing here calls Slurm or reads a file; hpctrain.recovery.gather gathers the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.run.causes import RESTART_CAUSES, Cause, Word


class Service(Word):
    """A node as recovery sees it."""

    UP = "up"  # idle, allocated, mixed, completing, ...: usable
    DRAINED = "drained"  # an administrator took it out (drain, draining, drained, maint, reboot): not failed
    FAILED = "failed"  # down, fail, failing, not responding: whatever ran there is lost


# sinfo %T names (Slurm 22.05's `sinfo -t` list, plus `failing`, which %T shows but -t refuses).
_FAILED = {"down", "fail", "failing", "unknown", "boot_fail", "inval", "future", "no_respond"}
_DRAINED = {
    "drain",
    "drained",
    "draining",
    "maint",
    "reboot",
    "reboot^",
    "reboot_issued",
    "reboot_requested",
    "power_down",
    "powered_down",
    "powering_down",
}
# Flags sinfo appends to %T: `*` the node does not respond; the others are power and
# reservation marks that leave the node in service.
_NOT_RESPONDING = "*"
_FLAGS = "*~#!%$@^-"


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's %T as Slurm gave it (`draining`, `down*`, `idle`)
    reason: str = ""  # sinfo's %E ("none" when Slurm has none)

    @property
    def service(self) -> Service:
        base = self.state.rstrip(_FLAGS).lower()
        if self.state.endswith(_NOT_RESPONDING) or base in _FAILED:
            return Service.FAILED
        if base in _DRAINED or self.state.lower() in _DRAINED:
            return Service.DRAINED
        return Service.UP


def parse_sinfo_nodes(text: str) -> dict[str, NodeState]:
    """`sinfo -N -h -a -o '%N|%T|%E'`: one line per node and partition (a node in two
    partitions shows twice, alike). Raises ValueError on a line of another shape."""
    nodes: dict[str, NodeState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise ValueError(f"sinfo line not of the form NODE|STATE|REASON: {line!r}")
        nodes[parts[0]] = NodeState(parts[0], parts[1], parts[2])
    return nodes


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def parse_time_left(text: str) -> float | None:
    """`squeue -h -j ID -o %L`: seconds left (`D-HH:MM:SS`, `HH:MM:SS`, `MM:SS`), inf for
    UNLIMITED, None for NOT_SET / INVALID. Raises ValueError on anything else."""
    word = text.strip()
    if word == "UNLIMITED":
        return float("inf")
    if word in ("NOT_SET", "INVALID"):
        return None
    match = _SLURM_TIME.match(word)
    if not match:
        raise ValueError(f"squeue %L gave {word!r}, not a time left")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


@dataclass(frozen=True)
class Checked:
    """What a relaunch's node check (hpctrain.recovery.node_check) found on the nodes it ran on."""

    nodes: frozenset[str] = frozenset()  # every node checked
    unanswering: frozenset[str] = frozenset()  # no answer in time: lost, whatever Slurm lists
    lingering: frozenset[str] = frozenset()  # the old step's processes would not end there
    ended: int = 0  # old training processes the checks ended

    def __or__(self, other: Checked) -> Checked:
        return Checked(
            self.nodes | other.nodes,
            self.unanswering | other.unanswering,
            self.lingering | other.lingering,
            self.ended + other.ended,
        )


@dataclass(frozen=True)
class ClusterView:
    """The allocation and every node as Slurm sees them when a step has ended."""

    nodes: dict[str, NodeState] = field(default_factory=dict)  # every node Slurm lists
    allocated: tuple[str, ...] = ()  # the job's nodes now (with --no-kill a failed one leaves)
    original: tuple[str, ...] = ()  # the job's nodes when this life began
    time_left_s: float | None = None  # None: unknown (a relaunch is then not risked)
    # The job's record counts a restart past this life's: Slurm is requeuing it (an admin's
    # `scontrol requeue`, a preemption's grace ended with PreemptMode=REQUEUE). Its SIGTERM to
    # the batch shell is then no scancel: the run comes back.
    requeued_by_slurm: bool = False
    # The job's record shows a PreemptTime: Slurm chose it for preemption and its grace runs. A
    # step launched now would never be warned (the tasks' SIGTERM was the warning), only killed.
    # None: the record could not be read (Slurm did not answer).
    preempting: bool | None = False
    # The nodes of the job's partition (`scontrol show partition` Nodes=): the only ones that can
    # ever run it. Empty: not known (every node sinfo lists counts).
    partition_nodes: tuple[str, ...] = ()
    # The job's record says its time limit ended it (a warned stop or an after-step that
    # outlasted the limit): Slurm's SIGTERM to the batch shell is then the limit's, no scancel,
    # and the run's guardian submits the job again.
    timed_out: bool = False
    # The nodes whose features meet the job's --constraint (hpctrain.recovery.constraints); None:
    # the job has none, or it is not known which (every node counts).
    constraint_nodes: frozenset[str] | None = None
    # The nodes with the GPUs and memory per node the job asks for (hpctrain.recovery.node_sizes);
    # None: it asks for neither, or it is not known (every node counts).
    big_enough_nodes: frozenset[str] | None = None
    # A relaunch's check of the nodes it may use (empty until the control step made one).
    checked: Checked = field(default_factory=Checked)
    # slurmctld answered the look at the job (False: no answer in time, Slurm away; the facts above
    # are fallbacks then).
    answered: bool = True

    def service(self, node: str) -> Service:
        """A node sinfo does not list was removed: not in service. A node that did not answer a
        relaunch's check is lost, though Slurm lists it as up for SlurmdTimeout yet. Without
        sinfo's answer at all (a container without Slurm's commands) every node counts as up."""
        if node in self.checked.unanswering:
            return Service.FAILED
        if not self.nodes:
            return Service.UP
        state = self.nodes.get(node)
        return state.service if state else Service.FAILED

    def failed(self, nodes: tuple[str, ...] | list[str]) -> list[str]:
        return sorted(n for n in nodes if self.service(n) is Service.FAILED)

    def drained(self, nodes: tuple[str, ...] | list[str]) -> list[str]:
        return sorted(n for n in nodes if self.service(n) is Service.DRAINED)


@dataclass(frozen=True)
class JobEnd:
    """How a training job ended, from Slurm's record of it (the guardian's look)."""

    state: str | None  # JobState: FAILED, NODE_FAIL, CANCELLED, ...; None: Slurm no longer has the job
    reason: str | None = None  # Reason: JobLaunchFailure when its batch node was lost
    restarts: int = 0  # Restarts: the life that ended
    batch_host: str | None = None  # BatchHost: the node its batch script ran on


@dataclass(frozen=True)
class Budgets:
    """slurm.restart_budget per cause, and slurm.max_restarts in all (None: their sum);
    slurm.no_progress_lives (0: never stop for that); slurm.health.keep_out_after_lives."""

    per_cause: dict[str, int]
    max_restarts: int | None = None
    no_progress_lives: int = 0
    # slurm.health.keep_out_after_lives (0: a node back in service is let back in).
    keep_out_after_lives: int = 0

    @property
    def total(self) -> int:
        if self.max_restarts is not None:
            return self.max_restarts
        return sum(self.per_cause.get(c.value, 0) for c in RESTART_CAUSES)

    def allowed(self, cause: Cause) -> int:
        return self.per_cause.get(cause.value, 0)


@dataclass(frozen=True)
class Outcome:
    """How a training step (one srun) ended, as the batch shell saw it."""

    exit_code: int | None  # srun's; None: no step was launched (a signal came first)
    terminated: bool = False  # the batch shell got SIGTERM: scancel (or a preemption's grace ran out)
    warned: bool = False  # the batch shell got the time-limit signal
    excluded: tuple[str, ...] = ()  # srun --exclude of this step (earlier relaunches)
    user_exclude: tuple[str, ...] = ()  # slurm.exclude, expanded: always kept out
    nodes_wanted: int = 1  # slurm.nodes: training nodes a step wants (the high end of a range)
    # The fewest it trains on (a range's low end; slurm.nodes itself otherwise): a node lost with
    # none to replace it, the step goes on with the survivors while they are this many.
    nodes_least: int | None = None
    signal_delay_s: float = 0.0  # slurm.signal_delay_s: the warning comes this long before the end
    # A task of the step left its mark as it began (hpctrain.run.launch_marks): False, srun started
    # no task (slurmctld away, the step refused); None: not known (a keeper's look, no launch).
    task_began: bool | None = None

    @property
    def fewest_nodes(self) -> int:
        """The fewest training nodes a step may run on (nodes_wanted when none is given)."""
        return self.nodes_least or self.nodes_wanted


@dataclass(frozen=True)
class Requested:
    """What the run's config and this life's allocation ask of Slurm, as a new start needs it."""

    exclude: str = ""  # slurm.exclude as written ("" when unset)
    elastic: bool = False  # slurm.nodes is a range: job.sbatch's own min-max fits any count
    life_nodes: int | None = None  # the nodes this life holds (SLURM_JOB_NODELIST); None: unknown

    def new_job_nodes(self, decided: int | None) -> int | None:
        """--nodes of job.sbatch submitted again: the count this life's decision judged, or as
        many nodes as this life had (job.sbatch asks for every training node and spare again,
        which the nodes left may not hold: "Requested node configuration is not available"). With
        slurm.nodes a range, job.sbatch's own min-max (None): Slurm fits it to the nodes there are."""
        if decided is not None or self.elastic:
            return decided
        return self.life_nodes


@dataclass(frozen=True)
class JobSeen:
    """One look at this job's record (`scontrol show job`) at a moment the control step acts."""

    seen: bool = False  # Slurm answered with the record
    state: str | None = None  # JobState
    restarts: int | None = None  # Restarts: Slurm's count of this job's lives so far
    being_ended: bool = False  # COMPLETING or CANCELLED, not for its time limit

    @property
    def said(self) -> str:
        return str(self.state) if self.seen else "unknown"

    def requeued_past(self, restart: int) -> bool:
        """Slurm counts a restart past this life's: it is requeuing the job (its own doing, an
        admin's, a preemption's), whatever this step decides."""
        return self.restarts is not None and self.restarts > restart

    def moved_on(self, restart: int) -> bool:
        """This life is over as far as Slurm says: no record, not RUNNING, or requeued."""
        return not self.seen or self.state != "RUNNING" or self.requeued_past(restart)


@dataclass(frozen=True)
class Refusal:
    """What is known once this job's `scontrol requeue` did not plainly succeed."""

    message: str  # what scontrol printed
    answered: bool  # Slurm itself refused; else it gave no answer, and it was looked at and asked again
    requeued: bool = False  # no answer, but Slurm requeued this life all the same (seen once it answered)
    refusal: str | None = None  # no answer, then slurmctld answered again and refused: its words
    waited_s: float = 0.0  # how long the control step waited for slurmctld to answer again
    # Looked at only once the requeue is refused (`refused`):
    requeued_anyway: bool = False  # the job's record counts a restart past this life's all the same
    job_script: Path = Path("job.sbatch")  # the run dir's job.sbatch, to submit again
    job_script_found: bool = True

    @property
    def refused(self) -> str | None:
        """Slurm's words refusing the requeue; None when it was requeued or never answered."""
        return self.message if self.answered else self.refusal
