"""The protocol between the batch shell (sbatch_templates/ddp.sbatch.j2) and its control step.

The batch shell runs `python -m hpctrain.recovery.control STEP RUN_DIR ...` at its moments:

    begin RUN_DIR                        every start of the batch script       exit: BEGIN_EXITS
    after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED
                                         a training step (srun) has ended      one answer line
    cancelled RUN_DIR                    its SIGTERM trap                      exit 0
    requeue RUN_DIR EXCLUDED             after the answer `requeue [NODES]`    exit: REQUEUE_EXITS
    requeue-refused RUN_DIR EXCLUDED MESSAGE
                                         its own `scontrol requeue` failed     exit: REQUEUE_EXITS

and, on another node than the batch host, the keeper (`python -m hpctrain.recovery.keeper RUN_DIR
WATCHER_HOST:PORT BATCH_HOST`, exit: KEEPER_EXITS). after-step prints one line (Answer): the
action's word (hpctrain.run.causes.Action), the nodes kept out, and with slurm.nodes a range the
count of nodes a relaunch runs on. hpctrain.submit.render renders the template with these words,
so neither side spells them alone; the exit codes are hpctrain.run.exitcodes's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from hpctrain.run import exitcodes
from hpctrain.run.causes import Action, Word

CONTROL_MODULE = "hpctrain.recovery.control"
KEEPER_MODULE = "hpctrain.recovery.keeper"


class Step(Word):
    """The control step's subcommands, as the batch shell calls them."""

    BEGIN = "begin"
    AFTER_STEP = "after-step"
    CANCELLED = "cancelled"
    REQUEUE = "requeue"
    REQUEUE_REFUSED = "requeue-refused"


class Exit(IntEnum):
    """A control step's (or the keeper's) exit code, and what it tells the batch shell."""

    OK = 0  # begin: launch the step; cancelled: recorded; keeper: nothing to do
    REQUEUED = exitcodes.BATCH_REQUEUED  # Slurm requeues the job (the same number as OK)
    FAILED = exitcodes.BATCH_FAILED
    BUDGET_SPENT = exitcodes.CONTROL_BUDGET_SPENT
    RESUBMITTED = exitcodes.BATCH_RESUBMITTED
    NO_SLURM = exitcodes.CONTROL_NO_SLURM  # requeue: no scontrol here, the shell asks on the node
    CANCELLED = exitcodes.BATCH_CANCELLED
    PREEMPTING = exitcodes.CONTROL_PREEMPTING
    UNDECIDED = exitcodes.BATCH_UNDECIDED  # requeue: slurmctld away until the time limit
    FENCED = exitcodes.CONTROL_FENCED  # this life was replaced: nothing launched, written or asked


# Each entry point's exit for the action decided (and carried out).
BEGIN_EXITS = {Action.LAUNCH: Exit.OK, Action.REQUEUE: Exit.PREEMPTING, Action.FAIL: Exit.BUDGET_SPENT}
REQUEUE_EXITS = {
    Action.REQUEUE: Exit.REQUEUED,
    Action.RESUBMIT: Exit.RESUBMITTED,
    Action.FAIL: Exit.FAILED,
    Action.STOP: Exit.CANCELLED,
}
KEEPER_EXITS = {
    Action.STOP: Exit.OK,  # the life had moved on, or ended on purpose: nothing to do
    Action.REQUEUE: Exit.REQUEUED,
    Action.RESUBMIT: Exit.RESUBMITTED,
    Action.FAIL: Exit.FAILED,
}


NO_NODES = "-"  # a relaunch's NODES word when it keeps no node out


@dataclass(frozen=True)
class Answer:
    """after-step's one line: `finish`, `requeue [NODES]`, `relaunch NODES [COUNT]`, `stop`, `fail`.
    A relaunch that keeps no node out (a hang on nodes that all live) says `-` for its NODES, so
    the batch shell reads COUNT in its place."""

    action: Action
    excluded: tuple[str, ...] = ()  # requeue: the job's ExcNodeList; relaunch: srun --exclude
    step_nodes: int | None = None  # relaunch with slurm.nodes a range: the new step's srun --nodes

    def line(self) -> str:
        nodes = ",".join(self.excluded) or (NO_NODES if self.action is Action.RELAUNCH else "")
        words = [self.action.value, nodes]
        if self.step_nodes is not None:
            words.append(str(self.step_nodes))
        return " ".join(words).strip()


# ---- the calls --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    run_dir: Path


@dataclass(frozen=True)
class AfterStep:
    run_dir: Path
    exit_code: int | None  # srun's; None (`-`): no step was launched, a signal came first
    terminated: bool  # the shell got SIGTERM
    warned: bool  # the shell got the time-limit signal
    excluded: tuple[str, ...]  # this step's srun --exclude (earlier relaunches)
    launched_at: float  # UNIX time the step was launched: it is judged by its own events only


@dataclass(frozen=True)
class Trapped:
    """`cancelled`: the shell's SIGTERM trap."""

    run_dir: Path


@dataclass(frozen=True)
class Requeue:
    run_dir: Path
    excluded: tuple[str, ...]  # slurm.exclude and the nodes failed now: the requeued job's ExcNodeList


@dataclass(frozen=True)
class RequeueRefused:
    run_dir: Path
    excluded: tuple[str, ...]
    message: str  # what the shell's own `scontrol requeue` printed


Call = Begin | AfterStep | Trapped | Requeue | RequeueRefused

USAGE = (
    f"usage: python -m {CONTROL_MODULE} {Step.BEGIN} RUN_DIR"
    f" | {Step.AFTER_STEP} RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED | {Step.CANCELLED} RUN_DIR"
    f" | {Step.REQUEUE} RUN_DIR EXCLUDED | {Step.REQUEUE_REFUSED} RUN_DIR EXCLUDED MESSAGE"
)

_NODE_NAME = re.compile(r"^[A-Za-z0-9._\[\]-]+$")


def parse_call(args: list[str]) -> Call | None:
    """The control step's argv (without the program); None when it is none of the calls."""
    step, count = (args[0], len(args)) if args else ("", 0)
    if count == 2 and step == Step.BEGIN:
        return Begin(Path(args[1]))
    if count == 7 and step == Step.AFTER_STEP:
        return AfterStep(
            Path(args[1]),
            exit_code=None if args[2] == "-" else int(args[2]),
            terminated=args[3] == "1",
            warned=args[4] == "1",
            excluded=tuple(n for n in args[5].split(",") if _NODE_NAME.match(n)),
            launched_at=float(args[6] or 0),
        )
    if count == 2 and step == Step.CANCELLED:
        return Trapped(Path(args[1]))
    if count == 3 and step == Step.REQUEUE:
        return Requeue(Path(args[1]), node_names(args[2]))
    if count == 4 and step == Step.REQUEUE_REFUSED:
        return RequeueRefused(Path(args[1]), node_names(args[2]), args[3])
    return None


def node_names(text: str) -> tuple[str, ...]:
    """EXCLUDED as the shell passes it on: the answer line's comma-joined nodes (empty: none)."""
    return tuple(n for n in text.split(",") if n)


@dataclass(frozen=True)
class Keeper:
    """The keeper's call: `python -m hpctrain.recovery.keeper RUN_DIR WATCHER_HOST:PORT BATCH_HOST
    [BATCH_SHELL_PID]`."""

    run_dir: Path
    watcher: str  # the batch script's heartbeat watcher, host:port
    batch_host: str  # the node the batch script runs on
    batch_shell_pid: int | None = None  # the batch shell's pid there: alive means a stalled watcher

    USAGE = f"usage: python -m {KEEPER_MODULE} RUN_DIR WATCHER_HOST:PORT BATCH_HOST [BATCH_SHELL_PID]"

    @classmethod
    def parse(cls, args: list[str]) -> Keeper | None:
        if len(args) == 4 and args[3].isdigit():
            return cls(Path(args[0]), args[1], args[2], int(args[3]))
        return cls(Path(args[0]), args[1], args[2]) if len(args) == 3 else None


# What the template is rendered with (hpctrain.submit.render): the words it must not spell itself.
TEMPLATE_WORDS = {
    "actions": Action,
    "control_steps": Step,
    "control_module": CONTROL_MODULE,
    "keeper_module": KEEPER_MODULE,
    "no_nodes": NO_NODES,
}
