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

Before the watcher ends a step for a silent node, it asks each live rank's beater for the rank's
stacks (hpctrain.run.heartbeats.StacksAsked): the beater sends its training process STACKS_SIGNAL,
on which faulthandler (registered by `start`) dumps every thread's stack into a file of this
node's own, and writes them as the rank's hang report (hpctrain.run.hang_reports.write_asked).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hpctrain.run import hang_reports
from hpctrain.run.heartbeats import ADDR_ENV, BEAT_S, STACKS_SIGNAL_NAME, Beat, StacksAsked, parse_addr

# How often the beater looks whether its training process has ended.
LOOK_S = 0.2
# The signals the beater leaves to its training process (srun and Slurm signal the whole task).
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
STACKS_SIGNAL = getattr(signal, STACKS_SIGNAL_NAME)
# How long the beater waits for its training process's dump: faulthandler writes from the signal
# handler at once, the watchdog thread answers within its tick (a second); a process that wrote
# nothing by then is stopped or stuck in the kernel.
STACKS_WAIT_S = 1.5


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
    stacks = _dump_stacks_on_signal(environ)
    command = [
        sys.executable,
        "-m",
        "hpctrain.process.heartbeat",
        addr,
        str(rank),
        node,
        step,
        str(os.getpid()),
        stacks,
    ]
    global _current
    _current = Beating(subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True), addr, rank, node, step)
    return _current


@dataclass(frozen=True)
class StackFiles:
    """A training process's files on its own node for the watcher's asks: faulthandler dumps its
    stacks into `stacks` on STACKS_SIGNAL; the beater creates `asked`, and the process's watchdog
    thread answers it with its recorded collectives in `collectives` (hpctrain.process.watchdog)."""

    stacks: str
    asked: str
    collectives: str

    @classmethod
    def of(cls, pid: int, environ: Mapping[str, str]) -> StackFiles:
        return cls.beside(os.path.join(environ.get("TMPDIR") or "/tmp", f"hpctrain-stacks.{pid}.txt"))

    @classmethod
    def beside(cls, stacks: str) -> StackFiles:
        """The files that go with a stacks file (the beater is given its path alone)."""
        base = stacks.removesuffix(".txt")
        return cls(stacks, f"{base}.asked", f"{base}.collectives")


def _dump_stacks_on_signal(environ: Mapping[str, str]) -> str:
    """This process dumps every thread's stack into a file of this node's own on STACKS_SIGNAL
    (faulthandler: from C, so it answers while the main thread waits in a collective); the
    file's path, "" where none could be opened (then no stacks are given)."""
    global _stacks_file, stack_files
    files = StackFiles.of(os.getpid(), environ)
    try:
        _stacks_file = open(files.stacks, "w")  # noqa: SIM115 (held open for faulthandler as long as the process lives)
        faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return ""
    stack_files = files
    return files.stacks


_stacks_file: TextIO | None = None
# This training process's files, once `start` registered the dump (None: no beater, no asks).
stack_files: StackFiles | None = None


def beat(
    addr: str,
    rank: int,
    node: str,
    step: str,
    parent: int,
    clock: Callable[[], float] = time.monotonic,
    stacks: str = "",
) -> None:
    """Send a beat every BEAT_S seconds while `parent` (the training process) lives; then `bye`.
    Between beats, answer the watcher's StacksAsked with the parent's stacks (`stacks`: the file
    faulthandler dumps them in)."""
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    host, port = parse_addr(addr)
    # The watcher's name is looked up once, not on every beat (a sendto to a name asks the
    # resolver each time: thousands of ranks a second against the site's DNS); again only after a
    # lookup or a send failed.
    target = _resolve(host, port)
    seq, next_beat = 0, clock()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        out.bind(("0.0.0.0", 0))  # the watcher answers to the port the beats come from
        out.settimeout(LOOK_S)
        while os.getppid() == parent:
            if clock() >= next_beat:
                target = target or _resolve(host, port)
                if target is not None and not _send(out, target, Beat(rank, node, step, parent, seq)):
                    target = None
                seq, next_beat = seq + 1, next_beat + BEAT_S
                next_beat = max(next_beat, clock())  # after a pause (suspended), beat at once
            asked = _listen(out)
            if asked is not None:
                _give_stacks(asked, parent, stacks, rank, node)
        target = target or _resolve(host, port)
        if target is not None:
            _send(out, target, Beat(rank, node, step, parent, seq, bye=True))


def _listen(out: socket.socket) -> StacksAsked | None:
    """What the watcher asked within LOOK_S, if anything."""
    try:
        data, _ = out.recvfrom(4096)
    except (TimeoutError, OSError):
        return None
    return StacksAsked.decode(data)


def _give_stacks(asked: StacksAsked, parent: int, stacks: str, rank: int, node: str) -> None:
    """The parent's stacks and collectives as its hang report: asked (the stacks by signal, the
    collectives by a file its watchdog thread answers), given STACKS_WAIT_S, written."""
    dumped, collectives = "", ""
    if stacks:
        files = StackFiles.beside(stacks)
        try:
            before = os.path.getsize(stacks)
            with contextlib.suppress(OSError):
                os.unlink(files.collectives)
            Path(files.asked).touch()
            os.kill(parent, STACKS_SIGNAL)
            deadline, size = time.monotonic() + STACKS_WAIT_S, before
            while time.monotonic() < deadline:
                time.sleep(0.1)
                now = os.path.getsize(stacks)
                # The dump grown and no longer growing, and the collectives answered: all there is.
                if now > before and now == size and os.path.exists(files.collectives):
                    break
                size = now
            with open(stacks) as dump:
                dump.seek(before)
                dumped = dump.read()
            with contextlib.suppress(OSError):
                collectives = Path(files.collectives).read_text()
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.unlink(files.asked)
    with contextlib.suppress(OSError):
        hang_reports.write_asked(Path(asked.folder), rank, node, parent, asked.why, dumped, collectives)


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
    addr, rank, node, step, parent, *rest = argv
    stacks = rest[0] if rest else ""
    try:
        beat(addr, int(rank), node, step, int(parent), stacks=stacks)
    finally:
        if stacks:  # the training process has ended: its files with it
            files = StackFiles.beside(stacks)
            for path in (files.stacks, files.asked, files.collectives):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
