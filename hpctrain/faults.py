"""Fault points: named moments in hpctrain's code where a test makes a process die, stop or wait.

A fault that matters lands at the worst moment (between a checkpoint's two renames, during the
import of torch, inside the requeue), and a test can only prove recovery from it if it can put
the fault exactly there. `point("checkpoint.between_renames")` marks such a moment; the
environment variable HPCTRAIN_FAULT_POINTS arms it:

    HPCTRAIN_FAULT_POINTS="checkpoint.between_renames=kill"
    HPCTRAIN_FAULT_POINTS="worker.after_imports=sleep:30,trainer.step=stop"

    kill        SIGKILL this process: nothing after it runs (no handler, no `finally`)
    stop        SIGSTOP this process: it stops answering without exiting (a silent node)
    term        SIGTERM this process (a signal at exactly this moment)
    signal:NAME that signal to this process (signal:USR2: the time-limit warning)
    sleep:S     wait S seconds, then go on
    exit:N      leave at once with exit code N (os._exit: no cleanup)

A point fires once per process, the first time it is reached, unless its action ends in `@K`
(`kill@3`: the third time). Unarmed (the variable unset, as in every normal run) a point is one
dictionary lookup. The points are listed in POINTS; arming an unknown name is refused, so a
test cannot arm a point that no longer exists and pass without its fault.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "HPCTRAIN_FAULT_POINTS"

# Every point in the code, and the moment it marks.
POINTS = {
    "worker.before_imports": "`python -m hpctrain.worker` started, torch not imported yet",
    "worker.after_imports": "torch and the trainer imported, the config not read yet",
    "worker.before_rendezvous": "the stop handlers installed, the process group not joined yet",
    "checkpoint.between_renames": "a checkpoint's .pt renamed into place, its .json not yet",
}


@dataclass(frozen=True)
class Armed:
    action: str  # kill, stop, term, signal, sleep, exit
    value: float = 0.0  # sleep's seconds, exit's code, signal's number
    on_hit: int = 1  # fire the K-th time the point is reached


def parse(text: str) -> dict[str, Armed]:
    """`name=action[:value][@K],...`; ValueError naming what is wrong."""
    armed: dict[str, Armed] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, spec = item.partition("=")
        if not sep or name not in POINTS:
            known = ", ".join(sorted(POINTS))
            raise ValueError(f"{ENV}: {item!r} is not NAME=ACTION with a known point ({known})")
        spec, _, hit = spec.partition("@")
        action, _, value = spec.partition(":")
        valued = ("sleep", "exit", "signal")
        if action not in ("kill", "stop", "term", *valued) or (action in valued) != bool(value):
            raise ValueError(
                f"{ENV}: {item!r}: the action is kill, stop, term, signal:NAME, sleep:SECONDS or exit:CODE"
            )
        if action == "signal":
            number = getattr(signal, f"SIG{value}", None)
            if not isinstance(number, signal.Signals):
                raise ValueError(f"{ENV}: {item!r}: {value!r} is not a signal name (TERM, USR2, ...)")
            value = str(int(number))
        try:
            armed[name] = Armed(action, float(value or 0), int(hit or 1))
        except ValueError:
            raise ValueError(f"{ENV}: {item!r}: SECONDS, CODE and @K are numbers") from None
    return armed


def _from_env(environ: Mapping[str, str]) -> dict[str, Armed]:
    text = environ.get(ENV, "")
    return parse(text) if text else {}


_armed = _from_env(os.environ)
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """The moment `name` (one of POINTS): act if armed, else nothing."""
    armed = _armed.get(name)
    if armed is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != armed.on_hit:
        return
    if armed.action == "sleep":
        time.sleep(armed.value)
    elif armed.action == "exit":
        os._exit(int(armed.value))
    else:
        named = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
        os.kill(os.getpid(), named.get(armed.action) or int(armed.value))
