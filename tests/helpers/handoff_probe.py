"""A stand-in worker for tests/test_standby.py: `python -m helpers.handoff_probe ACTION [ARG]`.

It reports what it was given (pid, working directory, environment, CPU affinity, argv, name) as
one JSON line on stdout and a marker on stderr, then: `exit N` exits N; `wait` waits for SIGTERM
and exits 75 when it comes (as a worker that saved); `sleep` sleeps until killed."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    action = sys.argv[1]
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    report = {
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "cpus": sorted(os.sched_getaffinity(0)),
        "argv": sys.argv[1:],
        "comm": Path("/proc/self/comm").read_text().strip(),
        "umask": os.umask(0o022),
        "torch_imported": "torch" in sys.modules,
    }
    print(json.dumps(report), flush=True)
    print("probe on stderr", file=sys.stderr, flush=True)
    if action == "exit":
        sys.exit(int(sys.argv[2]))
    if action == "wait":
        while not got:
            time.sleep(0.01)
        print("probe got SIGTERM", flush=True)
        sys.exit(75)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
