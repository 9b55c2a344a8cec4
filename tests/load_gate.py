"""Hold a heavy test's start while the machine is overloaded.

The suite runs several workers (scripts/test.sh), and a Slurm test may run several jobs side by
side: on a 2-core machine the load average reached 36 in full runs, and a rank then took 65 s to
import torch (2.5 s alone) and 27 s to load a checkpoint. Work does not get done faster when more
of it runs at once on saturated cores, but every wall-clock limit in a test (a hang timeout, "the
step within 180 s", a subprocess timeout) is then met by a process that barely ran. So a test
marked `slurm` or `slow` waits to start until the one-minute load average is below a few
processes a core: the tests already running finish sooner, and the total is the same CPU work.
Heavy tests also start one at a time, at least STAGGER_S apart machine-wide (CALM_STAGGER_S while
the load is under one process a core; a lock file shared by every worker of both lanes): the
one-minute average lags, and at the start of a run every worker would otherwise begin its
heaviest module in the same second. The wait is capped, so a
machine that stays loaded only loses the gate, never the test; it is left out of the test's
measured seconds (tests/test_seconds.json).

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
POLL_S = 5.0
STAGGER_S = 20.0
# The spacing while the one-minute load is under one process a core: most heavy tests after the
# first half hour are short (a minute or less), and 20 s turns left the machine idle between them.
CALM_STAGGER_S = 5.0
GATE_FILE = Path(tempfile.gettempdir()) / "hpctrain-test-load-gate"
HEAVY_MARKERS = frozenset({"slurm", "slow"})


def max_load(cores: int, per_core: float) -> float:
    """The one-minute load average under which a heavy test may start (never below 2 runnable)."""
    return max(2.0, per_core * cores)


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
    load: Callable[[], float] = lambda: os.getloadavg()[0],
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
