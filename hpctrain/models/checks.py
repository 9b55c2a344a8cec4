"""Checks of a model's constructor arguments, shared by the models: a bad value names itself."""

from __future__ import annotations


def check_int(name: str, value: object, low: int) -> None:
    # bool is an int subclass; `channels: [true]` in YAML is a typo, not a width of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} (got {value!r}) must be an integer >= {low}")


def check_prob(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} (got {value}) must be in [0, 1)")
