"""RUN_DIR/hangs/<life>/rank-N.txt: what each rank was doing when its hang watchdog fired.

A hang ends the life (hpctrain.process.watchdog); what is left to tell a deadlock in the user's
code from a stuck node is each rank's report: where it stood (its steps this life, the phase it
was in), then every thread's Python stack. A rank that cannot write one (stopped, frozen, its
node gone) leaves no file, and that absence is the answer: the rank the others wait for. The
first rank to write waits a few seconds for its peers' reports, then names the ranks that wrote
none in its `failure` event (`not_reached`) with the folder (`report`).

The batch script's watcher asks for the same reports before it ends a step whose node fell silent
(hpctrain.run.heartbeats.StacksAsked): each live rank's beater has its training process dump
its stacks and writes them here (`write_asked`); the silent node's ranks write none.

<life> is `<job id>.<restart>` in a Slurm job, `local.<parent pid>` for hpctrain-train's own ranks
(they share the process that forked them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from hpctrain.run.life import LifeStamp

FOLDER = "hangs"
# The line of a report that gives the newest collective its rank entered (torch's Flight Recorder,
# hpctrain.dist.collective_records): a rank below its peers' is the one they wait for.
NEWEST_WORDS = "newest collective seq:"
# How long the first rank's report waits for its peers' before naming the missing ones: a live
# rank's watchdog fires within a second or two of the others' (the same timeouts, the same step).
PEERS_WAIT_S = 5.0


def life_label(life: LifeStamp) -> str:
    return f"{life.job_id}.{life.restart}" if life.job_id else f"local.{os.getppid()}"


def folder_of(run_root: Path, life: LifeStamp) -> Path:
    return run_root / FOLDER / life_label(life)


def report_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.txt"


def reported(folder: Path) -> set[int]:
    """The ranks whose reports are whole in `folder` (a report is written whole, then renamed)."""
    found = set()
    for path in folder.glob("rank-*.txt") if folder.is_dir() else ():
        number = path.stem.removeprefix("rank-")
        if number.isdigit():
            found.add(int(number))
    return found


def missing(folder: Path, world_size: int, wait_s: float = PEERS_WAIT_S) -> list[int]:
    """The ranks with no report once `wait_s` passed (sooner when every rank wrote one)."""
    deadline = time.monotonic() + wait_s
    while True:
        absent = sorted(set(range(world_size)) - reported(folder))
        if not absent or time.monotonic() >= deadline:
            return absent
        time.sleep(0.2)


def behind(folder: Path) -> list[int]:
    """The ranks whose report gives a newest collective below the others' newest: the ones that
    did not reach the collective their peers wait in (reports without the line say nothing)."""
    newest: dict[int, int] = {}
    for rank in reported(folder):
        try:
            text = report_path(folder, rank).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(NEWEST_WORDS) and line.removeprefix(NEWEST_WORDS).strip().isdigit():
                newest[rank] = int(line.removeprefix(NEWEST_WORDS))
                break
    if not newest:
        return []
    top = max(newest.values())
    return sorted(rank for rank, seq in newest.items() if seq < top)


def header(rank: int, node: str, idle_s: float, steps: int, phase: str) -> Iterable[str]:
    yield f"rank {rank} on {node}, pid {os.getpid()}"
    yield f"no training step finished for {idle_s:.0f} s; {steps} steps finished this life; in: {phase}"
    yield ""


def write_asked(folder: Path, rank: int, node: str, pid: int, why: str, stacks: str, collectives: str = "") -> None:
    """A report the watcher asked for, written whole (a temporary file renamed): the collectives
    the training process recorded, and `stacks` as it dumped them, or, when it dumped nothing,
    why there are none."""
    folder.mkdir(parents=True, exist_ok=True)
    path = report_path(folder, rank)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    said = (
        stacks
        if stacks.strip()
        else "no stacks: the process did not dump them in time (stopped, or stuck in the kernel)\n"
    )
    tmp.write_text(
        f"rank {rank} on {node}, pid {pid}\nasked by the batch script's watcher: {why}\n\n{collectives}{said}"
    )
    tmp.replace(path)
