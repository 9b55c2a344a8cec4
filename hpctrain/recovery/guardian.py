"""The run's guardian: a one-CPU job chained to the training job, so a lost batch node never ends a run.

Every hpctrain job runs with --no-kill, and Slurm does not requeue such a job when the node
running its batch script dies: it kills the batch step ("Removing failed node ... Killing
StepId=batch") and ends the job FAILED, Reason=JobLaunchFailure, Restarts=0 (measured on Slurm
22.05). Nothing of the job is left to decide what comes next, and in a 2-node job that is half of
all node failures. So beside every training job hpctrain queues its guardian:

    sbatch --parsable --dependency=afternotok:JOB RUN_DIR/guardian.sbatch JOB

It waits (Reason=Dependency) while JOB is queued, runs, or is requeued: a requeued job has not
ended. When JOB completes, Slurm cancels the guardian (--kill-on-invalid-dep=yes), which never
held a CPU. When JOB ends any other way, the guardian starts and runs

    python -m hpctrain.recovery.guardian RUN_DIR JOB

one look at Slurm's record of JOB, `decide_guard` on the run's journal, and, when nothing ended
the run on purpose (a finish, a spent budget, a user's mistake, a cancel, a resubmission the
batch script made itself), job.sbatch is submitted again into the same run dir: the new job
resumes from the newest complete checkpoint and gets a guardian of its own. The journal says so
(`failure` and `requeue` with by=guardian, `new_job_id`); submission.json follows the new job.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from hpctrain import faults
from hpctrain.recovery.decide import History, decide_guard, lineage
from hpctrain.recovery.decision import Decision
from hpctrain.recovery.facts import Budgets, JobEnd
from hpctrain.recovery.release import watch_replacement
from hpctrain.run import fencing, generations
from hpctrain.run.causes import Action
from hpctrain.run.events import Failure, Journal, read_events
from hpctrain.run.jsonlines import locked
from hpctrain.run.paths import RunDir, is_array_links, no_room_message
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.hostlist import expand
from hpctrain.slurm.records import JobRecord
from hpctrain.submit.guardian_job import submit_guardian
from hpctrain.submit.outside_job import outside_job_env

# A replacement waiting for nodes it excludes (hpctrain.recovery.release) is watched for up to
# RELEASE_WATCH_S, and never past WATCH_UNTIL_S after the guardian started (its limit: 15 minutes).
RELEASE_WATCH_S = 600.0
WATCH_UNTIL_S = 780.0


def job_end(record: JobRecord | None) -> JobEnd:
    if record is None:
        return JobEnd(state=None)
    return JobEnd(record.state, record.reason, record.restarts or 0, record.batch_host)


class Guardian:
    def __init__(self, run_dir: Path, job_id: str) -> None:
        from hpctrain.config.slurm_file import slurm_settings  # the schema, without Hydra

        self.run = RunDir(run_dir)
        self.job_id = job_id
        slurm = slurm_settings(self.run.config)
        self.budgets = Budgets(dict(slurm.restart_budget), slurm.max_restarts, slurm.no_progress_lives)
        self.journal = Journal(self.run.events)
        self.user_exclude = tuple(expand(slurm.exclude)) if slurm.exclude else ()
        self.started = time.monotonic()

    def look(self) -> JobRecord | None:
        done = client.show_job(self.job_id, Purpose.GUARDIAN_LOOK)
        if not done.ok:
            print(f"hpctrain guardian: no record of job {self.job_id} ({done.why()})", file=sys.stderr)
        return done.value

    def watch(self) -> int:
        faults.point("guardian.before_look")
        self.wait_for_a_submission_under_way()
        return self.judge(self.look())

    def judge(self, record: JobRecord | None, watch_moved_on: bool = True) -> int:
        """What the guarded job's end asks for, done: `record` is Slurm's record of the ended job
        (None: Slurm has none now). An array's guardian (hpctrain.recovery.array_guardian) calls
        it for each task it found ended, with the record of one look at the whole array."""
        ended = job_end(record)
        aliases = tuple(n for n in (record.names if record else []) if n != self.job_id)
        with locked(self.run.events):  # as hpctrain-cancel and the batch shell's trap write
            events = lineage(read_events(self.run.events), self.job_id, aliases)
            decision = decide_guard(History(self.job_id, ended.restarts, events, (), aliases), ended, self.budgets)
            print(f"hpctrain guardian: job {self.job_id}: {decision.message}", file=sys.stderr)
            if decision.action is Action.REQUEUE:
                full = self.run.room_left()
                if full is not None:  # the new job could not even record its start
                    print(f"hpctrain guardian: {no_room_message(self.run.root, full)}", file=sys.stderr)
                    self._run_ended("fail")
                    return 1
                faults.point("guardian.before_claim")
                try:
                    claim = self._claim((self.job_id, *aliases))
                except generations.Superseded as lost:
                    # A user's --retry, the keeper or the job's own control step acted first.
                    print(f"hpctrain guardian: job {self.job_id}: {lost}: nothing to do", file=sys.stderr)
                    return 0
                return self._resubmit(decision, claim)
            for event in decision.events:
                self.journal.write_event(event)
            names = (self.job_id, *aliases)
            moved_on = next(
                (
                    e.new_job_id
                    for e in reversed(events)
                    if isinstance(e, Failure) and e.new_job_id and e.job_id in names
                ),
                None,
            )
        if decision.action is Action.FAIL:
            self._run_ended("fail")
            return 1
        if moved_on is not None and watch_moved_on:  # the keeper's or a refused requeue's new job: it may starve
            deadline = min(time.monotonic() + RELEASE_WATCH_S, self.started + WATCH_UNTIL_S)
            watch_replacement(moved_on, self.user_exclude, self.journal, deadline)
        return 0

    def wait_for_a_submission_under_way(self) -> None:
        """Another actor (the keeper, the job's control step, a user's --retry) that took the
        run's next generation and has not heard from its sbatch yet is waited for, up to
        generations.PENDING_SUBMIT_S, outside the journal's lock: once it named its job (or
        queued nothing), the guardian judges what it left."""
        deadline = time.monotonic() + generations.PENDING_SUBMIT_S
        while (newest := generations.newest(self.run.root)) is not None and generations.pending(newest):
            if time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def _claim(self, job_ids: tuple[str, ...]) -> generations.Generation | None:
        """The guardian's `submit` generation, taken on the generation of the job it guards
        (exactly one of the guardian, the keeper and a --retry wins); raises Superseded when the
        run's newest act is not that job's. None: a run dir from before generations."""
        based_on = generations.basis(self.run.root, job_ids)
        if based_on is None and generations.numbers(self.run.root):
            raise generations.Superseded(0, generations.newest(self.run.root))
        after = based_on.number if based_on else 0
        claim = generations.take(self.run.root, after, generations.submission("guardian", generations.new_token()))
        fencing.adopt(self.run.root, claim)
        return claim

    def _resubmit(self, decision: Decision, claim: generations.Generation | None) -> int:
        """job.sbatch again, into the same run dir (its generation taken first, its token in the
        new job's environment); then the events (with the new job's id), the new job in
        submission.json, its own guardian, and last the generation naming the new job (its first
        life begins after that). sbatch failing: what the decision says comes instead (`otherwise`)."""
        faults.point("guardian.before_sbatch")
        env = outside_job_env(os.environ)
        if claim is not None:
            env[generations.TOKEN_ENV] = claim.token or ""
        done = client.submit(self.run.job_script, purpose=Purpose.GUARDIAN_SUBMIT, env=env)
        new_job = done.value
        if new_job is None:
            if claim is not None and not done.unsure:
                fencing.withdraw(self.run.root, claim)  # sbatch refused: it queued nothing
            why = done.why()
            if done.unsure:
                why += ": a new job may have been queued all the same (see squeue)"
            failed = decision.because(why)
            for event in failed.events:
                self.journal.write_event(dataclasses.replace(event, time=time.time()))
            print(f"hpctrain guardian: submitting {self.run.job_script} again failed ({why})", file=sys.stderr)
            self._run_ended("fail")
            return 1
        for event in decision.resubmitted(new_job).events:
            self.journal.write_event(event)
        self.run.record_resubmission(new_job)
        print(f"hpctrain guardian: the run goes on in job {new_job} (same run dir)", file=sys.stderr)
        if claim is not None:  # the new job may begin from here on: the guardian writes no more
            generations.name_job(self.run.root, claim, new_job)
        submit_guardian(self.run, new_job)
        return 0

    def _run_ended(self, action: str) -> None:
        """The run has ended: its listeners are told (hpctrain.run.listeners)."""
        from hpctrain.run.listeners import tell_listeners

        tell_listeners(self.run, action)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.exit("usage: python -m hpctrain.recovery.guardian RUN_DIR JOB | ARRAY_LINKS ARRAY_[TASKS]")
    if is_array_links(Path(args[0])):  # a sweep's array: one guardian for all its tasks
        from hpctrain.recovery.array_guardian import ArrayGuardian

        sys.exit(ArrayGuardian(Path(args[0]), args[1]).watch())
    try:
        guardian = Guardian(Path(args[0]), args[1])
    except ValueError as error:  # config.yaml edited by hand into a wrong value
        sys.exit(f"hpctrain guardian: {error}")
    sys.exit(guardian.watch())


if __name__ == "__main__":
    main()
