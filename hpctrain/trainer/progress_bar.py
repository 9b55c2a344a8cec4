"""A one-line progress bar on rank 0's terminal, drawn by hand (no tqdm).

It goes to stderr, and only where someone watches: a terminal (trainer.progress_bar=auto), or
any stderr but a Slurm job's output file with `on`. Redrawn in place with a carriage return at
most a few times a second; hpctrain.logs erases it before each log line and draws it again
after, so the lines stay whole.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

# Redraws a second, at most: enough to look alive, too few to cost a step anything.
MIN_REDRAW_S = 0.25
BAR_CELLS = 30


def wanted(mode: str, stream: TextIO, in_slurm: bool) -> bool:
    """trainer.progress_bar: auto draws on a terminal; on also into a pipe or a file, but never
    into a Slurm job's output file (`in_slurm`: the process's life is a Slurm job's), which would
    keep every redraw as text; off never."""
    if mode == "off":
        return False
    if _is_terminal(stream):
        return True
    return mode == "on" and not in_slurm


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by a test harness, or closed
        return False


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    """`step/total pct [=====>    ] loss L N samples/s eta M:SS`, on one line of `stream`."""

    def __init__(self, stream: TextIO, total_steps: int) -> None:
        self.stream = stream
        self.total_steps = total_steps
        self.loss: float | None = None  # from the last log line: reading it each step would sync the GPU
        self.text = ""  # the bar as last drawn
        self.shown = 0  # characters of it on screen now (0: erased)
        self.last_draw = float("-inf")
        self.closed = False
        # Log lines come from other threads too (the checkpoint writer, the MLflow thread).
        self.lock = threading.Lock()

    def due(self) -> bool:
        return time.monotonic() - self.last_draw >= MIN_REDRAW_S

    def note(self, record: dict[str, float | int]) -> None:
        self.loss = float(record["loss"])

    def draw(self, step: int, samples_per_s: float, eta_s: float) -> None:
        with self.lock:
            self.last_draw = time.monotonic()
            self.text = self._compose(step, samples_per_s, eta_s)
            self._write("\r" + self.text.ljust(self.shown))
            self.shown = len(self.text)

    def clear(self) -> None:
        """Erase the bar, leaving the cursor at the start of its line (before a log line)."""
        with self.lock:
            if self.shown:
                self._write("\r" + " " * self.shown + "\r")
                self.shown = 0

    def redraw(self) -> None:
        """Draw the bar again as it was (after a log line)."""
        with self.lock:
            if self.text and not self.closed and not self.shown:
                self._write("\r" + self.text)
                self.shown = len(self.text)

    def close(self) -> None:
        self.clear()
        self.closed = True

    def _compose(self, step: int, samples_per_s: float, eta_s: float) -> str:
        total = max(self.total_steps, 1)
        width = len(str(self.total_steps))
        head = f"{step:>{width}}/{self.total_steps} {100 * step / total:3.0f}%"
        loss = f"loss {self.loss:.4f}" if self.loss is not None else "loss -"
        tail = f"{loss} {samples_per_s:.0f} samples/s eta {format_duration(eta_s)}"
        # One column short of the terminal: a line that fills it wraps on some terminals.
        columns = self._columns() - 1
        cells = min(BAR_CELLS, columns - len(head) - len(tail) - 4)
        if cells < 5:
            return f"{head} {tail}"[:columns]
        filled = cells * step // total
        bar = "=" * filled + (">" if filled < cells else "") + " " * (cells - filled - 1)
        return f"{head} [{bar[:cells]}] {tail}"

    def _columns(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):  # not a terminal (progress_bar=on)
            columns = 0
        return columns or 80  # a terminal whose size nobody set says 0

    def _write(self, text: str) -> None:
        if self.closed:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: training goes on without the bar
            self.closed = True
