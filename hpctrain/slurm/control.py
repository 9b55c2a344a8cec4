"""The batch script's control step: gather the facts, let hpctrain.run.decide decide, apply.

    python -m hpctrain.slurm.control begin RUN_DIR
        at every start of the batch script: a restart Slurm made on its own is recorded and
        counted. Exit 0 to train, 3 (CONTROL_BUDGET_SPENT) when a restart budget is spent.
    python -m hpctrain.slurm.control after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED
        when the srun step has ended (CODE `-`: no step was launched, a signal came first;
        TERMINATED: the shell got SIGTERM; WARNED: the time-limit signal; LAUNCHED: the UNIX
        time the step was launched, so it is judged by its own events only). Prints one line:
        `finish`, `requeue [NODES]`, `relaunch NODES`, `stop` or `fail`.
    python -m hpctrain.slurm.control cancelled RUN_DIR
        from the shell's SIGTERM trap: `cancelled` recorded at once (Slurm kills the shell
        KillWait seconds after scancel, maybe before after-step); once per life.
    python -m hpctrain.slurm.control requeue-refused RUN_DIR EXCLUDED MESSAGE
        scontrol refused the requeue: submit the run dir's job.sbatch again (same run dir, it
        resumes), or end FAILED saying why. Never exits 0.
Every Slurm call is checked; a failed one is said on stderr (the job's output) with what it
means for the decision. This module imports no torch: it must answer in a moment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from hpctrain.run import exitcodes
from hpctrain.run.causes import Cause
from hpctrain.run.decide import Decision, History, decide, decide_begin, decide_cancelled, lineage
from hpctrain.run.events import Failure, Journal, read_events
from hpctrain.run.facts import Budgets, ClusterView, Outcome, parse_sinfo_nodes, parse_time_left
from hpctrain.run.jsonlines import locked
from hpctrain.run.paths import RunDir
from hpctrain.slurm.env import parse_node_list
from hpctrain.slurm.jobid import job_of


class Controller:
    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run = RunDir(run_dir)
        self.env = dict(os.environ) if env is None else env
        self.slurm = OmegaConf.load(self.run.config).get("slurm", {})
        self.journal = Journal(self.run.events)
        # `<array>_<task>` in an array task (what submission.json, the events and hpctrain-cancel
        # call it): its SLURM_JOB_ID may name the whole array to scontrol.
        self.job_id = job_of(self.env)
        self.restart = int(self.env.get("SLURM_RESTART_COUNT", "0"))
        # The task's own number, its other name (events an older hpctrain wrote carry it).
        number = self.env.get("SLURM_JOB_ID", "")
        self.aliases = (number,) if number and number != self.job_id else ()

    # ---- facts -----------------------------------------------------------------------------------

    def budgets(self) -> Budgets:
        total = self.slurm.get("max_restarts")
        return Budgets(dict(self.slurm.get("restart_budget", {})), None if total is None else int(total))

    def history(self, launched_at: float | None = None) -> History:
        events = lineage(read_events(self.run.events), self.job_id, self.aliases)
        since = () if launched_at is None else tuple(e for e in events if e.time >= launched_at)
        return History(self.job_id, self.restart, events, since, self.aliases)

    def cluster(self) -> ClusterView:
        original = self.env.get("SLURM_JOB_NODELIST", "")
        return ClusterView(
            nodes=self._node_states(),
            allocated=tuple(self._allocated_nodes()),
            original=tuple(parse_node_list(original)) if original else (),
            time_left_s=self._time_left(),
        )

    def _node_states(self) -> dict:
        done = ask_slurm("sinfo", "-N", "-h", "-a", "-o", "%N|%T|%E", meaning="node failures go unseen")
        try:
            return parse_sinfo_nodes(done.stdout) if done.returncode == 0 else {}
        except ValueError as error:
            print(f"hpctrain: {error}; node failures go unseen", file=sys.stderr)
            return {}

    def _allocated_nodes(self) -> list[str]:
        """The job's nodes now: with --no-kill a failed node leaves the allocation."""
        done = ask_slurm("scontrol", "show", "job", "-o", self.job_id, meaning="using SLURM_JOB_NODELIST")
        match = re.search(r"\bNodeList=(\S+)", done.stdout)
        if done.returncode != 0 or not match or match.group(1) == "(null)":
            listed = self.env.get("SLURM_JOB_NODELIST", "")
            return parse_node_list(listed) if listed else []
        return parse_node_list(match.group(1))

    def _time_left(self) -> float | None:
        done = ask_slurm("squeue", "-h", "-j", self.job_id, "-o", "%L", meaning="no relaunch is risked")
        try:
            return parse_time_left(done.stdout) if done.returncode == 0 else None
        except ValueError as error:
            print(f"hpctrain: {error}; no relaunch is risked", file=sys.stderr)
            return None

    def outcome(self, exit_code: int | None, terminated: bool, warned: bool, excluded: list[str]) -> Outcome:
        exclude = self.slurm.get("exclude")
        return Outcome(
            exit_code=exit_code,
            terminated=terminated,
            warned=warned,
            excluded=tuple(excluded),
            user_exclude=tuple(parse_node_list(str(exclude))) if exclude else (),
            nodes_wanted=int(self.slurm.get("nodes", 1)),
            signal_delay_s=float(self.slurm.get("signal_delay_s", 0)),
        )

    # ---- the steps -------------------------------------------------------------------------------

    def begin(self) -> int:
        decision = decide_begin(self.history(), self.cluster(), self.budgets())
        if decision is None:
            return 0
        self._record(decision)
        if decision.action.value == "fail":
            self._trial_ended("fail")
            return exitcodes.CONTROL_BUDGET_SPENT
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
        outcome = self.outcome(exit_code, terminated, warned, excluded)
        decision = decide(self.history(launched_at), outcome, self.cluster(), self.budgets())
        self._record(decision)
        if decision.action.value in ("finish", "fail", "stop"):
            self._trial_ended(decision.action.value)
        return " ".join([decision.action.value, ",".join(decision.excluded)]).strip()

    def cancelled(self) -> int:
        """The shell's SIGTERM trap: record `cancelled` now, once per life. Under the journal's
        lock, as hpctrain-cancel records it: whichever comes second sees the other's record."""
        with locked(self.run.events):
            self._record(decide_cancelled(self.history()))
        return 0

    def requeue_refused(self, excluded: str, message: str) -> int:
        """scontrol refused the requeue: submit job.sbatch again into the same run dir."""
        reason = f"scontrol requeue refused: {message.strip() or 'no message'}"
        if self._requeued_anyway():  # only the ExcNodeList update failed: Slurm restarts this job
            print(f"hpctrain: {reason}; the job was requeued all the same", file=sys.stderr)
            return exitcodes.BATCH_FINISHED
        resubmitted = (
            self._sbatch_again(excluded)
            if self.run.job_script.is_file()
            else (None, f"{self.run.job_script} is missing")
        )
        job_id, why = resubmitted
        if job_id:
            self.run.record_resubmission(job_id)
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
        self.journal.write_event(
            Failure(
                job_id=self.job_id,
                restart=self.restart,
                cause=Cause.REQUEUE_REFUSED,
                reason=f"{reason}; submitting again failed: {why}",
                action="fail",
            )
        )
        print(f"hpctrain: {reason}; submitting again failed: {why}", file=sys.stderr)
        self._trial_ended("fail")
        return exitcodes.BATCH_FAILED

    def _requeued_anyway(self) -> bool:
        done = ask_slurm("scontrol", "show", "job", "-o", self.job_id, meaning="taking the requeue as refused")
        restarts = re.search(r"\bRestarts=(\d+)", done.stdout)
        return done.returncode == 0 and restarts is not None and int(restarts.group(1)) > self.restart

    def _sbatch_again(self, excluded: str) -> tuple[str | None, str]:
        # The job's own SLURM_*/SBATCH_* would pass into the new job as its options: leave them out.
        env = {k: v for k, v in self.env.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        if "SLURM_CONF" in self.env:
            env["SLURM_CONF"] = self.env["SLURM_CONF"]
        command = ["sbatch", "--parsable", *([f"--exclude={excluded}"] if excluded else []), str(self.run.job_script)]
        done = ask_slurm(*command, env=env, meaning="the run cannot go on in a new job")
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            return None, (done.stderr.strip() or done.stdout.strip() or f"sbatch exited {done.returncode}")
        return job_id, ""

    def _trial_ended(self, action: str) -> None:
        """A trial of hpctrain-tune's study (trial.json in its run dir) has ended: tell the study
        and submit the next trials. Other runs pay one stat() and import nothing."""
        if self.run.trial.is_file():
            from hpctrain.tune.report import trial_ended

            trial_ended(self.run.root, action)

    def _record(self, decision: Decision) -> None:
        for event in decision.events:
            self.journal.write_event(event)
        if decision.message:
            print(f"hpctrain: {decision.message}", file=sys.stderr)


def ask_slurm(*command: str, meaning: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Slurm's answer. A refusal or a missing command is said on stderr with what it means
    here: through slurm.task_prefix the control steps may run in an image without Slurm."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        why = error.strerror if isinstance(error, OSError) else "no answer in 60 s"
        print(
            f"hpctrain: {command[0]} cannot run here ({why}); {meaning}: set slurm.control_python to a Python "
            "outside the container",
            file=sys.stderr,
        )
        return subprocess.CompletedProcess(list(command), 127, "", "")
    if done.returncode != 0:
        print(
            f"hpctrain: `{' '.join(command)}` failed ({done.returncode}: {done.stderr.strip()}); {meaning}",
            file=sys.stderr,
        )
    return done


_NODE_NAME = re.compile(r"^[A-Za-z0-9._\[\]-]+$")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "begin":
        sys.exit(Controller(Path(args[1])).begin())
    if len(args) == 7 and args[0] == "after-step":
        excluded = [n for n in args[5].split(",") if _NODE_NAME.match(n)]
        terminated, warned = args[3] == "1", args[4] == "1"
        launched_at = float(args[6] or 0)
        code = None if args[2] == "-" else int(args[2])
        print(Controller(Path(args[1])).after_step(code, terminated, excluded, warned, launched_at))
        return
    if len(args) == 2 and args[0] == "cancelled":
        sys.exit(Controller(Path(args[1])).cancelled())
    if len(args) == 4 and args[0] == "requeue-refused":
        sys.exit(Controller(Path(args[1])).requeue_refused(args[2], args[3]))
    sys.exit(
        "usage: python -m hpctrain.slurm.control begin RUN_DIR"
        " | after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED LAUNCHED | cancelled RUN_DIR"
        " | requeue-refused RUN_DIR EXCLUDED MESSAGE"
    )


if __name__ == "__main__":
    main()
