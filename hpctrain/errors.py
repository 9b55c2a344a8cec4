"""Mistakes a user fixes by changing a value or a file, told in one message without a traceback.

The entry points (hpctrain-train, hpctrain-submit, every training process) print these as
`error: ...` and exit non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """A bad value or file: the message names what to change (a config key, a path)."""


class ArgumentError(UserError):
    """A `_target_` callable's argument is unusable (a dataset path that does not exist).

    Raised by a target itself, or by its `preflight` hook (see hpctrain.config.targets), which
    prefixes the node's key: `data.dataset.path: no file /data/train.bin`."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.message = message
