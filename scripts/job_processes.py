"""The processes of Slurm jobs on this machine, read from /proc: which pid is rank R of job J.

The dev cluster's nodes are processes of one machine, so the tests and the chaos soak reach a
training task as the kernel or a dying node would (SIGKILL, SIGSTOP) by its pid. One reading of
/proc for all of them, with the two rules that make "rank R" one process:

- a task's own children (data-loader workers, a compile worker) inherit its environment, so
  SLURM_PROCID too: the task is the one whose parent is not itself a task of the job;
- after a relaunch on a spare the old step's tasks may still be ending: the task is the newest
  step's (the highest SLURM_STEP_ID).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Process:
    pid: int
    parent: int
    program: str  # argv[0]'s file name ("srun", "python", ...)
    environ: dict[str, str]


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
            state, parent = (entry / "stat").read_text().rsplit(") ", 1)[1].split()[:2]
            if state == "Z":
                continue
            raw = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):  # ended meanwhile, or a kernel thread
            continue
        environ = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)
        found.append(Process(int(entry.name), int(parent), Path(argv[0].decode(errors="replace")).name, environ))
    return found


def is_task(process: Process) -> bool:
    """A process of a job step other than the batch step's and srun itself."""
    step = process.environ.get("SLURM_STEP_ID")
    return step is not None and step != "batch" and process.program != "srun"


def rank_pids(job_id: str, rank: int, among: list[Process] | None = None) -> list[int]:
    """The training task of `rank` in job `job_id`: one pid normally, none when it has ended,
    more only if the rules above do not hold."""
    of_job = [
        p
        for p in (processes() if among is None else among)
        if is_task(p) and p.environ.get("SLURM_JOB_ID") == job_id and p.environ.get("SLURM_PROCID") == str(rank)
    ]
    pids = {p.pid for p in of_job}
    tasks = [p for p in of_job if p.parent not in pids]
    newest = max((int(p.environ["SLURM_STEP_ID"]) for p in tasks), default=None)
    return [p.pid for p in tasks if int(p.environ["SLURM_STEP_ID"]) == newest]


def rank_pid(job_id: str, rank: int) -> int | None:
    """rank_pids' one pid, or None while there is none (a step not launched yet, or ended)."""
    pids = rank_pids(job_id, rank)
    if len(pids) > 1:
        raise RuntimeError(f"rank {rank} of job {job_id} is several processes: {pids}")
    return pids[0] if pids else None
