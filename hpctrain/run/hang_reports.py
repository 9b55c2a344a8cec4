"""RUN_DIR/hangs/<life>/rank-N.txt: what each rank was doing when its hang watchdog fired.

A hang ends the life (hpctrain.process.watchdog); what is left to tell a deadlock in the user's
code from a stuck node is each rank's report: where it stood (its steps this life, the phase it
was in), then every thread's Python stack. A rank that cannot write one (stopped, frozen, its
node gone) leaves no file, and that absence is the answer: the rank the others wait for. The
first rank to write waits a few seconds for its peers' reports, then names the ranks that wrote
none in its `failure` event (`not_reached`) with the folder (`report`).

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


def header(rank: int, node: str, idle_s: float, steps: int, phase: str) -> Iterable[str]:
    yield f"rank {rank} on {node}, pid {os.getpid()}"
    yield f"no training step finished for {idle_s:.0f} s; {steps} steps finished this life; in: {phase}"
    yield ""
