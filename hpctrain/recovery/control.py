"""The batch script's control step: gather the facts, let hpctrain.recovery.decide decide, apply.

    python -m hpctrain.recovery.control begin RUN_DIR
        at every start of the batch script: a restart Slurm made on its own is recorded and
        counted. Exit 0 to train, 3 (CONTROL_BUDGET_SPENT) when a restart budget is spent.
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
        answer, look and ask again (hpctrain.recovery.requeue); when it refuses, submit the run dir's
        job.sbatch again (same run dir, it resumes) or end FAILED saying why. Exit 0 once
        requeued, 4 once submitted again, 1 failed, 5 (CONTROL_NO_SLURM) when scontrol cannot run
        here (an image without Slurm's commands: the batch shell asks on the node itself).
    python -m hpctrain.recovery.control requeue-refused RUN_DIR EXCLUDED MESSAGE
        the batch shell's own `scontrol requeue` (the CONTROL_NO_SLURM case) printed MESSAGE and
        failed: as `requeue` goes on after a refusal or no answer.
Every Slurm call goes through hpctrain.slurm.client, all of one step within SLURM_BUDGET_S; a
failed one is said on stderr (the job's output) with what it means for the decision. This module
imports no torch: it must answer in a moment.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain import faults
from hpctrain.config.schema import SlurmConfig
from hpctrain.recovery.before_requeue import BeforeRequeue, before_requeue
from hpctrain.recovery.constraints import nodes_meeting, parse_sinfo_features
from hpctrain.recovery.decide import Decision, History, decide, decide_begin, decide_cancelled, decide_keeper, lineage
from hpctrain.recovery.facts import Budgets, ClusterView, Outcome, parse_sinfo_nodes, parse_time_left
from hpctrain.recovery.guardian import submit_guardian
from hpctrain.recovery.requeue import ask_requeue, exclude_nodes, lower_node_count, requeue_without_answer
from hpctrain.run import exitcodes
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import BY_KEEPER, Failure, Journal, Relaunch, Requeue, read_events
from hpctrain.run.jsonlines import locked
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir, no_room, no_room_message
from hpctrain.slurm import client
from hpctrain.slurm.env import parse_node_list
from hpctrain.slurm.records import JobRecord, parse_job_record, parse_partition

# All the Slurm calls of one control step: a step ended by SIGTERM (scancel, a preemption's
# grace) is killed KillWait seconds later (30 by default), and its decision must be written by
# then; without an answer in time each fact has its fallback.
SLURM_BUDGET_S = 20.0
# `requeue-refused` when scontrol got no answer: how long to wait for slurmctld to come back.
REQUEUE_WAIT_S = 60.0
# The SIGTERM trap's look at the job record: within KillWait (5 s on some sites), with the rest.
TRAP_LOOK = client.Policy(timeout_s=3.0)
# The keeper's look at the job before it acts: slurmctld may be restarting (the node loss that
# silenced the batch host often comes with a busy controller).
KEEPER_LOOK = client.Policy(timeout_s=15.0, retry_for_s=60.0)
# Exported by the batch shell before after-step: when the training step's srun returned.
STEP_ENDED_AT_ENV = "HPCTRAIN_STEP_ENDED_AT"
# The old training steps' kill's head start before the keeper submits the run again.
STEP_KILL_LEAD_S = 1.0
# sbatch from inside the job: retried only when Slurm says the request never left.
RESUBMIT = client.Policy(timeout_s=30.0, retry_for_s=REQUEUE_WAIT_S, retry_unsure=False)


def slurm_settings(config: Path) -> SlurmConfig:
    """config.yaml's `slurm` node through the schema: a key it lacks takes the schema's default
    (not 0), a wrong value is refused with the key named. Only this node: no torch, no Hydra."""
    try:
        loaded = OmegaConf.load(config)
        node = (loaded.get("slurm") if isinstance(loaded, DictConfig) else None) or {}
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SlurmConfig), node))
    except yaml.YAMLError as error:
        raise ValueError(f"{config}: not YAML ({str(error).splitlines()[0]})") from None
    except OmegaConfBaseException as error:  # a wrong type
        key, text = getattr(error, "full_key", None), str(error).splitlines()[0]
        raise ValueError(f"{config}: slurm.{key}: {text}" if key else f"{config}: {text}") from None
    except ValueError as error:  # a __post_init__ check: it names its key
        raise ValueError(f"{config}: {error}") from None
    assert isinstance(settings, SlurmConfig)  # to_object of SlurmConfig's schema
    return settings


class Controller:
    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run = RunDir(run_dir)
        self.env = dict(os.environ) if env is None else env
        self.slurm = slurm_settings(self.run.config)
        self.journal = Journal(self.run.events)
        # `<array>_<task>` in an array task (what submission.json, the events and hpctrain-cancel
        # call it): its SLURM_JOB_ID may name the whole array to scontrol. Its own number is its
        # other name (events an older hpctrain wrote carry it).
        life = LifeStamp.from_env(self.env)
        self.job_id = life.job_id or ""
        self.restart = life.restart
        self.aliases = life.aliases
        self.number = life.number or ""
        self.until = time.monotonic() + SLURM_BUDGET_S

    # ---- facts -----------------------------------------------------------------------------------

    def budgets(self) -> Budgets:
        return Budgets(dict(self.slurm.restart_budget), self.slurm.max_restarts)

    def history(self, launched_at: float | None = None) -> History:
        events = lineage(read_events(self.run.events), self.job_id, self.aliases)
        since = () if launched_at is None else tuple(e for e in events if e.time >= launched_at)
        return History(self.job_id, self.restart, events, since, self.aliases, self._previous_shell_terminated())

    def _previous_shell_terminated(self) -> bool:
        """The life before this one marked its SIGTERM (the batch shell's trap, first thing)."""
        return self.restart > 0 and self.run.sigterm_mark(self.number, self.restart - 1).exists()

    def cluster(self) -> ClusterView:
        original = self.env.get("SLURM_JOB_NODELIST", "")
        record = self._job_record(meaning="using SLURM_JOB_NODELIST")
        return ClusterView(
            nodes=self._node_states(),
            allocated=tuple(self._allocated_nodes(record)),
            original=tuple(parse_node_list(original)) if original else (),
            time_left_s=self._time_left(),
            requeued_by_slurm=self._restarted_past_me(record),
            timed_out=record is not None and record.timed_out,
            preempting=None if record is None else record.preempt_time is not None,
            partition_nodes=tuple(self._partition_nodes(record)),
            constraint_nodes=self._constraint_nodes(record),
        )

    def _constraint_nodes(self, record: JobRecord | None) -> frozenset[str] | None:
        if record is None or record.features is None:
            return None  # no --constraint (or no record): every node counts
        meaning = "every node counts for a requeue's exclusion, whatever the job's --constraint"
        done = self._ask("sinfo", "-N", "-h", "-a", "-o", "%N|%f", meaning=meaning)
        try:
            return nodes_meeting(record.features, parse_sinfo_features(done.stdout)) if done.ok else None
        except ValueError as error:
            print(f"hpctrain: {error}; {meaning}", file=sys.stderr)
            return None

    def _partition_nodes(self, record: JobRecord | None) -> list[str]:
        if record is None or record.partition is None:
            return []
        meaning = "every node sinfo lists counts for a requeue's exclusion"
        done = self._ask("scontrol", "show", "partition", "-o", record.partition, meaning=meaning)
        nodes = parse_partition(done.stdout).get("Nodes") if done.ok else None
        try:
            return parse_node_list(nodes) if nodes and nodes != "(null)" else []
        except ValueError as error:
            print(f"hpctrain: {error}; {meaning}", file=sys.stderr)
            return []

    def _restarted_past_me(self, record: JobRecord | None) -> bool:
        """Slurm counts a restart past this life's: it is requeuing the job (its own doing, an
        admin's, a preemption's), whatever this step decides."""
        return record is not None and record.restarts is not None and record.restarts > self.restart

    def _sigterm_from_slurm(self) -> tuple[bool, bool]:
        """For the SIGTERM trap: (Slurm is requeuing the job, its time limit ended it). Slurm
        kills the shell KillWait seconds after its SIGTERM, so one short look; without an answer
        the SIGTERM counts as the scancel it usually is."""
        record = self._job_record(meaning="taking the SIGTERM as a scancel", policy=TRAP_LOOK)
        return self._restarted_past_me(record), record is not None and record.timed_out

    def _node_states(self) -> dict:
        done = self._ask("sinfo", "-N", "-h", "-a", "-o", "%N|%T|%E", meaning="node failures go unseen")
        try:
            return parse_sinfo_nodes(done.stdout) if done.ok else {}
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
        done = self._ask("squeue", "-h", "-j", self.job_id, "-o", "%L", meaning="no relaunch is risked")
        try:
            return parse_time_left(done.stdout) if done.ok else None
        except ValueError as error:
            print(f"hpctrain: {error}; no relaunch is risked", file=sys.stderr)
            return None

    def _job_record(self, meaning: str, policy: client.Policy = client.IN_JOB) -> JobRecord | None:
        done = self._ask("scontrol", "show", "job", "-o", self.job_id, meaning=meaning, policy=policy)
        return parse_job_record(done.stdout) if done.ok else None

    def outcome(self, exit_code: int | None, terminated: bool, warned: bool, excluded: list[str]) -> Outcome:
        exclude = self.slurm.exclude
        return Outcome(
            exit_code=exit_code,
            terminated=terminated,
            warned=warned,
            excluded=tuple(excluded),
            user_exclude=tuple(parse_node_list(exclude)) if exclude else (),
            nodes_wanted=self.slurm.max_nodes,
            nodes_least=self.slurm.min_nodes,
            signal_delay_s=float(self.slurm.signal_delay_s),
        )

    # ---- the steps -------------------------------------------------------------------------------

    def begin(self) -> int:
        cluster = self.cluster()
        decision = decide_begin(self.history(), cluster, self.budgets())
        if decision is not None:
            self._record(decision)
            if decision.action.value == "fail":
                self._trial_ended("fail")
                return exitcodes.CONTROL_BUDGET_SPENT
        if self.restart > 0:  # judged, and in the journal: the last life's mark has done its work
            self.run.sigterm_mark(self.number, self.restart - 1).unlink(missing_ok=True)
        if cluster.preempting:
            # Preempted while the batch script started (a grace running): a step launched now
            # would get Slurm's SIGTERM as it starts, at the grace's end, warned by nobody.
            print("hpctrain: preempted before the step started (a preemption's grace runs): no launch", flush=True)
            return exitcodes.CONTROL_PREEMPTING
        return 0

    def after_step(
        self,
        exit_code: int | None,
        terminated: bool,
        excluded: list[str],
        warned: bool = False,
        launched_at: float = 0.0,
    ) -> str:
        """The action line for the batch shell (exit_code None: no step was launched)."""
        faults.point("control.after_step")
        outcome = self.outcome(exit_code, terminated, warned, excluded)
        decision = decide(self.history(launched_at), outcome, self.cluster(), self.budgets())
        self._record(_timed(decision, self.env.get(STEP_ENDED_AT_ENV, "")))
        if decision.ends_run:
            self._trial_ended(decision.action.value)
        words = [decision.action.value, ",".join(decision.excluded)]
        if self.slurm.elastic_nodes and decision.step_nodes is not None:
            words.append(str(decision.step_nodes))  # the batch shell's srun --nodes for the survivors
        return " ".join(words).strip()

    def cancelled(self) -> int:
        """The shell's SIGTERM trap: record `cancelled` now, once per life. Under the journal's
        lock, as hpctrain-cancel records it: whichever comes second sees the other's record."""
        with locked(self.run.events):
            self._record(decide_cancelled(self.history(), *self._sigterm_from_slurm()))
        return 0

    def requeue(self, excluded: str) -> int:
        """The decision was `requeue`: Slurm starts this job again, then skips EXCLUDED."""
        # The requeue ends this life: Slurm sends SIGTERM to every process of the batch step, this
        # one too, and kills them KillWait seconds later. Ignored, so ExcNodeList is still set
        # (the batch shell ignores it as well; set here too, whatever wrapper runs this step).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # A scancel since the step ended (its SIGTERM ignored from the decision on): Slurm would
        # grant the requeue of the cancelled job all the same (22.05: Restarts=1, PENDING), and it
        # would come back. The user's word stands. Slurm requeuing it already: nothing to ask.
        record = self._job_record(meaning="asking for the requeue all the same", policy=TRAP_LOOK)
        look = before_requeue(
            record.restarts if record else None, record is not None and record.being_ended, self.restart
        )
        if look is BeforeRequeue.REQUEUED_ALREADY:
            print("hpctrain: Slurm is requeuing this job already", file=sys.stderr)
            return exitcodes.BATCH_REQUEUED
        if look is BeforeRequeue.CANCELLED:
            with locked(self.run.events):
                self._record(decide_cancelled(self.history()))
            print("hpctrain: the job was cancelled while its step ended: no requeue", file=sys.stderr)
            return exitcodes.BATCH_CANCELLED
        self.until = time.monotonic() + REQUEUE_WAIT_S
        asked = ask_requeue(self.job_id, self.until)
        if asked.ok:
            faults.point("control.requeue_asked")
            self._exclude(excluded)
            return exitcodes.BATCH_REQUEUED
        if asked.kind is client.Kind.MISSING:
            print(f"hpctrain: {asked.why()}; the batch shell asks for the requeue on the node", file=sys.stderr)
            return exitcodes.CONTROL_NO_SLURM
        return self._not_requeued(excluded, asked.kind, asked.stderr.strip() or asked.why())

    def batch_host_lost(self, host: str, silent_s: float) -> int:
        """The batch host's keeper heard nothing from HOST (the batch script's node) for SILENT_S
        seconds: unless this life has moved on (ended, requeued), decide_keeper says what comes
        next, and this step does it: the run submitted again without HOST (as after a refused
        requeue: submission.json, a guardian, `failure` with new_job_id), then this job
        cancelled (its guardian reads new_job_id and stops); a spent budget ends the job."""
        self.until = time.monotonic() + REQUEUE_WAIT_S  # no SIGTERM deadline here: wait out a restart
        record = self._job_record(meaning="the batch host's silence is not acted on", policy=KEEPER_LOOK)
        # Ended or requeued since (the batch script finished or asked; Slurm ended it, and the
        # guardian takes over): the silence was the life's end.
        if record is None or record.state != "RUNNING" or self._restarted_past_me(record):
            state = record.state if record else "unknown"
            print(f"hpctrain keeper: the batch host {host} is silent, the job {state}: nothing to do", file=sys.stderr)
            return 0
        relaunches = [e for e in self.history().events if isinstance(e, Relaunch) and e.restart == self.restart]
        outcome = self.outcome(None, False, False, list(relaunches[-1].excluded) if relaunches else [])
        decision = decide_keeper(self.history(), host, silent_s, outcome, self.cluster(), self.budgets())
        if decision.action is Action.REQUEUE:
            self._kill_training_steps()
            asked = next((e for e in decision.events if isinstance(e, Requeue)), None)
            nodes = asked.nodes if asked else self._requeue_node_count()
            job_id, why = self._sbatch_again(",".join(decision.excluded), nodes)
            if job_id:
                self.run.record_resubmission(job_id)
                submit_guardian(self.run, job_id, client.outside_job_env(self.env))
                for event in decision.events:
                    self.journal.write_event(replace(event, new_job_id=job_id) if isinstance(event, Failure) else event)
                print(f"hpctrain keeper: the run goes on in job {job_id} (same run dir)", file=sys.stderr)
                self._cancel_this_job()
                return exitcodes.BATCH_RESUBMITTED
            # Refused: Slurm's own requeue of this job instead. It starts again once Slurm hears
            # from the lost node (a silent one: SlurmdTimeout), but the run goes on.
            self.until = time.monotonic() + REQUEUE_WAIT_S
            print(f"hpctrain keeper: submitting again failed ({why}): asking Slurm to requeue", file=sys.stderr)
            if ask_requeue(self.job_id, self.until).ok:
                failure = next(e for e in decision.events if isinstance(e, Failure))
                for event in (replace(failure, action="requeue"), *decision.events[1:]):
                    self.journal.write_event(event)
                self._exclude(",".join(decision.excluded))
                return exitcodes.BATCH_REQUEUED
            failure = next(e for e in decision.events if isinstance(e, Failure))
            self.journal.write_event(
                replace(failure, reason=f"{failure.reason}; submitting again failed: {why}", action="fail")
            )
        elif decision.action is Action.FAIL:
            self._record(decision)
        else:
            print(f"hpctrain keeper: {decision.message}", file=sys.stderr)
            return 0
        self._trial_ended("fail")
        self._cancel_this_job()
        return exitcodes.BATCH_FAILED

    def _kill_training_steps(self) -> None:
        """SIGKILL to this job's training steps (not the keeper's own) before the run is submitted
        again: ranks left training on the other nodes (their srun was lost with the batch host)
        must not write a checkpoint once the new job has started. Each scancel in the background
        (slurmctld may wait on the silent node before it answers), with a head start: the kill
        reaches the nodes that answer within a second, long before a new job can start."""
        own = f"{self.job_id}.{self.env.get('SLURM_STEP_ID', '')}"
        meaning = "its training steps are left to the job's cancel"
        listed = self._ask("squeue", "-h", "-s", "-j", self.job_id, "-o", "%i", meaning=meaning)
        steps = [s for s in listed.stdout.split() if s != own and s.rpartition(".")[2].isdigit()] if listed.ok else []
        for step in steps:
            command = ["scancel", "--signal=KILL", step]
            threading.Thread(target=client.run, args=(command, client.IN_JOB), daemon=True).start()
        if steps:
            time.sleep(STEP_KILL_LEAD_S)

    def _cancel_this_job(self) -> None:
        """The job ends now instead of at its time limit, its nodes free for the run's next job."""
        meaning = "the job runs on without its batch script until its time limit"
        self._ask("scancel", self.job_id, meaning=meaning, policy=client.CANCEL)

    def requeue_refused(self, excluded: str, message: str) -> int:
        """The batch shell's own `scontrol requeue` failed with MESSAGE (its stderr)."""
        return self._not_requeued(excluded, client.kind_of(1, message), message)

    def _not_requeued(self, excluded: str, kind: client.Kind, message: str) -> int:
        """scontrol refused the requeue: submit job.sbatch again into the same run dir. When it
        got no answer at all, Slurm may still requeue this job: look and ask again first."""
        if kind is not client.Kind.ANSWERED:
            self.until = time.monotonic() + REQUEUE_WAIT_S
            settled = requeue_without_answer(self.job_id, self.restart, self.until)
            if settled.requeued:
                self._exclude(excluded)
                print(
                    f"hpctrain: scontrol requeue got no answer ({message.strip()}); the job was requeued",
                    file=sys.stderr,
                )
                return exitcodes.BATCH_REQUEUED
            if settled.refusal is None:
                why = (
                    f"slurmctld did not answer the requeue within {REQUEUE_WAIT_S:.0f} s ({message.strip()}); "
                    "not submitted again: Slurm may still requeue this job"
                )
                return self._failed(why)
            message = settled.refusal
        reason = f"scontrol requeue refused: {message.strip() or 'no message'}"
        if self._requeued_anyway():  # only the ExcNodeList update failed: Slurm restarts this job
            print(f"hpctrain: {reason}; the job was requeued all the same", file=sys.stderr)
            return exitcodes.BATCH_REQUEUED
        resubmitted = (
            self._sbatch_again(excluded)
            if self.run.job_script.is_file()
            else (None, f"{self.run.job_script} is missing")
        )
        job_id, why = resubmitted
        if not job_id:
            return self._failed(f"{reason}; submitting again failed: {why}")
        self.run.record_resubmission(job_id)
        submit_guardian(self.run, job_id, client.outside_job_env(self.env))
        self.journal.write_event(
            Failure(
                job_id=self.job_id,
                restart=self.restart,
                cause=Cause.REQUEUE_REFUSED,
                reason=reason,
                action="resubmit",
                new_job_id=job_id,
            )
        )
        print(f"hpctrain: {reason}; the run goes on in job {job_id} (same run dir)", file=sys.stderr)
        return exitcodes.BATCH_RESUBMITTED

    def _failed(self, reason: str) -> int:
        self.journal.write_event(
            Failure(job_id=self.job_id, restart=self.restart, cause=Cause.REQUEUE_REFUSED, reason=reason, action="fail")
        )
        print(f"hpctrain: {reason}", file=sys.stderr)
        self._trial_ended("fail")
        return exitcodes.BATCH_FAILED

    def _requeued_anyway(self) -> bool:
        return self._restarted_past_me(self._job_record(meaning="taking the requeue as refused"))

    def _exclude(self, excluded: str) -> None:
        """Shape the requeued job's next start: the nodes kept out, and fewer nodes when the
        decision gave up spares it cannot have now."""
        nodes = self._requeue_node_count()
        if nodes is not None:
            # The count first: failed nodes kept out of a job that still asks for all its nodes
            # would leave it waiting for ever. Not lowered: only slurm.exclude is kept out.
            lowered = lower_node_count(self.job_id, nodes, nodes * self.slurm.tasks_per_node, self.until)
            if not lowered.ok:
                excluded = self.slurm.exclude or ""
                print(
                    f"hpctrain: NumNodes={nodes} not set ({lowered.why()}); the job waits for all its nodes, "
                    f"ExcNodeList={excluded}",
                    file=sys.stderr,
                )
        done = exclude_nodes(self.job_id, excluded, self.until)
        if not done.ok:
            print(
                f"hpctrain: ExcNodeList={excluded} not set ({done.why()}); the job may start on them", file=sys.stderr
            )

    def _requeue_node_count(self) -> int | None:
        """The node count this life's requeue decision asked for (None: unchanged)."""
        asked = [
            e.nodes
            for e in read_events(self.run.events)
            if isinstance(e, Requeue)
            and e.by in (None, BY_KEEPER)
            and (e.job_id, e.restart) == (self.job_id, self.restart)
        ]
        return asked[-1] if asked else None

    def _sbatch_again(self, excluded: str, nodes: int | None = None) -> tuple[str | None, str]:
        """job.sbatch again (same run dir), with EXCLUDED kept out, on the node count the decision
        judged: its lowered count, or else as many nodes as this life had (a requeue keeps a lowered
        NumNodes; job.sbatch asks for every training node and spare again, which the nodes left
        after EXCLUDED may not hold: "Requested node configuration is not available"). With
        slurm.nodes a range, job.sbatch's own min-max: Slurm fits it to the nodes there are."""
        nodes = self._requeue_node_count() if nodes is None else nodes
        if nodes is None and not self.slurm.elastic_nodes:
            this_life = self.env.get("SLURM_JOB_NODELIST", "")
            nodes = len(parse_node_list(this_life)) if this_life else None
        command = [
            "sbatch",
            "--parsable",
            *([f"--exclude={excluded}"] if excluded else []),
            *([f"--nodes={nodes}"] if nodes is not None else []),
            str(self.run.job_script),
        ]
        env = client.outside_job_env(self.env)
        done = self._ask(*command, env=env, policy=RESUBMIT, meaning="the run cannot go on in a new job")
        job_id = done.stdout.strip().split(";")[0]
        if done.unsure:
            return None, f"{done.why()}: a new job may have been queued all the same (see squeue)"
        if not done.ok or not job_id.isdigit():
            return None, (done.stderr.strip() or done.stdout.strip() or f"sbatch exited {done.exit_code}")
        return job_id, ""

    def _trial_ended(self, action: str) -> None:
        """A trial of hpctrain-tune's study (trial.json in its run dir) has ended: tell the study
        and submit the next trials. Other runs pay one stat() and import nothing."""
        if self.run.trial.is_file():
            from hpctrain.tune.report import trial_ended

            trial_ended(self.run.root, action)

    def _ask(
        self,
        *command: str,
        meaning: str,
        policy: client.Policy = client.IN_JOB,
        env: dict[str, str] | None = None,
    ) -> client.Reply:
        """Slurm's answer within this step's budget. A refusal, no answer or a missing command is
        said on stderr with what it means here: through slurm.task_prefix the control steps may
        run in an image without Slurm's commands."""
        done = client.run(command, policy, env=env, until=self.until)
        if done.kind is client.Kind.MISSING:
            print(
                f"hpctrain: {done.why()}; {meaning}: set slurm.control_python to a Python outside the container",
                file=sys.stderr,
            )
        elif not done.ok:
            print(f"hpctrain: `{' '.join(command)}` failed ({done.why()}); {meaning}", file=sys.stderr)
        return done

    def _record(self, decision: Decision) -> None:
        for event in decision.events:
            self.journal.write_event(event)
        if decision.message:
            print(f"hpctrain: {decision.message}", file=sys.stderr)


def _timed(decision: Decision, step_ended_at: str) -> Decision:
    """A relaunch with the seconds since the old step ended (the batch shell's time of it)."""
    try:
        decided_s = round(max(0.0, time.time() - float(step_ended_at)), 3)
    except ValueError:
        return decision
    events = tuple(replace(e, decided_s=decided_s) if isinstance(e, Relaunch) else e for e in decision.events)
    return replace(decision, events=events)


_NODE_NAME = re.compile(r"^[A-Za-z0-9._\[\]-]+$")


def _controller(run_dir: str) -> Controller:
    try:
        return Controller(Path(run_dir))
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
    if len(args) == 2 and args[0] == "begin":
        sys.exit(_controller(args[1]).begin())
    if len(args) == 7 and args[0] == "after-step":
        excluded = [n for n in args[5].split(",") if _NODE_NAME.match(n)]
        terminated, warned = args[3] == "1", args[4] == "1"
        launched_at = float(args[6] or 0)
        code = None if args[2] == "-" else int(args[2])
        print(_controller(args[1]).after_step(code, terminated, excluded, warned, launched_at))
        return
    if len(args) == 2 and args[0] == "cancelled":
        sys.exit(_controller(args[1]).cancelled())
    if len(args) == 3 and args[0] == "requeue":
        sys.exit(_controller(args[1]).requeue(args[2]))
    if len(args) == 4 and args[0] == "requeue-refused":
        sys.exit(_controller(args[1]).requeue_refused(args[2], args[3]))
    sys.exit(
        "usage: python -m hpctrain.recovery.control begin RUN_DIR"
        " | after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED | cancelled RUN_DIR"
        " | requeue RUN_DIR EXCLUDED | requeue-refused RUN_DIR EXCLUDED MESSAGE"
    )


if __name__ == "__main__":
    main()
