"""The one module that names Slurm's commands: sbatch, scontrol, squeue, sacct, sinfo, scancel and
sacctmgr, each behind a typed verb (`show_job(job) -> JobRecord | None`, `submit(script) -> job
id`, `cancel`, `signal`, `nodes`, ...). A verb returns the `Reply` (hpctrain.slurm.runner: did
Slurm answer, was it a refusal, may it have acted all the same) or, when there is something to
read from Slurm's words, an `Answer` that carries the reply and the parsed `value`.

Every caller names its `Purpose`, and POLICIES below holds each purpose's time limit and retries:
the one table of how long hpctrain waits for Slurm, and why.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from hpctrain.slurm.jobid import expand
from hpctrain.slurm.node_columns import NodeColumns
from hpctrain.slurm.records import (
    JobRecord,
    parse_config,
    parse_job_record,
    parse_job_records,
    parse_partition,
    parse_reservations,
    reason_of,
)
from hpctrain.slurm.runner import Answer, Kind, Policy, Reply, kind_of, run_command

__all__ = ["Answer", "Kind", "Policy", "Reply", "kind_of"]

SBATCH = "sbatch"
SCONTROL = "scontrol"
SQUEUE = "squeue"
SACCT = "sacct"
SINFO = "sinfo"
SCANCEL = "scancel"
SACCTMGR = "sacctmgr"
SRUN = "srun"  # one-task steps on one node: the keeper's probe, a relaunch's node check
COMMANDS = frozenset({SBATCH, SCONTROL, SQUEUE, SACCT, SINFO, SCANCEL, SACCTMGR, SRUN})


# How long an in-job program waits out a slurmctld restart (a failover, an upgrade) before it acts
# on its own: the control step's unanswered requeue and its resubmission, the keeper.
RESTART_WAIT_S = 60.0


class Purpose(Enum):
    """Who asks Slurm, and what for: each has one row in POLICIES."""

    LOOK = "look"
    READ = "read"
    SUBMIT = "submit"
    CANCEL = "cancel"
    IN_JOB = "in job"
    AFTER_SIGTERM = "after sigterm"
    KEEPER_LOOK = "keeper look"
    RESUBMIT = "resubmit"
    GUARDIAN_LOOK = "guardian look"
    GUARDIAN_SUBMIT = "guardian submit"
    REQUEUE_LOOK = "requeue look"
    REQUEUE = "requeue"
    UPDATE_PENDING = "update pending"
    KEEPER_PROBE = "keeper probe"
    NODE_CHECK = "node check"


POLICIES: dict[Purpose, Policy] = {
    # A look from a login node whose caller decides nothing without an answer (hpctrain-status,
    # hpctrain-follow's poll, hpctrain-submit's check of a run dir's job, a study's lost trials).
    Purpose.LOOK: Policy(timeout_s=30.0),
    # What a login-node command must know before it acts (a sweep's limits): worth waiting out a
    # controller restart.
    Purpose.READ: Policy(timeout_s=30.0, retry_for_s=90.0),
    # hpctrain-submit's sbatch: retried only while Slurm says the request never left (a reply that
    # never came may hide a queued job).
    Purpose.SUBMIT: Policy(timeout_s=120.0, retry_for_s=90.0, retry_unsure=False),
    # scancel from a login node (hpctrain-cancel, a failed submission's undo, the keeper's cancel
    # of its own job): cancelling twice changes nothing, so every no answer is retried.
    Purpose.CANCEL: Policy(timeout_s=60.0, retry_for_s=90.0),
    # Inside a job (the control step, the trainer's GraceTime and KillWait lookup, the watcher's
    # kill of a silent step): short, each caller has a fallback, and the control step bounds all
    # its calls together (its `until`).
    Purpose.IN_JOB: Policy(timeout_s=15.0),
    # After a SIGTERM, Slurm kills within KillWait (5 s on some sites): the batch shell's trap and
    # the trainer ask whether it was a requeue or a preemption, worth this much of that time.
    Purpose.AFTER_SIGTERM: Policy(timeout_s=3.0),
    # The keeper's look at the job before it acts: slurmctld may be restarting (the node loss
    # that silenced the batch host often comes with a busy controller).
    Purpose.KEEPER_LOOK: Policy(timeout_s=15.0, retry_for_s=60.0),
    # sbatch from inside the job (a refused requeue, a lost batch host): retried only when Slurm
    # says the request never left, for as long as the control step waits out a restart.
    Purpose.RESUBMIT: Policy(timeout_s=30.0, retry_for_s=RESTART_WAIT_S, retry_unsure=False),
    # The guardian's look at the ended job: slurmctld may be restarting (a node failure often
    # comes with a busy controller), and Slurm keeps an ended job's record MinJobAge (300 s).
    Purpose.GUARDIAN_LOOK: Policy(timeout_s=30.0, retry_for_s=180.0),
    # sbatch from the guardian, and of the guardian: retried only while Slurm says the request
    # never left, as long as the guardian's look.
    Purpose.GUARDIAN_SUBMIT: Policy(timeout_s=60.0, retry_for_s=180.0, retry_unsure=False),
    # A requeue that got no answer: look at the job for as long as the caller's `until` allows.
    Purpose.REQUEUE_LOOK: Policy(timeout_s=15.0, retry_for_s=math.inf),
    # `scontrol requeue`: retried only when it was never sent (UNREACHABLE), until `until`.
    Purpose.REQUEUE: Policy(timeout_s=15.0, retry_for_s=math.inf, retry_unsure=False),
    # ExcNodeList and NumNodes of a requeued job: one try each, the caller tries again (Slurm
    # refuses the update for a few seconds after it removed a failed node from the job).
    Purpose.UPDATE_PENDING: Policy(timeout_s=15.0),
    # The keeper's one step on the silent batch host: a node that answers runs it in a second or
    # two; one that is lost never does (Slurm's MessageTimeout is 10 s). Never retried.
    Purpose.KEEPER_PROBE: Policy(timeout_s=20.0),
    # A relaunch's check of each node it may use (hpctrain.recovery.node_check): a node that
    # answers runs it in a second or two, one that died silently never (MessageTimeout, 10 s).
    # Never retried: no answer is the answer.
    Purpose.NODE_CHECK: Policy(timeout_s=15.0),
}


def run(
    command: Sequence[str],
    policy: Policy,
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    until: float | None = None,
) -> Reply:
    """Run one Slurm command under `policy` (hpctrain.slurm.runner); the verbs below are the way
    to ask Slurm, this is what they run."""
    if not command or Path(command[0]).name not in COMMANDS:
        raise ValueError(f"not a Slurm command: {list(command)!r}")
    return run_command(command, policy, env=env, stdin=stdin, until=until)


def _ask(
    command: Sequence[str],
    purpose: Purpose,
    env: Mapping[str, str] | None = None,
    until: float | None = None,
    stdin: str | None = None,
) -> Reply:
    return run(command, POLICIES[purpose], env=env, stdin=stdin, until=until)


def available(command: str) -> bool:
    """Whether one of Slurm's commands (SQUEUE, SACCT, ...) can run here (it is on PATH)."""
    return shutil.which(command) is not None


# ---- scontrol --------------------------------------------------------------------------------


def show_job(
    job_id: str, purpose: Purpose, *, env: Mapping[str, str] | None = None, until: float | None = None
) -> Answer[JobRecord | None]:
    """`scontrol show job -o JOB`: its record; None unless Slurm answered with one."""
    done = _ask([SCONTROL, "show", "job", "-o", job_id], purpose, env, until)
    return Answer(done, parse_job_record(done.stdout) if done.ok else None)


def show_jobs(job_ids: Sequence[str], purpose: Purpose) -> Answer[list[JobRecord]]:
    """Many jobs' records from one scontrol (`scontrol show job` takes one id; fed commands on
    stdin, one scontrol answers them all). It fails (exit 1) when any id is unknown and still
    prints the others: the records are read whatever the exit code."""
    commands = "".join(f"show job {job_id}\n" for job_id in job_ids)
    done = _ask([SCONTROL, "-o"], purpose, stdin=commands)
    return Answer(done, parse_job_records(done.stdout))


def show_partition(
    name: str, purpose: Purpose, *, env: Mapping[str, str] | None = None, until: float | None = None
) -> Answer[dict[str, str]]:
    """`scontrol show partition -o NAME`: its `Key=value` words; empty unless Slurm answered."""
    done = _ask([SCONTROL, "show", "partition", "-o", name], purpose, env, until)
    return Answer(done, parse_partition(done.stdout) if done.ok else {})


def show_reservations(purpose: Purpose) -> Answer[list[dict[str, str]]]:
    """`scontrol show reservation -o`: each reservation's `Key=value` words; [] unless Slurm answered."""
    done = _ask([SCONTROL, "show", "reservation", "-o"], purpose)
    return Answer(done, parse_reservations(done.stdout) if done.ok else [])


def show_config(purpose: Purpose, *, env: Mapping[str, str] | None = None) -> Answer[dict[str, str]]:
    """`scontrol show config`: its `Name = value` settings; empty unless Slurm answered."""
    done = _ask([SCONTROL, "show", "config"], purpose, env)
    return Answer(done, parse_config(done.stdout) if done.ok else {})


def requeue(job_id: str, purpose: Purpose, *, until: float | None = None) -> Reply:
    """`scontrol requeue JOB` (`<array>_<task>` in an array: the array's own number would requeue
    every task)."""
    return _ask([SCONTROL, "requeue", job_id], purpose, until=until)


def update_job(
    job_id: str, settings: Mapping[str, str | int], purpose: Purpose, *, until: float | None = None
) -> Reply:
    """`scontrol update jobid=JOB Key=value ...`, the settings in the order given."""
    words = [f"{key}={value}" for key, value in settings.items()]
    return _ask([SCONTROL, "update", f"jobid={job_id}", *words], purpose, until=until)


# ---- sbatch ----------------------------------------------------------------------------------


def submit(
    script: Path | str,
    *script_args: str,
    purpose: Purpose,
    dependency: str | None = None,
    exclude: str | None = None,
    nodes: int | None = None,
    begin: str | None = None,
    env: Mapping[str, str] | None = None,
    until: float | None = None,
) -> Answer[str | None]:
    """`sbatch --parsable [--dependency=D] [--exclude=E] [--nodes=N] SCRIPT ARGS...`: the new job's
    id (`--parsable` prints `id` or `id;cluster`); None unless Slurm queued it and said which.
    Run from inside a job, `env` must leave the job's own settings out (hpctrain.submit.outside_job)."""
    options = [
        *([f"--dependency={dependency}"] if dependency else []),
        *([f"--exclude={exclude}"] if exclude else []),
        *([f"--nodes={nodes}"] if nodes is not None else []),
        *([f"--begin={begin}"] if begin else []),
    ]
    done = _ask([SBATCH, "--parsable", *options, str(script), *script_args], purpose, env, until)
    said = done.stdout.strip()
    job_id = said.splitlines()[-1].split(";")[0] if done.ok and said else ""
    return Answer(done, job_id if job_id.isdigit() else None)


# ---- scancel ---------------------------------------------------------------------------------


def cancel_command(job_ids: Sequence[str], verbose: bool = False) -> list[str]:
    """The scancel `cancel` runs (hpctrain-cancel --dry-run shows it). `-v`: scancel then says
    which jobs it could not end (its exit status is 0 all the same)."""
    return [SCANCEL, *(["-v"] if verbose else []), *job_ids]


def cancel(
    job_ids: Sequence[str],
    purpose: Purpose,
    *,
    verbose: bool = False,
    env: Mapping[str, str] | None = None,
    until: float | None = None,
) -> Reply:
    """scancel the jobs (or array tasks)."""
    return _ask(cancel_command(job_ids, verbose), purpose, env, until)


def signal(
    target: str,
    signal_name: str,
    purpose: Purpose,
    *,
    env: Mapping[str, str] | None = None,
    until: float | None = None,
) -> Reply:
    """`scancel --signal=NAME TARGET`: a job or a step (`JOB.STEP`)."""
    return _ask([SCANCEL, f"--signal={signal_name}", target], purpose, env, until)


# ---- squeue ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    """One job (or array task) squeue lists."""

    job_id: str
    state: str  # in full: PENDING, not PD
    reason: str | None  # why it waits (BeginTime after a requeue); None when there is none


def job_state(job_id: str, purpose: Purpose) -> Answer[str | None]:
    """`squeue -h -r -j JOB -o %T`: its state while queued or running; None when squeue lists it
    not (or did not answer). Asked about one job it no longer lists, squeue fails with "Invalid
    job id specified": an answer all the same."""
    done = _ask([SQUEUE, "-h", "-r", "-j", job_id, "-o", "%T"], purpose)
    lines = done.stdout.strip().splitlines() if done.ok else []
    return Answer(done, lines[0].strip() if lines else None)


def queue(job_ids: Sequence[str], purpose: Purpose) -> Answer[list[QueueRow]]:
    """`squeue -h -j IDS -r -o %i|%T|%r`: the asked jobs squeue lists, one row per job or array
    task (-r; a pending array folded into `36_[7-9]`, seen on 22.05 without -r, is read as each
    of its tasks all the same). Asked about several jobs, squeue lists those it knows; about a
    single one it no longer lists, it fails with "Invalid job id specified" (no rows)."""
    done = _ask([SQUEUE, "-h", "-j", ",".join(job_ids), "-r", "-o", "%i|%T|%r"], purpose)
    rows = []
    for line in done.stdout.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3:
            rows += [QueueRow(job_id, parts[1], reason_of(parts[2])) for job_id in expand(parts[0])]
    return Answer(done, rows)


def user_jobs(user: str, purpose: Purpose) -> Answer[list[str]]:
    """`squeue -u USER -h -r -o %i`: the ids of the user's queued and running jobs, one per job or
    array task (a pending meta record as squeue prints it: `36_[3-9%2]`)."""
    done = _ask([SQUEUE, "-u", user, "-h", "-r", "-o", "%i"], purpose)
    return Answer(done, [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.ok else [])


def time_left(job_id: str, purpose: Purpose, *, until: float | None = None) -> Answer[str]:
    """`squeue -h -j JOB -o %L`: the job's time left as squeue prints it (`D-HH:MM:SS`, UNLIMITED,
    NOT_SET; hpctrain.recovery.facts.parse_time_left reads it); "" unless Slurm answered."""
    done = _ask([SQUEUE, "-h", "-j", job_id, "-o", "%L"], purpose, until=until)
    return Answer(done, done.stdout.strip() if done.ok else "")


def job_steps(job_id: str, purpose: Purpose, *, until: float | None = None) -> Answer[list[str]]:
    """`squeue -h -s -j JOB -o %i`: the job's steps (`JOB.STEP`, `JOB.batch`, ...); empty unless
    Slurm answered."""
    done = _ask([SQUEUE, "-h", "-s", "-j", job_id, "-o", "%i"], purpose, until=until)
    return Answer(done, done.stdout.split() if done.ok else [])


def probe_process(job_id: str, node: str, pid: int, purpose: Purpose, *, until: float | None = None) -> Reply:
    """`srun ... kill -0 PID` on NODE (run_on_node): asks whether process PID lives there. ok: it
    does (the node and that process are alive); an answer with another exit code: the step ran
    and the process is gone, or Slurm refused the step; no answer in time: the node did not run it."""
    return run_on_node(job_id, node, ["kill", "-0", str(pid)], purpose, until=until)


def run_on_node(job_id: str, node: str, command: list[str], purpose: Purpose, *, until: float | None = None) -> Reply:
    """`srun --overlap --jobid=JOB --nodelist=NODE --ntasks=1 ... COMMAND`: a one-task step of the
    job on NODE beside whatever runs there (no GPU, one CPU), its exit code not ending the job."""
    step = [
        SRUN,
        "--overlap",
        f"--jobid={job_id}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--gres=none",
        "--kill-on-bad-exit=0",
    ]
    return _ask([*step, *command], purpose, until=until)


# ---- sinfo, sacct, sacctmgr ------------------------------------------------------------------


def nodes(
    columns: NodeColumns, purpose: Purpose, *, until: float | None = None, names: Sequence[str] = ()
) -> Answer[str]:
    """`sinfo -N -h -a -o COLUMNS [-n NAMES]`: every node (or those named), one line per node and
    partition, in sinfo's words (the recovery's parsers read them); "" unless Slurm answered."""
    named = ["-n", ",".join(names)] if names else []
    done = _ask([SINFO, "-N", "-h", "-a", *named, "-o", columns.value], purpose, until=until)
    return Answer(done, done.stdout if done.ok else "")


def accounting(job_ids: Sequence[str], fields: str, purpose: Purpose) -> Answer[str]:
    """`sacct -n -P -X --duplicates -j IDS -o FIELDS`: accounting's `|`-separated lines about every
    life of the jobs (-X: the job itself, not its steps; --duplicates: every life of a requeued
    job, oldest first); "" unless Slurm answered."""
    command = [SACCT, "-n", "-P", "-X", "--duplicates", "-j", ",".join(job_ids), "-o", fields]
    done = _ask(command, purpose)
    return Answer(done, done.stdout if done.ok else "")


def associations(user: str, fields: str, purpose: Purpose) -> Answer[str]:
    """`sacctmgr -n -P show assoc where user=USER format=FIELDS`: the user's associations, one
    `|`-separated line each; "" unless Slurm answered."""
    done = _ask([SACCTMGR, "-n", "-P", "show", "assoc", "where", f"user={user}", f"format={fields}"], purpose)
    return Answer(done, done.stdout if done.ok else "")


def qos(name: str, fields: str, purpose: Purpose) -> Answer[str]:
    """`sacctmgr -n -P show qos where name=NAME format=FIELDS`: the QOS's `|`-separated line; ""
    unless Slurm answered."""
    done = _ask([SACCTMGR, "-n", "-P", "show", "qos", "where", f"name={name}", f"format={fields}"], purpose)
    return Answer(done, done.stdout if done.ok else "")
