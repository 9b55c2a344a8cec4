"""The progress bar: drawn on a real terminal (a pty) by a real `hpctrain-train`, absent from a
pipe or a file, and never in the way of the rank-prefixed log lines."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import train_command, train_env

from hpctrain import logs
from hpctrain.dist.context import DistContext
from hpctrain.run.life import LifeStamp
from hpctrain.trainer.progress import Progress
from hpctrain.trainer.progress_bar import MIN_REDRAW_S, ProgressBar, wanted

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")

STEPS = 120
RUN = (f"trainer.max_steps={STEPS}", "trainer.log_every=40", "trainer.eval_every=0")
COLUMNS = 72
LOG_LINE = re.compile(r"^\[rank0\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING) ")


def _run_with_stderr_on_a_pty(run_dir: Path) -> tuple[int, str, bytes, float]:
    """(exit code, stdout, what reached the terminal, seconds the run took)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    screen: list[bytes] = []

    def read_terminal() -> None:  # drained all along: a full pty would block the run's writes
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO once the last writer has closed it
                return
            if not chunk:
                return
            screen.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        proc = subprocess.run(
            train_command(run_dir, RUN),
            cwd=run_dir.parent,
            env=train_env(),
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=300,
        )
    finally:
        os.close(slave)
    took = time.monotonic() - started
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, proc.stdout, b"".join(screen), took


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same run twice at once: stderr on a terminal, and both streams into pipes (as into a
    Slurm .out file)."""
    root = tmp_path_factory.mktemp("progress")
    piped = subprocess.Popen(
        train_command(root / "piped", RUN),
        cwd=root,
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    on_a_terminal = _run_with_stderr_on_a_pty(root / "terminal")
    stdout, stderr = piped.communicate(timeout=300)
    return {"terminal": on_a_terminal, "piped": (piped.returncode, stdout, stderr)}


def test_on_a_terminal_the_bar_shows_step_percent_loss_rate_and_eta(runs: dict) -> None:
    code, stdout, screen, took = runs["terminal"]
    assert code == 0, stdout[-3000:]
    text = screen.decode()
    frames = [f for f in text.split("\r") if f.strip()]
    bars = [
        f
        for f in frames
        if re.fullmatch(rf" *\d+/{STEPS} +\d+% \[[=> ]+\] loss (-|\d\.\d{{4}}) \d+ samples/s eta \d+:\d\d *", f)
    ]
    assert bars, f"no progress bar on the terminal: {text[-2000:]!r}"
    assert len(bars) == len(frames), [f for f in frames if f not in bars]  # nothing else reached it
    assert all(len(frame) < COLUMNS for frame in frames), "fits the terminal, one column to spare"
    assert any(re.search(r"loss \d\.\d{4}", bar) for bar in bars), "the loss of the last log line"
    # At most a few redraws a second, besides the redraw after each of the 3 log lines.
    assert len(bars) <= took / MIN_REDRAW_S + 2 * 3 + 2, (len(bars), took)
    assert text.endswith("\r") and not text.split("\r")[-2].strip(), "erased at the end"
    # The log lines went to stdout, whole, and the bar never did.
    assert "\r" not in stdout
    assert [line for line in stdout.splitlines() if not LOG_LINE.match(line)] == []
    assert f"step {STEPS}/{STEPS}" in stdout


def test_without_a_terminal_there_is_no_bar_and_every_line_is_whole(runs: dict) -> None:
    code, stdout, stderr = runs["piped"]
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert "\r" not in stdout + stderr
    assert "samples/s eta" not in stderr
    lines = stdout.splitlines()
    assert [line for line in lines if not LOG_LINE.match(line)] == []
    assert len([line for line in lines if "hpctrain.trainer.progress: step " in line]) == STEPS // 40


# ---- pure logic -----------------------------------------------------------------------------------


class FakeStream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize(
    "mode, terminal, env, shown",
    [
        ("auto", True, {}, True),
        ("auto", False, {}, False),
        ("on", False, {}, True),  # forced: a pipe, a file
        ("on", False, {"SLURM_JOB_ID": "7"}, False),  # but never a Slurm .out file
        ("on", True, {"SLURM_JOB_ID": "7"}, True),  # srun --pty
        ("off", True, {}, False),
    ],
)
def test_when_the_bar_is_drawn(mode: str, terminal: bool, env: dict[str, str], shown: bool) -> None:
    assert wanted(mode, FakeStream(terminal), LifeStamp.from_env(env).in_slurm) is shown


def test_the_bar_is_erased_before_a_log_line_and_drawn_again_after() -> None:
    stream, lines = FakeStream(True), io.StringIO()
    bar = ProgressBar(stream, 200)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.setup(rank=0)
    root.handlers[0].setStream(lines)  # type: ignore[attr-defined]
    logs.attach_overlay(bar)
    try:
        bar.draw(50, 1234.0, 75.0)
        drawn = stream.getvalue()
        assert drawn == "\r 50/200  25% [=======>" + " " * 22 + "] loss - 1234 samples/s eta 1:15"
        logging.getLogger("x").info("a line")
        assert stream.getvalue() == drawn + "\r" + " " * (len(drawn) - 1) + "\r" + drawn
        assert lines.getvalue().startswith("[rank0] ") and lines.getvalue().endswith("x: a line\n")
        bar.close()
        assert stream.getvalue().endswith("\r" + " " * (len(drawn) - 1) + "\r")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_only_rank_0_draws_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", FakeStream(True))
    rank1 = DistContext(1, 1, 2, 2, "file://x", torch.device("cpu"), "spawn")
    assert Progress(rank1, 32, 10, bar="on").bar is None
    rank0 = Progress(DistContext.single(), 32, 10, bar="on")
    assert rank0.bar is not None
    rank0.close()
