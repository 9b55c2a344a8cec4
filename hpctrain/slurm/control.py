"""What the batch script does between training steps: classify, budget, record, decide.

    python -m hpctrain.slurm.control begin RUN_DIR
        at every start of the batch script. A restart Slurm made on its own (the batch node
        died, an administrator requeued) is recorded as a node failure. Exit 0 to train, 3 when
        a restart budget is spent.
    python -m hpctrain.slurm.control after-step RUN_DIR EXIT_CODE TERMINATED WARNED EXCLUDED
        when the srun step has ended (TERMINATED: the shell got SIGTERM, i.e. scancel; WARNED:
        it got the time-limit signal). Prints one action for the shell:
            finish              the run is done
            requeue [NODES]     scontrol requeue this job (after excluding NODES)
            relaunch NODES      srun again at once on the survivors, excluding NODES
            stop                scancel'ed, a budget is spent, or a training process refused
                                a user's mistake (events.jsonl `failure`, cause user_error)
Every decision is written to events.jsonl (`requeue`, `relaunch`, `failure`, `cancelled`).
This module imports no torch: it runs in the batch shell and must answer in a moment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from hpctrain.exitcodes import EXIT_HANG, EXIT_REQUEUE, EXIT_STOPPED
from hpctrain.journal import Journal, read_jsonl
from hpctrain.slurm.env import parse_node_list

EXIT_BUDGET_SPENT = 3


class Controller:
    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.env = dict(os.environ) if env is None else env
        slurm = OmegaConf.load(run_dir / "config.yaml").get("slurm", {})
        self.nodes = int(slurm.get("nodes", 1))
        self.max_restarts = int(slurm.get("max_restarts", 20))
        self.budget = dict(slurm.get("restart_budget", {}))
        self.journal = Journal(run_dir / "events.jsonl")
        self.job_id = self.env.get("SLURM_JOB_ID", "")
        self.restart = int(self.env.get("SLURM_RESTART_COUNT", "0"))

    # ---- history ----------------------------------------------------------------------------

    def _events(self) -> list[dict]:
        return [e for e in read_jsonl(self.run_dir / "events.jsonl") if e.get("job_id", self.job_id) == self.job_id]

    def restarts_by_cause(self) -> Counter:
        return Counter(e.get("cause") for e in self._events() if e.get("event") in ("requeue", "relaunch"))

    def _over_budget(self, cause: str) -> str | None:
        done = self.restarts_by_cause()
        if done[cause] + 1 > int(self.budget.get(cause, 0)):
            return f"restart budget for {cause} spent ({done[cause]} of {self.budget.get(cause, 0)})"
        if sum(done.values()) + 1 > self.max_restarts:
            return f"slurm.max_restarts spent ({sum(done.values())} of {self.max_restarts})"
        return None

    # ---- begin --------------------------------------------------------------------------------

    def begin(self) -> int:
        requeues = sum(1 for e in self._events() if e.get("event") == "requeue")
        if self.restart > requeues:
            # Slurm restarted the job without the batch script asking: its node died (or an
            # administrator requeued it). Count it against the node-failure budget.
            lost = self._nodes_down(self._previous_nodes())
            self.journal.event("failure", job_id=self.job_id, restart=self.restart, cause="node_failure",
                               nodes=lost, by="slurm")
            self.journal.event("requeue", job_id=self.job_id, restart=self.restart, cause="node_failure", by="slurm")
            done = self.restarts_by_cause()
            if done["node_failure"] > int(self.budget.get("node_failure", 0)) or sum(done.values()) > self.max_restarts:
                self.journal.event("failure", job_id=self.job_id, cause="budget",
                                   reason=f"restart budget for node_failure spent ({done['node_failure']})")
                return EXIT_BUDGET_SPENT
        return 0

    def _previous_nodes(self) -> list[str]:
        starts = [e for e in self._events() if e.get("event") == "start"]
        return list(starts[-1].get("nodes", [])) if starts else []

    # ---- after a step -------------------------------------------------------------------------

    def _since_last_start(self) -> list[dict]:
        events = self._events()
        starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
        return events[starts[-1]:] if starts else []

    def _saved_for(self) -> str | None:
        """The reason of a signal-forced save in this step, as rank 0 recorded it. Read from the
        journal rather than srun's exit code, which --kill-on-bad-exit can blur."""
        reasons = [e.get("reason") for e in self._since_last_start() if e.get("event") == "checkpoint"]
        return reasons[-1] if reasons and reasons[-1] in ("timelimit", "preempt", "interrupt") else None

    def after_step(self, exit_code: int, terminated: bool, excluded: list[str], warned: bool = False) -> str:
        recent = self._since_last_start()
        if exit_code == 0 or any(e.get("event") == "finish" for e in recent):
            return "finish"
        if self._user_error():
            return "stop"  # a bad value or file: every retry would fail alike; the worker said why
        saved_for = self._saved_for()
        if terminated and (saved_for or exit_code == EXIT_STOPPED):
            self.journal.event("cancelled", job_id=self.job_id, restart=self.restart, step=self._last_step())
            return "stop"
        lost = sorted(set(self._lost_nodes()) - set(excluded))
        if lost:
            cause = "node_failure"
        elif saved_for == "timelimit" or exit_code == EXIT_REQUEUE or warned:
            # `warned` alone: the warning came before the workers could take it (start-up).
            cause = "timelimit"
        elif saved_for in ("preempt", "interrupt") or exit_code == EXIT_STOPPED:
            cause = "preempt"  # SIGTERM to the tasks but not to this shell: Slurm's preemption
        elif exit_code == EXIT_HANG:
            cause = "hang"
        else:
            cause = "crash"
        if cause in ("node_failure", "crash", "hang"):
            self.journal.event("failure", job_id=self.job_id, restart=self.restart, cause=cause,
                               nodes=lost, exit_code=exit_code)
        spent = self._over_budget(cause)
        if spent:
            self.journal.event("failure", job_id=self.job_id, cause="budget", reason=spent)
            return "stop"
        excluded = sorted(set(excluded) | set(lost))
        survivors = [n for n in self._allocated_nodes() if n not in excluded]
        if cause == "node_failure" and len(survivors) >= self.nodes:
            self.journal.event("relaunch", job_id=self.job_id, restart=self.restart, cause=cause, failed=lost,
                               excluded=excluded, nodes=survivors[: self.nodes],
                               spare_nodes=len(survivors) - self.nodes)
            return "relaunch " + ",".join(excluded)
        self.journal.event("requeue", job_id=self.job_id, restart=self.restart, cause=cause, excluded=excluded)
        return "requeue " + ",".join(excluded) if excluded else "requeue"

    def _user_error(self) -> bool:
        """A training process of this start refused to run (hpctrain.worker, cause user_error)."""
        return any(
            (e.get("event"), e.get("cause")) == ("failure", "user_error") and int(e.get("restart") or 0) == self.restart
            for e in self._events()
        )

    def _last_step(self) -> int | None:
        steps = [e["step"] for e in self._events() if e.get("event") == "checkpoint" and "step" in e]
        return steps[-1] if steps else None

    # ---- what Slurm says ----------------------------------------------------------------------

    def _allocated_nodes(self) -> list[str]:
        """The job's nodes now: with --no-kill a failed node leaves the allocation."""
        done = _ask_slurm("scontrol", "show", "job", "-o", self.job_id)
        match = re.search(r"\bNodeList=(\S+)", done.stdout)
        if done.returncode != 0 or not match or match.group(1) == "(null)":
            return parse_node_list(self.env.get("SLURM_JOB_NODELIST", ""))
        return parse_node_list(match.group(1))

    def _lost_nodes(self) -> list[str]:
        """Nodes of this job that left the allocation or are down (names as Slurm gives them)."""
        original = parse_node_list(self.env.get("SLURM_JOB_NODELIST", "")) if self.env.get("SLURM_JOB_NODELIST") else []
        now = set(self._allocated_nodes())
        gone = [n for n in original if n not in now]
        return sorted(set(gone) | set(self._nodes_down(original)))

    def _nodes_down(self, nodes: list[str]) -> list[str]:
        if not nodes:
            return []
        done = _ask_slurm("sinfo", "-h", "-N", "-t", "down,drain,fail,failing,no_respond", "-o", "%N")
        down = set(done.stdout.split()) if done.returncode == 0 else set()
        return sorted(set(nodes) & down)


def _ask_slurm(*command: str) -> subprocess.CompletedProcess:
    """Slurm's answer; a failed one where its command is missing. Through slurm.task_prefix the
    control steps may run in a container image without Slurm's commands: the job goes on with
    what its environment says, and the output says how to see node failures again."""
    try:
        return subprocess.run(list(command), capture_output=True, text=True)
    except OSError as error:
        print(
            f"hpctrain: {command[0]} cannot run here ({error.strerror}); node failures go unseen: set "
            "slurm.control_python to a Python outside the container",
            file=sys.stderr,
        )
        return subprocess.CompletedProcess(list(command), 127, "", "")


_NODE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == "begin":
        sys.exit(Controller(Path(args[1])).begin())
    if len(args) == 6 and args[0] == "after-step":
        excluded = [n for n in args[5].split(",") if _NODE_NAME.match(n)]
        print(Controller(Path(args[1])).after_step(int(args[2]), args[3] == "1", excluded, warned=args[4] == "1"))
        return
    sys.exit(
        "usage: python -m hpctrain.slurm.control begin RUN_DIR"
        " | after-step RUN_DIR CODE TERMINATED WARNED EXCLUDED"
    )


if __name__ == "__main__":
    main()
