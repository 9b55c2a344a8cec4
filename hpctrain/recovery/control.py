"""The batch script's control step: gather the facts, ask hpctrain.recovery.decide once, carry out.

    python -m hpctrain.recovery.control begin RUN_DIR
        at every start of the batch script: a restart Slurm made on its own is recorded and
        counted. Exit 0 to train, 3 (CONTROL_BUDGET_SPENT) when a restart budget is spent, 7
        (CONTROL_PREEMPTING) inside a preemption's grace: launch nothing.
    python -m hpctrain.recovery.control after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED
        when the srun step has ended (CODE `-`: no step was launched, a signal came first;
        TERMINATED: the shell got SIGTERM; WARNED: the time-limit signal; LAUNCHED: the UNIX
        time the step was launched, so it is judged by its own events only). Prints one line:
        `finish`, `requeue [NODES]`, `relaunch NODES` (and, when slurm.nodes is a range, the
        count of nodes the new step runs on), `stop` or `fail`.
    python -m hpctrain.recovery.control cancelled RUN_DIR
        from the shell's SIGTERM trap: `cancelled` recorded at once (Slurm kills the shell
        KillWait seconds after scancel, maybe before after-step); once per life.
    python -m hpctrain.recovery.control requeue RUN_DIR EXCLUDED
        after `requeue [NODES]`: ask Slurm to requeue this job (same id, restart + 1), then set
        its ExcNodeList to EXCLUDED (slurm.exclude and the nodes failed now). When Slurm gives no
        answer, look and ask again (hpctrain.recovery.requeue); when it refuses, submit the run
        dir's job.sbatch again (same run dir, it resumes) or end FAILED saying why. Exit 0 once
        requeued, 4 once submitted again, 1 failed, 6 cancelled meanwhile, 5 (CONTROL_NO_SLURM)
        when scontrol cannot run here (an image without Slurm's commands: the batch shell asks
        on the node itself).
    python -m hpctrain.recovery.control requeue-refused RUN_DIR EXCLUDED MESSAGE
        the batch shell's own `scontrol requeue` (the CONTROL_NO_SLURM case) printed MESSAGE and
        failed: as `requeue` goes on after a refusal or no answer.
The calls, the answer line and the exit codes are typed in hpctrain.run.protocol; the keeper
(hpctrain.recovery.keeper) calls `batch_host_lost`. Facts come from hpctrain.recovery.gather, all
of one step's Slurm calls within SLURM_BUDGET_S; hpctrain.recovery.apply carries out. This module
imports no torch: it must answer in a moment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from hpctrain import faults
from hpctrain.config.slurm_file import slurm_settings
from hpctrain.recovery.apply import Applier, stamped
from hpctrain.recovery.check_nodes import checked_relaunch
from hpctrain.recovery.decide import (
    decide,
    decide_cancelled,
    decide_host_lost,
    decide_refused,
    decide_requeue,
    decide_start,
)
from hpctrain.recovery.decision import Decision
from hpctrain.recovery.gather import Gatherer, Within
from hpctrain.recovery.judge import launch_lost
from hpctrain.run import fencing, generations, launch_marks, lives, protocol
from hpctrain.run.causes import Action
from hpctrain.run.jsonlines import locked
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir, no_room, no_room_message
from hpctrain.run.protocol import BEGIN_EXITS, KEEPER_EXITS, REQUEUE_EXITS, Answer, Exit
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose

# All the Slurm calls of one control step: a step ended by SIGTERM (scancel, a preemption's
# grace) is killed KillWait seconds later (30 by default), and its decision must be written by
# then; without an answer in time each fact has its fallback.
SLURM_BUDGET_S = 20.0
# A requeue without an answer, and the keeper: how long to wait for slurmctld to come back.
REQUEUE_WAIT_S = client.RESTART_WAIT_S
# Exported by the batch shell before after-step: when the training step's srun returned.
STEP_ENDED_AT_ENV = "HPCTRAIN_STEP_ENDED_AT"


class Controller:
    """One entry point per call of the batch shell (and the keeper's): facts, one decision, acts."""

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run = RunDir(run_dir)
        self.env = dict(os.environ) if env is None else env
        self.slurm = slurm_settings(self.run.config)
        self.within = Within(time.monotonic() + SLURM_BUDGET_S)
        self.gather = Gatherer(self.run, self.env, self.slurm, self.within)
        self.restart = self.gather.restart
        self.apply = Applier(self.run, self.env, self.gather.job_id, self.slurm.tasks_per_node, self.within)

    def begin(self) -> int:
        try:
            self._take_life()
        except generations.Superseded as lost:
            print(
                f"hpctrain: job {self.gather.job_id} restart {self.restart} does not start: {lost}; "
                "it launches nothing and writes nothing in the run dir",
                file=sys.stderr,
            )
            return Exit.FENCED
        cluster = self.gather.cluster()
        decision = decide_start(self.gather.history(), cluster, self.gather.budgets())
        self.apply.record(decision)
        if decision.action is Action.FAIL:
            self._run_ended(Action.FAIL.value)
            return BEGIN_EXITS[decision.action]
        if self.restart > 0:  # judged, and in the journal: the last life's mark has done its work
            self.run.sigterm_mark(self.gather.number, self.restart - 1).unlink(missing_ok=True)
        if decision.action is Action.REQUEUE:
            print("hpctrain: preempted before the step started (a preemption's grace runs): no launch", flush=True)
        return BEGIN_EXITS[decision.action]

    def _take_life(self) -> None:
        """This life's generation of the run dir, before it writes anything (hpctrain.run.generations):
        refused (Superseded) when a newer act than its job's owns the run."""
        aliases, token = LifeStamp.from_env(self.env).aliases, self.env.get(generations.TOKEN_ENV) or None
        life = lives.LifeClaim(self.gather.job_id, self.restart, aliases, token)
        fencing.adopt(self.run.root, lives.begin_life(self.run.root, life))

    def after_step(
        self,
        exit_code: int | None,
        terminated: bool,
        excluded: list[str] | tuple[str, ...],
        warned: bool = False,
        launched_at: float = 0.0,
    ) -> str:
        """The answer line for the batch shell (exit_code None: no step was launched)."""
        faults.point("control.after_step")
        outcome = self.gather.outcome(exit_code, terminated, warned, excluded, launched_at or None)
        history, budgets = self.gather.history(launched_at), self.gather.budgets()
        cluster = self.gather.cluster()
        if launch_lost(history.since_launch, outcome) and not cluster.answered:
            # srun started no task and slurmctld gives no answer: an outage, nothing failed. Wait
            # for Slurm (until near the time limit), then launch again, charged to no budget.
            print("hpctrain: the step's srun started no task and slurmctld gives no answer: waiting for it", flush=True)
            if self.gather.wait_for_slurm(REQUEUE_WAIT_S):
                cluster = self.gather.cluster()
        job = self.gather.number or self.gather.job_id  # the raw SLURM_JOB_ID the node checks' tasks carry
        decision = checked_relaunch(
            lambda view: decide(history, outcome, view, budgets),
            cluster,
            job,
            sys.executable,
            self.within,
            lambda: self.gather.slurm_answers("the relaunch's check"),
        )
        if decision.action is Action.RELAUNCH:
            self.apply.claim_relaunch()  # raises Fenced: another act owns the run, launch nothing
        self.apply.record(stamped(decision, self.env.get(STEP_ENDED_AT_ENV, "")))
        if launched_at:
            launch_marks.forget(self.run.root, launched_at)  # judged: the mark's work is done
        if decision.ends_run:
            self._run_ended(decision.action.value)
        # The batch shell's srun --nodes for the survivors, only when slurm.nodes is a range.
        step_nodes = decision.step_nodes if self.slurm.elastic_nodes else None
        return Answer(decision.action, decision.excluded, step_nodes).line()

    def cancelled(self) -> int:
        """The shell's SIGTERM trap: record `cancelled` now, once per life. Under the journal's
        lock, as hpctrain-cancel records it: whichever comes second sees the other's record."""
        with locked(self.run.events):
            self.apply.record(decide_cancelled(self.gather.history(), *self.gather.sigterm_from_slurm()))
        return Exit.OK

    def requeue(self, excluded: tuple[str, ...]) -> int:
        """The decision was `requeue`: Slurm starts this job again, then skips EXCLUDED."""
        # The requeue ends this life: Slurm sends SIGTERM to every process of the batch step, this
        # one too, and kills them KillWait seconds later. Ignored, so ExcNodeList is still set
        # (the batch shell ignores it as well; set here too, whatever wrapper runs this step).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # So a scancel since the step ended is only seen in the job's record: looked at first.
        seen = self.gather.seen(meaning="asking for the requeue all the same", purpose=Purpose.AFTER_SIGTERM)
        with locked(self.run.events):  # a cancel is recorded as the trap and hpctrain-cancel do
            decision = decide_requeue(self.gather.history(), seen, excluded, self.gather.requested())
            self.apply.record(decision)
        if not decision.ask:
            return REQUEUE_EXITS[decision.action]
        self.apply.claim_requeue()  # raises Fenced: another act owns the run, ask nothing
        self.within.renew(REQUEUE_WAIT_S)
        asked = self.apply.ask_requeue()
        if asked.ok:
            faults.point("control.requeue_asked")
            if decision.shape is not None:
                self.apply.shape(decision.shape)
            return Exit.REQUEUED
        if asked.kind is client.Kind.MISSING:
            print(f"hpctrain: {asked.why()}; the batch shell asks for the requeue on the node", file=sys.stderr)
            return Exit.NO_SLURM
        return self._not_requeued(excluded, asked.answered, asked.stderr.strip() or asked.why())

    def requeue_refused(self, excluded: tuple[str, ...], message: str) -> int:
        """The batch shell's own `scontrol requeue` failed with MESSAGE (its stderr)."""
        return self._not_requeued(excluded, client.kind_of(1, message) is client.Kind.ANSWERED, message)

    def _not_requeued(self, excluded: tuple[str, ...], answered: bool, message: str) -> int:
        """Slurm did not take the requeue (`answered`: it refused; else no answer came)."""
        refusal = self.gather.refusal(answered, message, REQUEUE_WAIT_S)
        decision = decide_refused(self.gather.history(), excluded, refusal, self.gather.requested())
        if decision.action is Action.RESUBMIT:
            job_id, why = self._resubmit(decision)
            if job_id:
                return Exit.RESUBMITTED
            decision = decision.because(why)
        if decision.action is Action.REQUEUE and decision.shape is not None:
            self.apply.shape(decision.shape)
        self.apply.record(decision)
        if decision.action is Action.FAIL:
            self._run_ended(Action.FAIL.value)
        if decision.action is Action.STOP:  # Slurm away until the time limit: nothing decided
            return Exit.UNDECIDED
        return REQUEUE_EXITS[decision.action]

    def batch_host_lost(self, host: str, silent_s: float) -> int:
        """The batch host's keeper heard nothing from HOST (the batch script's node) for SILENT_S
        seconds: decide_host_lost says what comes next, and this step does it: the run submitted
        again without HOST (as after a refused requeue: submission.json, a guardian, `failure`
        with new_job_id), then this job cancelled (its guardian reads new_job_id and stops); a
        requeue when it cannot be; a spent budget ends the job."""
        self.within.renew(REQUEUE_WAIT_S)  # no SIGTERM deadline here: wait out a restart
        seen = self.gather.seen(meaning="the batch host's silence is not acted on", purpose=Purpose.KEEPER_LOOK)
        history = self.gather.history()
        # A life that moved on (ended, requeued) is left alone: its nodes are not looked at.
        cluster = None if seen.moved_on(self.restart) else self.gather.cluster()
        outcome, budgets = self.gather.last_step(history), self.gather.budgets()
        decision = decide_host_lost(history, host, silent_s, seen, outcome, cluster, budgets, self.gather.requested())
        if decision.action is Action.STOP:
            self.apply.say(decision.message, "hpctrain keeper")
            return KEEPER_EXITS[decision.action]
        if decision.action is Action.RESUBMIT:
            self.apply.kill_training_steps()
            faults.point("keeper.before_sbatch")
            job_id, why = self._resubmit(decision, "hpctrain keeper", by="keeper")
            if job_id:
                self.apply.cancel_this_job()
                return Exit.RESUBMITTED
            decision = decision.because(why)  # Slurm's own requeue of this job instead
            self.within.renew(REQUEUE_WAIT_S)
            self.apply.say(decision.message, "hpctrain keeper")
            self.apply.claim_requeue()
            asked = self.apply.ask_requeue()
            if asked.ok:
                self.apply.write(decision.events)
                if decision.shape is not None:
                    self.apply.shape(decision.shape)
                return KEEPER_EXITS[decision.action]
            # Its `failure` already says why the submission failed: the requeue's refusal adds nothing.
            decision = decision.because(asked.why())
        self.apply.record(decision)
        self._run_ended(Action.FAIL.value)
        self.apply.cancel_this_job()
        return KEEPER_EXITS[decision.action]

    def _resubmit(self, decision: Decision, speaker: str = "hpctrain", by: str = "hpctrain") -> tuple[str | None, str]:
        """RESUBMIT carried out: the new job, then its record (submission.json, a guardian, the
        decision's events with its id, the message). (None, why) when sbatch did not queue it."""
        assert decision.shape is not None  # decide's RESUBMIT always shapes the new job
        job_id, why = self.apply.resubmit(decision.shape, by)
        if job_id:
            done = decision.resubmitted(job_id)
            self.apply.write(done.events)
            self.apply.goes_on_in(job_id)  # submission.json, its generation named, its guardian
            self.apply.say(done.message, speaker)
        return job_id, why

    def _run_ended(self, action: str) -> None:
        """The run has ended: the programs its run dir names are told (hpctrain.run.listeners; a
        trial of hpctrain-tune names the study's report). Other runs pay one stat()."""
        from hpctrain.run.listeners import tell_listeners

        tell_listeners(self.run, action)


def _controller(run_dir: Path) -> Controller:
    try:
        return Controller(run_dir)
    except ValueError as error:  # config.yaml edited by hand into a wrong value: the job fails
        sys.exit(f"hpctrain: {error}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        _dispatch(args)
    except OSError as error:
        if not no_room(error) or len(args) < 2:
            raise
        # One line, not a traceback: the journal cannot be written, so the step's decision cannot
        # be kept; the shell ends the job (an empty answer) and the guardian finds no room either.
        sys.exit(f"hpctrain: {no_room_message(Path(args[1]), error)}")


def _dispatch(args: list[str]) -> None:
    call = protocol.parse_call(args)
    if call is None:
        sys.exit(protocol.USAGE)
    controller = _controller(call.run_dir)
    try:
        _call(controller, call)
    except (fencing.Fenced, generations.Superseded) as replaced:
        # A newer generation owns the run dir (this life's node was frozen while the keeper or
        # the guardian submitted the run again): nothing is decided, asked or written.
        print(f"hpctrain: {replaced}", file=sys.stderr, flush=True)
        if isinstance(call, protocol.AfterStep):
            print(Answer(Action.STOP).line())
            return
        sys.exit(Exit.FENCED)


def _call(controller: Controller, call: protocol.Call) -> None:
    if not isinstance(call, protocol.Begin):
        fencing.check(call.run_dir)  # before any Slurm call: a replaced life asks nothing either
    if isinstance(call, protocol.AfterStep):
        code, excluded = call.exit_code, call.excluded
        print(controller.after_step(code, call.terminated, excluded, call.warned, call.launched_at))
        return
    if isinstance(call, protocol.Begin):
        sys.exit(controller.begin())
    if isinstance(call, protocol.Trapped):
        sys.exit(controller.cancelled())
    if isinstance(call, protocol.Requeue):
        sys.exit(controller.requeue(call.excluded))
    sys.exit(controller.requeue_refused(call.excluded, call.message))


if __name__ == "__main__":
    main()
