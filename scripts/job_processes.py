"""The processes of Slurm jobs on this machine, read from /proc: which pid is rank R of job J.

The dev cluster's nodes are processes of one machine, so the tests and the chaos soak reach a
training task as the kernel or a dying node would (SIGKILL, SIGSTOP) by its pid. One reading of
/proc for all of them, with the two rules that make "rank R" one process:

- a task's own children (data-loader workers, a compile worker) inherit its environment, so
  SLURM_PROCID too: the task is the one whose parent is not itself a task of the job;
- after a relaunch on a spare the old step's tasks may still be ending: the task is the newest
  step's (the highest SLURM_STEP_ID);
- a relaunched task handed to its node's warm standby (hpctrain.process.handoff) is not the training
  process: the standby's fork that took it on is, named `hpctrain-rR` (hpctrain.process.standby). The
  standby's own step (HPCTRAIN_STANDBY_ROLE=server) is never a rank, nor are the batch script's
  other helper steps, one task a node with SLURM_PROCID 0, 1, ... and a newer step id than the
  training step's: the memory holders and the batch host's keeper (HELPERS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.protocol import KEEPER_MODULE


@dataclass(frozen=True)
class Process:
    pid: int
    parent: int
    program: str  # argv[0]'s file name ("srun", "python", ...)
    environ: dict[str, str]
    argv: tuple[str, ...] = ()
    name: str = ""  # /proc/PID/comm: what the process calls itself
    started: int = 0  # start time in clock ticks since boot


def processes(naming: str | None = None) -> list[Process]:
    """Every live (not zombie) process but this one; with `naming`, only those whose command
    line contains it (a run dir)."""
    found = []
    needle = naming.encode() if naming is not None else None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if needle is not None and needle not in b"\0".join(argv):
                continue
            # The fields after the command name, which may hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            state, parent, started = fields[0], fields[1], int(fields[19])
            if state == "Z":
                continue
            raw = (entry / "environ").read_bytes().split(b"\0")
            name = (entry / "comm").read_text().strip()
        except (OSError, IndexError, ValueError):  # ended meanwhile, or a kernel thread
            continue
        environ = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)
        words = tuple(a.decode(errors="replace") for a in argv if a)
        program = Path(argv[0].decode(errors="replace")).name
        found.append(Process(int(entry.name), int(parent), program, environ, words, name, started))
    return found


# The modules of the batch script's helper steps (srun --overlap beside the training step).
HELPERS = ("hpctrain.recovery.memory_holder", KEEPER_MODULE)


def is_task(process: Process) -> bool:
    """A process of a job step other than the batch step's, srun itself, a warm standby and the
    batch script's helpers."""
    step = process.environ.get("SLURM_STEP_ID")
    standby = process.environ.get("HPCTRAIN_STANDBY_ROLE") == "server"
    helper = any(module in process.argv for module in HELPERS)
    return step is not None and step != "batch" and process.program != "srun" and not standby and not helper


def is_handoff(process: Process) -> bool:
    return "hpctrain.process.handoff" in process.argv


def standby_worker(job_id: str, rank: int, among: list[Process]) -> list[int]:
    """The newest fork of a warm standby of job `job_id` that took on rank `rank` (its own forks,
    data-loader workers, inherit its name: the one whose parent is not such a fork)."""
    named = [
        p
        for p in among
        if p.environ.get("HPCTRAIN_STANDBY_ROLE") == "server"
        and p.environ.get("SLURM_JOB_ID") == job_id
        and p.name == f"hpctrain-r{rank}"
    ]
    pids = {p.pid for p in named}
    forks = [p for p in named if p.parent not in pids]
    return [max(forks, key=lambda p: p.started).pid] if forks else []


def rank_pids(job_id: str, rank: int, among: list[Process] | None = None) -> list[int]:
    """The training task of `rank` in job `job_id`: one pid normally, none when it has ended,
    more only if the rules above do not hold."""
    everyone = processes() if among is None else among
    of_job = [
        p
        for p in everyone
        if is_task(p) and p.environ.get("SLURM_JOB_ID") == job_id and p.environ.get("SLURM_PROCID") == str(rank)
    ]
    in_job = {p.pid for p in of_job}
    tasks = [p for p in of_job if p.parent not in in_job]
    # Step ids start again at 0 in each life of a requeued job: the life (SLURM_RESTART_COUNT)
    # first, so an earlier life's task still ending (its relaunch's step 3) is never taken for
    # the new life's step 0.
    newest = max(map(_launch, tasks), default=None)
    latest = [p for p in tasks if _launch(p) == newest]
    if any(is_handoff(p) for p in latest):
        return standby_worker(job_id, rank, everyone)
    return [p.pid for p in latest]


def _launch(process: Process) -> tuple[int, int]:
    restart = process.environ.get("SLURM_RESTART_COUNT", "0")
    return (int(restart) if restart.isdigit() else 0, int(process.environ["SLURM_STEP_ID"]))


def rank_pid(job_id: str, rank: int) -> int | None:
    """rank_pids' one pid, or None while there is none (a step not launched yet, or ended)."""
    pids = rank_pids(job_id, rank)
    if len(pids) > 1:
        raise RuntimeError(f"rank {rank} of job {job_id} is several processes: {pids}")
    return pids[0] if pids else None
