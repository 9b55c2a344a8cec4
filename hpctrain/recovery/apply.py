"""Carrying out what hpctrain.recovery.decide decided: the journal written, the requeued job
shaped, the run submitted again, this job's steps killed or the job cancelled.

Each act says on stderr (the job's output) what went wrong and what that means; none decides
what comes instead: that is the Decision's `otherwise`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from hpctrain.recovery.decision import Decision, Shape
from hpctrain.recovery.gather import Within, heard
from hpctrain.recovery.requeue import ask_requeue, exclude_nodes, lower_node_count
from hpctrain.run import fencing, generations
from hpctrain.run.events import Event, Journal, Relaunch
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.submit.guardian_job import submit_guardian
from hpctrain.submit.outside_job import outside_job_env

# The old training steps' kill's head start before the keeper submits the run again.
STEP_KILL_LEAD_S = 1.0


class Applier:
    def __init__(self, run: RunDir, env: Mapping[str, str], job_id: str, tasks_per_node: int, within: Within) -> None:
        self.run = run
        self.env = env
        self.job_id = job_id
        self.tasks_per_node = tasks_per_node
        self.within = within
        self.journal = Journal(run.events)
        self.claim: generations.Generation | None = None  # this step's submission, once taken

    # ---- the journal and the job's output --------------------------------------------------------

    def record(self, decision: Decision) -> None:
        """The decision's events, then its message (a line each)."""
        self.write(decision.events)
        self.say(decision.message)

    def write(self, events: Iterable[Event]) -> None:
        for event in events:
            self.journal.write_event(event)

    @staticmethod
    def say(message: str, speaker: str = "hpctrain") -> None:
        for line in message.splitlines():
            print(f"{speaker}: {line}", file=sys.stderr)

    # ---- Slurm's requeue of this job -------------------------------------------------------------

    def claim_requeue(self) -> None:
        """A `requeue` generation after this process's own, before Slurm is asked: the requeued
        job's next life begins after it. Raises Fenced when a newer act owns the run (a keeper's
        resubmission while this shell was frozen): nothing is asked."""
        self._claim(generations.REQUEUE)

    def claim_relaunch(self) -> None:
        """A `relaunch` generation after this process's own, before the relaunch is recorded and
        its step launched: the replaced step's ranks are fenced by it (a node that froze, thawing
        later, writes nothing more). Raises Fenced when a newer act owns the run."""
        self._claim(generations.RELAUNCH)

    def _claim(self, kind: str) -> None:
        own = fencing.own(self.run.root, self.env)
        if own is None:  # a life that took no generation (a run dir from before them)
            return
        life = LifeStamp.from_env(self.env)
        act = generations.Generation(0, kind, "hpctrain", job_id=self.job_id, restart=life.restart, names=life.aliases)
        try:
            taken = generations.take(self.run.root, own, act)
        except generations.Superseded:
            raise fencing.Fenced(self.run.root, own) from None
        fencing.adopt(self.run.root, taken)

    def ask_requeue(self) -> client.Reply:
        """`scontrol requeue` of this job; an unsure reply is looked at before anything else."""
        return ask_requeue(self.job_id, self.within.until)

    def shape(self, shape: Shape) -> None:
        """The requeued job's next start: the nodes kept out, and fewer nodes when the decision
        gave up spares it cannot have now. The count first: failed nodes kept out of a job that
        still asks for all its nodes would leave it waiting for ever."""
        excluded = ",".join(shape.excluded)
        if shape.nodes is not None:
            tasks = shape.nodes * self.tasks_per_node
            lowered = lower_node_count(self.job_id, shape.nodes, tasks, self.within.until)
            if not lowered.ok:
                excluded = shape.unlowered
                print(
                    f"hpctrain: NumNodes={shape.nodes} not set ({lowered.why()}); the job waits for all its nodes, "
                    f"ExcNodeList={excluded}",
                    file=sys.stderr,
                )
        done = exclude_nodes(self.job_id, excluded, self.within.until)
        if not done.ok:
            print(
                f"hpctrain: ExcNodeList={excluded} not set ({done.why()}); the job may start on them", file=sys.stderr
            )

    # ---- the run in a new job --------------------------------------------------------------------

    def resubmit(self, shape: Shape, by: str = "hpctrain") -> tuple[str | None, str]:
        """job.sbatch again (same run dir, it resumes there) with the shape decided: (the new
        job's id, "") or (None, why not). A `submit` generation is taken after this process's own
        first (raises Fenced when a newer act owns the run): the new job carries its token and
        begins only once `goes_on_in` named it, after this step's records."""
        token = generations.new_token()
        own = fencing.own(self.run.root, self.env)
        if own is not None:
            try:
                self.claim = generations.take(self.run.root, own, generations.submission(by, token))
            except generations.Superseded:
                raise fencing.Fenced(self.run.root, own) from None
            fencing.adopt(self.run.root, self.claim)
        submitted = client.submit(
            self.run.job_script,
            purpose=Purpose.RESUBMIT,
            exclude=",".join(shape.excluded) or None,
            nodes=shape.nodes,
            env={**outside_job_env(self.env), generations.TOKEN_ENV: token},
            until=self.within.until,
        )
        done = heard(submitted.reply, "the run cannot go on in a new job")
        if submitted.value is None and self.claim is not None and not done.unsure:
            fencing.withdraw(self.run.root, self.claim)  # sbatch refused: it queued nothing
            self.claim = None
        if done.unsure:
            return None, f"{done.why()}: a new job may have been queued all the same (see squeue)"
        if submitted.value is None:
            return None, (done.stderr.strip() or done.stdout.strip() or f"sbatch exited {done.exit_code}")
        return submitted.value, ""

    def goes_on_in(self, job_id: str) -> None:
        """The run goes on in `job_id`: submission.json follows it, then its generation names it
        (the new job's first life may begin from then on), then it gets a guardian."""
        self.run.record_resubmission(job_id)
        if self.claim is not None:  # the new job may begin from here on: this step writes no more
            self.claim = generations.name_job(self.run.root, self.claim, job_id)
        submit_guardian(self.run, job_id, outside_job_env(self.env))

    def kill_training_steps(self) -> None:
        """SIGKILL to this job's training steps (not the keeper's own) before the run is submitted
        again: ranks left training on the other nodes (their srun was lost with the batch host)
        must not write a checkpoint once the new job has started. Each kill in the background
        (slurmctld may wait on the silent node before it answers), with a head start: the kill
        reaches the nodes that answer within a second, long before a new job can start."""
        own = f"{self.job_id}.{self.env.get('SLURM_STEP_ID', '')}"
        listed = client.job_steps(self.job_id, Purpose.IN_JOB, until=self.within.until)
        heard(listed.reply, "its training steps are left to the job's cancel")
        steps = [s for s in listed.value if s != own and s.rpartition(".")[2].isdigit()]
        for step in steps:
            threading.Thread(target=client.signal, args=(step, "KILL", Purpose.IN_JOB), daemon=True).start()
        if steps:
            time.sleep(STEP_KILL_LEAD_S)

    def cancel_this_job(self) -> None:
        """The job ends now instead of at its time limit, its nodes free for the run's next job."""
        done = client.cancel([self.job_id], Purpose.CANCEL, until=self.within.until)
        heard(done, "the job runs on without its batch script until its time limit")


def stamped(decision: Decision, step_ended_at: str) -> Decision:
    """A relaunch with the seconds since the old step ended (the batch shell's time of it), as
    the journal stamps every event with its time."""
    try:
        decided_s = round(max(0.0, time.time() - float(step_ended_at)), 3)
    except ValueError:
        return decision
    events = tuple(replace(e, decided_s=decided_s) if isinstance(e, Relaunch) else e for e in decision.events)
    return replace(decision, events=events)
