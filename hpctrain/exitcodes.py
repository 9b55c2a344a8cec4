"""Kept for imports written before hpctrain.run: every exit code lives in hpctrain.run.exitcodes."""

from hpctrain.run.exitcodes import (  # noqa: F401
    EXIT_HANG,
    EXIT_REQUEUE,
    EXIT_STOPPED,
    EXIT_USER_ERROR,
    FINISHED,
)
