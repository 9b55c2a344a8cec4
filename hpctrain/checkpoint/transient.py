"""Reads that fail for the filesystem's own reasons, not the file's: tried again, then raised.

EIO, ESTALE on NFS, a timeout on a parallel filesystem say nothing about a checkpoint: a moment
later the same read may succeed. The loaders (hpctrain.checkpoint.store, .sharded_load) try such
a read again (RETRY_DELAYS_S) and, still failing, raise the OSError it is, so the life fails as a
crash (requeued, its checkpoints untouched) instead of falling back to an older checkpoint or
refusing the run as a user's mistake.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Errors of the filesystem, not of the file: a moment later the same read may succeed.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.ESTALE,
        errno.EAGAIN,
        errno.EINTR,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        errno.ECONNRESET,
        errno.ENOLCK,
    }
)
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # 15.5 s in all before the error is raised


def transient(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


def with_retries(what: str, read: Callable[[], Any]) -> Any:
    """read(), tried again after each of RETRY_DELAYS_S while it fails with a transient OSError;
    the last such error raised. Any other error at once."""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return read()
        except OSError as error:
            if not transient(error) or delay is None:
                raise
            log.warning("reading %s: %s; trying again in %.1f s", what, error, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")
