"""The live ranks' stacks before a silent node's step is ended, with real processes on this machine:
the watcher (hpctrain.recovery.watch) asks each live rank's beater, the beater has its training
process dump every thread's stack (faulthandler on SIGURG, from C) and writes them as the rank's
hang report; the silent node's rank writes none, and a training process that cannot dump (stopped)
gets a report saying so. The watcher waits seconds at most: the step still ends at once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_heartbeat import _end, _silent_events, _training, watched  # noqa: F401 (a fixture)

from hpctrain.run.heartbeats import StacksAsked

pytestmark = pytest.mark.slow


def test_stacks_asked_read_back_and_nothing_else_is_an_ask() -> None:
    asked = StacksAsked("/runs/a/hangs/41.0", "node2 silent for 11 s")
    assert StacksAsked.decode(asked.encode()) == asked
    for junk in (b"", b"hpctrain-keeper-ping", b'{"v": 1, "rank": 1}', b"hpctrain-stacks {]", b"hpctrain-stacks {}"):
        assert StacksAsked.decode(junk) is None


def test_the_live_ranks_stacks_are_kept_before_a_silent_nodes_step_ends(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]],  # noqa: F811 (the fixture)
) -> None:
    run_dir, folder, srun, _ = watched
    addr = (folder / "addr").read_text().strip()
    ranks = [_training(addr, rank, node) for rank, node in ((0, "node1"), (1, "node2"), (2, "node3"))]
    try:
        time.sleep(3)
        os.kill(ranks[2][0].pid, signal.SIGSTOP)  # node3's training process stopped: its beater beats on
        os.kill(ranks[1][1], signal.SIGSTOP)  # node2 dies silently
        frozen_at = time.monotonic()
        srun.wait(timeout=30)
        assert time.monotonic() - frozen_at <= 11.0, "the stacks held the step's end too long"
        (silent,) = _silent_events(run_dir)
        assert (silent["nodes"], silent["report"]) == (["node2"], "hangs/4242.0"), silent
        reports = run_dir / "hangs" / "4242.0"
        assert sorted(p.name for p in reports.iterdir()) == ["rank-0.txt", "rank-2.txt"]  # none from node2
        live = (reports / "rank-0.txt").read_text()
        assert live.startswith(
            f"rank 0 on node1, pid {ranks[0][0].pid}\nasked by the batch script's watcher: node2 silent"
        )
        # faulthandler's dump of the stand-in's main thread, asleep in its module.
        assert "Current thread" in live or "Thread 0x" in live, live
        assert 'File "<string>", line 6 in <module>' in live, live
        stopped = (reports / "rank-2.txt").read_text()
        assert "no stacks: the process did not dump them in time (stopped" in stopped, stopped
    finally:
        os.kill(ranks[2][0].pid, signal.SIGCONT)
        _end([proc for proc, _ in ranks], [beater for _, beater in ranks])
