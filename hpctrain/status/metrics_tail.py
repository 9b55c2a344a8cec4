"""The latest numbers of a run, read from the end of its metrics.jsonl.

A long run's metrics.jsonl grows by a line every trainer.log_every steps; reading it whole for
every run on every refresh would make a status of 100 runs slow. The newest line is at the end,
so it is read backwards in blocks, and only as far as the last evaluation (with a cap: a run
that evaluates rarely shows no eval accuracy rather than a slow table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

BLOCK_BYTES = 64 * 1024
# How far back to look for the last evaluation: thousands of lines at the usual line length.
MAX_BYTES_BACK = 2 * 1024 * 1024


@dataclass(frozen=True)
class MetricsTail:
    step: int | None = None
    loss: float | None = None  # nan when it was not finite (hpctrain.run.jsonlines writes null)
    samples_per_s: float | None = None
    eval_accuracy: float | None = None
    eval_loss: float | None = None
    eval_step: int | None = None


def read_tail(path: Path, max_bytes_back: int = MAX_BYTES_BACK) -> MetricsTail:
    latest: dict[str, Any] | None = None
    evaluated: dict[str, Any] | None = None
    for line in _lines_backwards(path, max_bytes_back):
        if latest is None:
            latest = _parse(line, "step")
        # Most lines hold no evaluation: a byte search skips them without parsing JSON.
        if b'"eval_' in line:
            evaluated = _parse(line, "step")
            if evaluated is not None:
                break
    latest = latest or {}
    evaluated = evaluated or {}
    return MetricsTail(
        step=_number(latest.get("step"), int),
        loss=float("nan") if "loss" in latest and latest["loss"] is None else _number(latest.get("loss"), float),
        samples_per_s=_number(latest.get("samples_per_s"), float),
        eval_accuracy=_number(evaluated.get("eval_accuracy"), float),
        eval_loss=_number(evaluated.get("eval_loss"), float),
        eval_step=_number(evaluated.get("step"), int),
    )


def _lines_backwards(path: Path, max_bytes_back: int) -> Iterator[bytes]:
    try:
        with open(path, "rb") as file:
            yield from _read_backwards(file, max_bytes_back)
    except OSError:  # no metrics yet
        return


def _read_backwards(file: BinaryIO, max_bytes_back: int) -> Iterator[bytes]:
    """Lines from the end of the file backwards, until max_bytes_back have been read."""
    end = file.seek(0, os.SEEK_END)
    position, carry = end, b""
    while position > 0 and end - position < max_bytes_back:
        size = min(BLOCK_BYTES, position)
        position -= size
        file.seek(position)
        lines = (file.read(size) + carry).split(b"\n")
        # The first piece may be the end of a line that starts in the block before.
        carry = lines.pop(0) if position > 0 else b""
        yield from reversed(lines)


def _parse(line: bytes, required: str) -> dict[str, Any] | None:
    """One metrics record; None for a blank or torn line (a writer killed mid-line), which
    hpctrain.run.jsonlines.read_jsonl skips too."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and required in record else None


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)
