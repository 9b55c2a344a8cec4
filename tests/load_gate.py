"""Hold a heavy test's start while the machine is overloaded.

The suite runs several workers (scripts/test.sh), and a Slurm test may run several jobs side by
side: on a 2-core machine the load average reached 36 in full runs, and a rank then took 65 s to
import torch (2.5 s alone) and 27 s to load a checkpoint. Work does not get done faster when more
of it runs at once on saturated cores, but every wall-clock limit in a test (a hang timeout, "the
step within 180 s", a subprocess timeout) is then met by a process that barely ran. So a test
marked `slurm` or `slow` waits to start until the machine runs fewer than a few processes a core.

The load is read as it is now: the processes running or ready to run (the kernel's count in
/proc/loadavg), averaged over SAMPLE_S. The one-minute load average lags by about a minute, both
ways: it let every worker start its heaviest module in the same second at the start of a run, and
then kept the gate closed for a minute after the load had gone. Spacing the starts against that
lag (20 s apart) made them the suite's limit: 180 heavy tests at 20 s turns are an hour, the
suite took 47 minutes, and its heavy tests waited 4,000 s in all for their turns.
Heavy tests still start one at a time, STAGGER_S apart machine-wide (CALM_STAGGER_S while the load
is under one process a core; a lock file shared by every worker of both lanes): a test's
processes take a few seconds to show in the count. The wait is capped, so a machine that stays
loaded only loses the gate, never the test; it is left out of the test's measured seconds
(tests/test_seconds.json).

HPCTRAIN_TEST_MAX_LOAD_PER_CORE sets the bar (default 3; 0 turns the gate off).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MAX_LOAD_PER_CORE = 3.0
MAX_WAIT_S = 600.0
POLL_S = 3.0
# Long enough for a started test's processes (sbatch, srun, ranks importing torch) to be counted.
STAGGER_S = 6.0
# The spacing while the load is under one process a core: the machine has room for the next now.
CALM_STAGGER_S = 3.0
# The load is the mean count of runnable processes over this many seconds, sampled every SAMPLE_EVERY_S.
SAMPLE_S = 2.0
SAMPLE_EVERY_S = 0.2
LOADAVG = Path("/proc/loadavg")
GATE_FILE = Path(tempfile.gettempdir()) / "hpctrain-test-load-gate"
HEAVY_MARKERS = frozenset({"slurm", "slow"})


def max_load(cores: int, per_core: float) -> float:
    """The one-minute load average under which a heavy test may start (never below 2 runnable)."""
    return max(2.0, per_core * cores)


def runnable(loadavg: str) -> int:
    """The processes running or ready to run, from /proc/loadavg's fourth field ("3/412"), less the
    one reading it."""
    return max(0, int(loadavg.split()[3].split("/")[0]) - 1)


def load_now(
    read: Callable[[], str] = LOADAVG.read_text,
    sleep: Callable[[float], None] = time.sleep,
    sample_s: float = SAMPLE_S,
    every_s: float = SAMPLE_EVERY_S,
    fallback: Callable[[], float] = lambda: os.getloadavg()[0],
) -> float:
    """The machine's load as it is now: the runnable count's mean over `sample_s` (one sample alone
    swings between none and a dozen as processes wait on each other). Without /proc/loadavg (not
    Linux), the one-minute average."""
    try:
        samples = [runnable(read())]
        for _ in range(max(0, round(sample_s / every_s) - 1)):
            sleep(every_s)
            samples.append(runnable(read()))
    except (OSError, IndexError, ValueError):
        return fallback()
    return sum(samples) / len(samples)


def per_core_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    raw = environ.get("HPCTRAIN_TEST_MAX_LOAD_PER_CORE", "")
    if not raw:
        return MAX_LOAD_PER_CORE
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"HPCTRAIN_TEST_MAX_LOAD_PER_CORE={raw!r}: processes a core (0: no gate)") from None
    if value < 0:
        raise ValueError(f"HPCTRAIN_TEST_MAX_LOAD_PER_CORE={raw!r}: 0 or more")
    return value


def take_turn(
    bar: float,
    gate: Path = GATE_FILE,
    load: Callable[[], float] = load_now,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    stagger_s: float = STAGGER_S,
    max_wait_s: float = MAX_WAIT_S,
    poll_s: float = POLL_S,
    calm_load: float | None = None,
    calm_stagger_s: float = CALM_STAGGER_S,
) -> float:
    """This worker's turn to start a heavy test: the gate's lock held (one worker at a time), then
    wait until `stagger_s` after the last heavy start (`calm_stagger_s` while the load is under
    `calm_load`: an idle machine need not space its starts as widely) and the load under the bar,
    at most max_wait_s from the call (time blocked on the lock included); the start is written
    for the next. The seconds waited."""
    start = clock()
    with open(gate, "a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            while clock() - start < max_wait_s:
                file.seek(0)
                try:
                    last = float(file.read().strip() or 0.0)
                except ValueError:
                    last = 0.0
                now_load = load()
                spacing = calm_stagger_s if calm_load is not None and now_load < calm_load else stagger_s
                since = clock() - last
                if since >= spacing and now_load < bar:
                    break
                sleep(min(poll_s, spacing - since) if since < spacing else poll_s)
            file.seek(0)
            file.truncate()
            file.write(f"{clock()}\n")
            file.flush()
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
    return clock() - start
