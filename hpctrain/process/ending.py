"""How a process that trained as a rank leaves once its work is done and written.

torch's C++ side keeps threads of its own (gloo's, the store's). At interpreter teardown the
order in which Python and C++ objects go is not fixed: now and then one of those threads is
destroyed still running, and the process aborts ("terminate called without an active
exception", SIGABRT) after it finished and wrote everything: a finished run reported as a
crash (seen under torchrun on a loaded node). Processes the local launcher spawns never tear
down (multiprocessing ends them with os._exit); a rank started any other way (srun, torchrun,
the batch script's `python -m hpctrain.worker`) leaves the same way, once its logs are out.

Light on purpose: the entry points import it before torch.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

_trained_here = False


def trained_here() -> None:
    """Called once this process joined a process group: from now on it leaves by `leave`."""
    global _trained_here
    _trained_here = True


def did_train_here() -> bool:
    return _trained_here


def code_of(exit: SystemExit) -> int:
    """The exit status sys.exit(...) would give: None is 0, a message is printed and is 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def leave(code: int) -> NoReturn:
    """End the process with `code` without the interpreter's teardown, its output flushed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said anyway
            pass
    os._exit(code)
