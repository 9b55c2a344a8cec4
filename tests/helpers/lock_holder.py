"""A live command holding a run dir's lock (hpctrain.run.lock), for the tests that need one:
`with holding(run_dir) as holder:` runs a process that took the lock and said so, killed after."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HOLD = (
    "import sys, time; from pathlib import Path; from hpctrain.run import lock; from hpctrain.run.paths import RunDir;"
    "r = RunDir(Path(sys.argv[1]))\n"
    "if sys.argv[2] == 'sweep': lock.hold_sweep(r.root)\n"
    "else: lock.hold(r); lock.announce(r)\n"
    "print('held', flush=True); time.sleep(600)"
)


@contextmanager
def holding(run_dir: Path, sweep: bool = False) -> Iterator[subprocess.Popen[str]]:
    """`sweep`: the lock a sweep's submission holds on its sweep dir (lock.hold_sweep)."""
    what = "sweep" if sweep else "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir), what], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()
