"""The programs a run dir names to be told when its run has ended.

A tool built on hpctrain follows a run's end without the in-job programs knowing it: whoever makes
the run dir writes `listeners.json` (RunDir.listeners), a list of

    {"module": "hpctrain.tune.report", "timeout_s": 1200}

and once the run has ended, its control step (or its guardian) runs each, one after the other, as

    python -m MODULE RUN_DIR ACTION

with the job's own Python and environment; ACTION is how it ended (`finish`, `fail`, `stop`).
hpctrain-tune's trials name hpctrain.tune.report (tell the study, submit the next trials).

Nothing here may break the job's own ending: a listener that cannot start, fails, or runs past
its `timeout_s` (it is killed then), and a listeners.json that cannot be read, are each said on
stderr and the job ends as decided. A listener's stdout goes to stderr too: the control step's
stdout is the action line the batch shell reads. A run dir without listeners.json costs one
stat(). Standard library only: the control step answers in a moment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from hpctrain.run.paths import RunDir

# A dotted module name: it is run with `python -m`, never through a shell.
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Listener:
    module: str  # run as `python -m MODULE RUN_DIR ACTION`
    timeout_s: float  # killed after this long: the job's end waits no longer for it

    def __post_init__(self) -> None:
        if not isinstance(self.module, str) or not _MODULE.fullmatch(self.module):
            raise ValueError(f"a listener's module must be a dotted module name (got {self.module!r})")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(
                f"listener {self.module}: timeout_s must be a number of seconds > 0 (got {self.timeout_s!r})"
            )


def write_listeners(run: RunDir, listeners: Sequence[Listener]) -> None:
    """listeners.json, written by whoever makes the run dir (before its job is queued)."""
    run.listeners.write_text(json.dumps([asdict(listener) for listener in listeners], indent=2) + "\n")


def read_listeners(run: RunDir) -> list[Listener]:
    """The run dir's listeners, in order; [] without listeners.json. ValueError (or OSError) for
    a file that is not a list of listeners."""
    try:
        text = run.listeners.read_text()
    except FileNotFoundError:
        return []
    records = json.loads(text)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{run.listeners} is not a list of {{module, timeout_s}}")
    return [Listener(**record) for record in records]


def tell_listeners(run: RunDir, action: str) -> None:
    """The run has ended with `action`: run its listeners. Never raises (see the module's note)."""
    try:
        listeners = read_listeners(run)
    except (OSError, ValueError, TypeError) as error:
        print(f"hpctrain: the run's listeners ({run.listeners}) cannot be read: {error}", file=sys.stderr, flush=True)
        return
    for listener in listeners:
        _tell(listener, run, action)


def _tell(listener: Listener, run: RunDir, action: str) -> None:
    command = [sys.executable, "-m", listener.module, str(run.root), action]
    said = f"hpctrain: the run's listener {listener.module}"
    sys.stderr.flush()  # this process's own lines first, then the listener's
    try:
        # stdout=2: this process's stderr, whatever object sys.stderr is now.
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=2, timeout=listener.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        print(f"{said} did not end within {listener.timeout_s:g} s: killed", file=sys.stderr, flush=True)
    except Exception as error:  # cannot start (OSError), or anything else: the job still ends as decided
        print(f"{said} could not be run: {error!r}", file=sys.stderr, flush=True)
    else:
        if done.returncode != 0:
            print(f"{said} exited {done.returncode}", file=sys.stderr, flush=True)
