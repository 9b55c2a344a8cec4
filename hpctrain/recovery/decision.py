"""What hpctrain.recovery.decide returns: the action, the events for the journal, and everything
the control step needs to carry it out without deciding anything itself.

An action that may not be carried out (an sbatch refused, a requeue refused) names what comes
instead (`otherwise`). What only the attempt can tell is left as a mark that the attempt fills in:
WHY (what went wrong) and JOB (the new job's id).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain.run.causes import Action
from hpctrain.run.events import Event, Failure

WHY = "{why}"  # in `otherwise`'s message and failure reasons: why the action could not be carried out
JOB = "{job}"  # in RESUBMIT's message: the job the run goes on in


@dataclass(frozen=True)
class Shape:
    """The next start of the job: a requeued job's ExcNodeList and NumNodes, or a resubmitted
    job's --exclude and --nodes."""

    excluded: tuple[str, ...] = ()
    nodes: int | None = None  # the node count it asks for (None: as it is, or as job.sbatch says)
    # A requeued job's ExcNodeList when its node count could not be lowered: slurm.exclude alone
    # (the failed nodes kept out of a job still asking for all its nodes would leave it waiting
    # for ever).
    unlowered: str = ""


@dataclass(frozen=True)
class Decision:
    action: Action
    events: tuple[Event, ...] = ()  # for the journal, in order
    excluded: tuple[str, ...] = ()  # requeue: the job's ExcNodeList; relaunch: srun --exclude
    message: str = ""  # for the job's output, a line each
    comes_back: bool = False  # STOP: this life ends, but Slurm requeues the job (no cancel)
    step_nodes: int | None = None  # RELAUNCH: how many nodes the new step runs on
    # REQUEUE: this control step asks Slurm for it (`scontrol requeue`); else it is asked already.
    ask: bool = False
    # REQUEUE: the requeued job's shape, set once Slurm took it (None: left as it is); RESUBMIT:
    # the new job's.
    shape: Shape | None = None
    otherwise: Decision | None = None  # when the action cannot be carried out (WHY: why not)

    @property
    def ends_run(self) -> bool:
        """This job ends and the run with it: the run's listeners are told so."""
        return self.action in (Action.FINISH, Action.FAIL, Action.STOP) and not self.comes_back

    def because(self, why: str) -> Decision:
        """`otherwise` as it is carried out: WHY filled in with why the action failed."""
        if self.otherwise is None:
            raise ValueError(f"{self.action}: nothing decided for when it cannot be carried out")
        return _filled(self.otherwise, WHY, why)

    def resubmitted(self, job_id: str) -> Decision:
        """RESUBMIT once the new job is queued: its id in the message and in the failure."""
        events = tuple(replace(e, new_job_id=job_id) if isinstance(e, Failure) else e for e in self.events)
        return replace(self, events=events, message=self.message.replace(JOB, job_id))


def _filled(decision: Decision, mark: str, words: str) -> Decision:
    events = tuple(
        replace(e, reason=e.reason.replace(mark, words)) if isinstance(e, Failure) and e.reason else e
        for e in decision.events
    )
    otherwise = _filled(decision.otherwise, mark, words) if decision.otherwise else None
    return replace(decision, events=events, message=decision.message.replace(mark, words), otherwise=otherwise)
