"""Work on a sweep's points in forked processes, one share each, all at once.

Used where a sweep does the same thing to each of many points: checking and writing its run dir
(the Hydra launcher), and writing each point's records once its job is queued (submission.py).

Checking and writing a point costs about 2 ms of Python and a handful of file creations: 10,000
points took 25 s in one process. The points are independent once the sweep is composed, so a
login node's cores share them: each child is a fork of the submitting process (its Hydra
state, its sweep lock, its imports: nothing to start), works through its own slice in order and
hands back what it made through a temporary file. The parent keeps the order of the points.

A child that fails (a bad point: `fail` has printed what to change) still hands back the points
it made before, so the caller can remove every run dir of the sweep; its exit code is the
command's. A child never returns into the caller's code: it ends with os._exit, so nothing the
parent holds (its lock's descriptor, buffered output, atexit handlers) is touched twice.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Item = TypeVar("Item")
Made = TypeVar("Made")

# Below this many items a child costs more than it saves (a fork, composing the sweep's
# structure again: about 0.2 s).
MIN_PER_CHILD = 250


@dataclass
class Share:
    """How one child ended (0: all of its slice done) and what its work returned besides the
    items it made (its counters, its wishes; None when it failed)."""

    extra: Any
    exit_code: int


class ChildFailed(RuntimeError):
    """A child of `for_each` failed (it printed why on stderr)."""


def for_each(act: Callable[[Item], object], items: Sequence[Item]) -> None:
    """`act(item)` for every item: in forked children where the items are many (each a
    contiguous share, all at once), else here, in order. Raises ChildFailed once every child
    ended when one of them failed; `act`'s own exception when done here."""
    parts = children_for(len(items))
    if parts <= 1:
        for item in items:
            act(item)
        return

    def work(share: Sequence[Item], made: list[None]) -> None:
        for item in share:
            act(item)

    failed = [share.exit_code for share in in_children(work, items, parts, into=[]) if share.exit_code]
    if failed:
        raise ChildFailed(f"{len(failed)} of {parts} processes failed (exit {failed[0]}): see above")


def children_for(count: int, cores: int | None = None) -> int:
    """How many children `count` items are worth on this machine's cores (1: do them here)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    if threading.active_count() > 1:  # forking a process with threads can copy a held lock
        return 1
    return max(1, min(cores, count // MIN_PER_CHILD))


def slices(count: int, parts: int) -> list[range]:
    """0..count-1 in `parts` contiguous ranges as even as can be (the first ones one longer)."""
    size, longer = divmod(count, parts)
    ranges, start = [], 0
    for part in range(parts):
        end = start + size + (1 if part < longer else 0)
        ranges.append(range(start, end))
        start = end
    return [r for r in ranges if len(r)]


def in_children(
    work: Callable[[Sequence[Item], list[Made]], Any], items: Sequence[Item], parts: int, into: list[Made]
) -> list[Share]:
    """`work(slice, made)` for each of `parts` slices of `items`, each in a forked child, at the
    same time; `work` appends what it makes to `made` and returns an extra value. Every child's
    items are appended to `into` in the order of the slices, a failed child's too (what it made
    before it failed), and its Share says how it ended. Ctrl-C reaches the children too: every
    child is waited for and its items taken before KeyboardInterrupt goes on."""
    # Ctrl-C is held back from the first fork until every share is taken, and lands at the end:
    # one landing as a share is read (after its child was waited for) would leave that share and
    # every later one unread. A child takes it inside _child's handler, never in the caller's code.
    children: list[tuple[int, Any]] = []
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for share in slices(len(items), parts):
            if _ctrl_c_held():  # no more children; those started are waited for
                break
            sink = tempfile.TemporaryFile()  # noqa: SIM115 (closed once its child is waited for)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child(work, [items[i] for i in share], sink)
            children.append((pid, sink))
        shares = [_take_share(pid, sink, into) for pid, sink in children]
    finally:
        # A held Ctrl-C lands here: pthread_sigmask runs the handler at once (by default it
        # raises KeyboardInterrupt, out of this call, with `into` whole).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return shares


def _ctrl_c_held() -> bool:
    return signal.SIGINT in signal.sigpending()


def _take_share(pid: int, sink: Any, into: list[Made]) -> Share:
    """Wait for one child (Ctrl-C held back: the children have it too, and end handing back
    what they made) and append what it made to `into`."""
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    sink.seek(0)
    try:
        made, extra, said = pickle.load(sink)
    except (EOFError, pickle.UnpicklingError):  # killed before it could say (a signal, no memory)
        made, extra, said = [], None, code or 1
    finally:
        sink.close()
    into.extend(made)
    return Share(extra, said if said else (1 if code else 0))


def _child(work: Callable[[Sequence[Item], list[Made]], Any], items: Sequence[Item], sink: Any) -> None:
    made: list[Made] = []
    extra: Any = None
    code = 0
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        extra = work(items, made)
    except SystemExit as stop:  # `fail` said what is wrong
        code = stop.code if isinstance(stop.code, int) and stop.code else 1
    except KeyboardInterrupt:  # Ctrl-C: the parent says so
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        pickle.dump((made, extra, code), sink, protocol=pickle.HIGHEST_PROTOCOL)
        sink.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
