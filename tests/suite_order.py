"""The order in which the suite's modules are handed to pytest-xdist workers: longest first.

scripts/test.sh runs the suite on several workers with `--dist loadfile --no-loadscope-reorder`:
each test module is one unit of work (its module fixtures, such as a set of training runs, are
built once), and units go to the next idle worker in collection order. Handing out the longest
modules first keeps a long one from starting last and running alone at the end, while the many
short modules fill in beside it. A module takes the sum of its selected tests' times, so a run of
a subset (`-m "not slurm"`) is ordered by what it runs: each test's time comes from
tests/test_seconds.json (measured by a run with HPCTRAIN_TEST_STORE_SECONDS=1), and a test not
measured yet is guessed from its markers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

SECONDS_FILE = Path(__file__).with_name("test_seconds.json")
# A guess for a test never measured: a Slurm test waits on the cluster for a minute or
# so, a `slow` one trains for a while, the rest take well under a second.
GUESS_S = {"slurm": 60.0, "slow": 20.0}
OTHER_GUESS_S = 0.5


class Item(Protocol):
    """What the ordering needs of a pytest item."""

    @property
    def nodeid(self) -> str: ...

    def iter_markers(self) -> Iterable[object]: ...


def module_of(nodeid: str) -> str:
    """The unit of work under `--dist loadfile`: the file part of the node id."""
    return nodeid.split("::", 1)[0]


def guess_seconds(marker_names: Iterable[str]) -> float:
    names = set(marker_names)
    return max((seconds for name, seconds in GUESS_S.items() if name in names), default=OTHER_GUESS_S)


def longest_first(items: Sequence[Item], measured: Mapping[str, float]) -> list[Item]:
    """The items with whole modules ordered by the time of their items, longest first (each test
    measured, else guessed); a module's own tests keep their order, and equal modules their
    collection order."""
    seconds: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        module = module_of(item.nodeid)
        first_seen.setdefault(module, index)
        names = (getattr(mark, "name", "") for mark in item.iter_markers())
        taken = measured[item.nodeid] if item.nodeid in measured else guess_seconds(names)
        seconds[module] = seconds.get(module, 0.0) + taken
    rank = {module: (-seconds[module], first_seen[module]) for module in seconds}
    order = sorted(range(len(items)), key=lambda i: (rank[module_of(items[i].nodeid)], i))
    return [items[i] for i in order]


# The modules that spend most of their time waiting on Slurm's own clocks (SlurmdTimeout 300 s,
# MinJobAge, time limits, a slurmctld stopped for 30 s, requeue holds) or on signals, using a
# half a core or less while they wait (measured: busy CPU over wall time). scripts/test.sh
# runs them in a lane of their own beside the others, so their waiting overlaps the others' work
# instead of holding a worker the CPU-bound modules could use.
WAITING_LANE = frozenset(
    {
        "tests/test_accounting.py",
        "tests/test_heartbeat.py",
        "tests/test_slurm_node_lost_before_launch.py",
        "tests/test_slurm_full_disk.py",
        "tests/test_slurm_time_limit.py",
        "tests/test_goodput.py",
        "tests/test_slurm_silent_node.py",
        "tests/test_exact_resume.py",
        "tests/test_slurm_keeper.py",
        "tests/test_slurm_outage.py",
        "tests/test_submitit_launcher.py",  # ~2 min waiting for Slurm's time-limit warning
        "tests/test_slurm_recovery_more.py",  # 39 CPU-s in 99 s alone: waits for its requeues
    }
)
LANES = ("main", "waiting")


def lane_of(nodeid: str) -> str:
    return "waiting" if module_of(nodeid) in WAITING_LANE else "main"


def read_measured(path: Path = SECONDS_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def store_measured(measured: Mapping[str, float], path: Path = SECONDS_FILE) -> None:
    """Merge a run's test times into the file: tests this run ran are replaced, others kept.
    Under a lock: the two lanes of scripts/test.sh may merge theirs at the same moment."""
    import fcntl

    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {**read_measured(path), **{nodeid: round(s, 2) for nodeid, s in measured.items()}}
        path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
