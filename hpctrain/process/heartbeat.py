"""Heartbeats: every training process of a Slurm step says, once a second, that its node still runs.

A node that dies silently (power, kernel panic, a hung NIC) ends no process and resets no socket:
its peers block in their collective, and Slurm marks it DOWN only after SlurmdTimeout (300 s by
default). The batch script's watcher (hpctrain.recovery.watch) hears these beats instead and ends
the step within `slurm.silent_node_timeout_s` of a node falling silent.

Each training process starts a beater: a small process of its own (`python -m
hpctrain.process.heartbeat`, standard library only), so the beats go on whatever the training
process does, however long it holds the GIL (a first step that compiles, a long checkpoint write,
an evaluation, imports on a slow filesystem). It sends a datagram (UDP: nothing to connect,
nothing left half-open when a node dies; the format is hpctrain.run.heartbeats, which the watcher
reads too) to the watcher's address every BEAT_S seconds, ignores the stop signals (the training
process saves for them, and a beater that died with SIGTERM would look like a dead node during
the save), and says `bye` and leaves once its training process has ended. The training process
says `bye` itself as it leaves too (Beating.bye): Slurm's step clean-up may kill the beater before
it sees its parent gone. So a rank that exits (a crash, the end, a stop) is never taken for a
silent node. A SIGSTOPped training process alone keeps its beater beating: its node is alive, and
its peers' hang watchdog reports it (hpctrain.process.watchdog). Only a node whose every process
stops (its beater too) or whose network is gone falls silent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpctrain.run.heartbeats import ADDR_ENV, BEAT_S, Beat, parse_addr

# How often the beater looks whether its training process has ended.
LOOK_S = 0.2
# The signals the beater leaves to its training process (srun and Slurm signal the whole task).
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


@dataclass
class Beating:
    """A training process's beater, and its own last word."""

    beater: subprocess.Popen[bytes]
    addr: str
    rank: int
    node: str
    step: str

    def bye(self) -> None:
        """Said by the training process itself as it leaves, before Slurm's step clean-up can kill
        its beater (slurmstepd SIGKILLs a task's remaining processes once the task has exited):
        a rank that leaves while its peers go on (a stop with no time to save, a crash that
        raised) is never taken for a dead node."""
        with contextlib.suppress(OSError, ValueError):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
                _send(out, parse_addr(self.addr), Beat(self.rank, self.node, self.step, os.getpid(), -1, bye=True))


# This process's beating (set by start): what `say_bye` says goodbye through.
_current: Beating | None = None


def say_bye() -> None:
    """This training process leaves now (the hang watchdog's os._exit skips every `finally`):
    its bye, if it beats at all."""
    if _current is not None:
        _current.bye()


def start(environ: Mapping[str, str], rank: int) -> Beating | None:
    """This training process's beater, when the batch script's watcher listens (ADDR_ENV set);
    None otherwise. Started before torch is imported: a node that dies during the imports is
    heard too."""
    addr = environ.get(ADDR_ENV, "")
    if not addr:
        return None
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    step = environ.get("SLURM_STEP_ID", "")
    command = [sys.executable, "-m", "hpctrain.process.heartbeat", addr, str(rank), node, step, str(os.getpid())]
    global _current
    _current = Beating(subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True), addr, rank, node, step)
    return _current


def beat(addr: str, rank: int, node: str, step: str, parent: int, clock: Callable[[], float] = time.monotonic) -> None:
    """Send a beat every BEAT_S seconds while `parent` (the training process) lives; then `bye`."""
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    host, port = parse_addr(addr)
    # The watcher's name is looked up once, not on every beat (a sendto to a name asks the
    # resolver each time: thousands of ranks a second against the site's DNS); again only after a
    # lookup or a send failed.
    target = _resolve(host, port)
    seq, next_beat = 0, clock()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        while os.getppid() == parent:
            if clock() >= next_beat:
                target = target or _resolve(host, port)
                if target is not None and not _send(out, target, Beat(rank, node, step, parent, seq)):
                    target = None
                seq, next_beat = seq + 1, next_beat + BEAT_S
                next_beat = max(next_beat, clock())  # after a pause (suspended), beat at once
            time.sleep(LOOK_S)
        target = target or _resolve(host, port)
        if target is not None:
            _send(out, target, Beat(rank, node, step, parent, seq, bye=True))


def _resolve(host: str, port: int) -> tuple[str, int] | None:
    """The watcher's IPv4 address (it listens on IPv4); None while the name does not resolve."""
    try:
        found = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    return (str(found[0][4][0]), port) if found else None


def _send(out: socket.socket, target: tuple[str, int], one: Beat) -> bool:
    try:
        out.sendto(one.encode(), target)
    except OSError:  # the network is down for a moment: beat again later
        return False
    return True


def main(argv: list[str]) -> int:
    addr, rank, node, step, parent = argv
    beat(addr, int(rank), node, step, int(parent))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
