"""Heartbeats and the batch script's watcher, on this machine: the decision as a table, then real
beater and watcher processes talking over UDP, a beater frozen (SIGSTOP, as a node that dies
silently) while another beats on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.recovery.hearing import Heard, silent_nodes
from hpctrain.recovery.watch import paused
from hpctrain.run.heartbeats import ADDR_ENV, Beat

T = 10.0  # the timeout of the table's rows


@pytest.mark.parametrize(
    ("heard", "now", "expected"),
    [
        pytest.param({0: Heard("a", 95.0), 1: Heard("b", 99.0)}, 100.0, {}, id="everyone beats"),
        pytest.param({0: Heard("a", 99.0), 1: Heard("b", 89.0)}, 100.0, {"b": [1]}, id="one node silent"),
        pytest.param({0: Heard("a", 99.0), 1: Heard("b", 90.0)}, 100.0, {}, id="exactly the timeout: not yet"),
        pytest.param(
            {0: Heard("a", 80.0), 1: Heard("b", 85.0)}, 100.0, {}, id="every rank silent: the step ends, not a node"
        ),
        pytest.param(
            {0: Heard("a", 99.0), 1: Heard("b", 80.0, gone=True)}, 100.0, {}, id="a rank that said bye is no silence"
        ),
        pytest.param(
            {0: Heard("a", 99.0), 1: Heard("b", 80.0), 2: Heard("b", 99.0)},
            100.0,
            {},
            id="a node with a rank still beating is alive",
        ),
        pytest.param(
            {0: Heard("a", 99.0), 1: Heard("b", 80.0), 2: Heard("b", 85.0), 3: Heard("c", 99.0)},
            100.0,
            {"b": [1, 2]},
            id="every rank of a node silent",
        ),
        pytest.param(
            {0: Heard("a", 99.0), 1: Heard("b", 80.0), 2: Heard("c", 70.0), 3: Heard("d", 99.0)},
            100.0,
            {"b": [1], "c": [2]},
            id="two nodes silent at once",
        ),
    ],
)
def test_which_nodes_are_silent(heard: dict[int, Heard], now: float, expected: dict[str, list[int]]) -> None:
    assert silent_nodes(heard, now, T) == expected


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [(100.0, 100.25, False), (100.0, 103.0, False), (100.0, 105.1, True), (100.0, 160.0, True)],
)
def test_a_watcher_that_did_not_run_for_half_the_timeout_hears_everyone_afresh(
    previous: float, now: float, expected: bool
) -> None:
    assert paused(previous, now, T) is expected


def test_a_beat_reads_back_and_anything_else_is_no_beat() -> None:
    beat = Beat(rank=3, node="gpu-017", step="2", pid=4242, seq=9)
    assert Beat.decode(beat.encode()) == beat
    assert Beat.decode(Beat(1, "n", "0", 1, 0, bye=True).encode()).bye  # type: ignore[union-attr]
    for junk in (b"", b"\xff\xfe", b"[]", b'{"v": 2, "rank": 1}', b'{"v": 1, "rank": "x"}'):
        assert Beat.decode(junk) is None


# ---- real processes ---------------------------------------------------------------------------

# A stand-in training process: it starts its beater (as hpctrain.worker does) and then lives on,
# so the test can freeze the beater alone, end this process, or signal the pair.
TRAINING = """
import os, sys, time
from hpctrain.process import heartbeat
beater = heartbeat.start(os.environ, int(sys.argv[1]))
print(beater.beater.pid, flush=True)
time.sleep(600)
"""


def _training(addr: str, rank: int, node: str, step: str = "0") -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, ADDR_ENV: addr, "SLURMD_NODENAME": node, "SLURM_STEP_ID": step}
    proc = subprocess.Popen([sys.executable, "-c", TRAINING, str(rank)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    yield sock
    sock.close()


def _beats_for(sock: socket.socket, seconds: float) -> list[Beat]:
    return _first_beats(sock, count=None, within_s=seconds)


def _first_beats(sock: socket.socket, count: int | None, within_s: float) -> list[Beat]:
    """The first `count` beats (None: all), waiting at most within_s: a beater's start (a Python
    process) takes seconds on a loaded machine, and only then does it beat once a second."""
    heard: list[Beat] = []
    deadline = time.monotonic() + within_s
    while (count is None or len(heard) < count) and time.monotonic() < deadline:
        try:
            beat = Beat.decode(sock.recv(4096))
        except TimeoutError:
            continue
        if beat is not None:
            heard.append(beat)
    return heard


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
def test_a_beater_beats_through_stop_signals_falls_silent_when_frozen_and_says_bye(listener: socket.socket) -> None:
    addr = f"127.0.0.1:{listener.getsockname()[1]}"
    training, beater = _training(addr, rank=1, node="node2")
    try:
        first = _first_beats(listener, 2, within_s=20.0)
        assert len(first) == 2, first
        assert all((b.rank, b.node, b.step, b.pid) == (1, "node2", "0", training.pid) for b in first)
        # Slurm's stop signals go to every process of a task: the beater leaves them to training.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            os.kill(beater, signum)
        assert len(_beats_for(listener, 2.0)) >= 1 and _state(beater) != "Z"
        # Frozen, as on a node that died: nothing more, however long.
        os.kill(beater, signal.SIGSTOP)
        _beats_for(listener, 0.5)  # a beat already in flight
        assert _beats_for(listener, 2.5) == []
        os.kill(beater, signal.SIGCONT)
        assert _beats_for(listener, 2.0)
        # The training process ends (a crash, the end): its beater says bye and leaves.
        training.kill()
        training.wait()
        last = _beats_for(listener, 2.0)
        assert last and last[-1].bye, last
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{beater}").exists() and _state(beater) != "Z":
            time.sleep(0.1)
        assert not Path(f"/proc/{beater}").exists() or _state(beater) == "Z"
    finally:
        _end([training], [beater])


def _end(procs: list[subprocess.Popen[str]], beaters: list[int]) -> None:
    """The stand-in training processes and their beaters gone (SIGKILL ends a stopped one too)."""
    for proc in procs:
        proc.kill()
    for pid in beaters:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_no_beater_outside_hpctrain_s_batch_script() -> None:
    from hpctrain.process import heartbeat

    assert heartbeat.start({}, 0) is None


# ---- the watcher ------------------------------------------------------------------------------


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]]]:
    """A run dir with a 3 s silent-node timeout, the watcher on it, and a stand-in srun (a
    process named srun) whose pid the watcher is given, as the batch shell gives it."""
    run_dir, folder = tmp_path / "run", tmp_path / "beats"
    run_dir.mkdir()
    folder.mkdir()
    (run_dir / "config.yaml").write_text("slurm:\n  silent_node_timeout_s: 3\n")
    fake_srun = tmp_path / "srun"
    shutil.copy("/bin/sleep", fake_srun)
    srun = subprocess.Popen([str(fake_srun), "600"])
    (folder / "srun.pid").write_text(f"{srun.pid}\n")
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost"}
    env.pop("SLURM_CONF", None)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.recovery.watch", str(run_dir), str(folder)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (folder / "addr").exists():
        time.sleep(0.05)
    assert (folder / "addr").exists(), "the watcher wrote no address"
    yield run_dir, folder, srun, watcher
    watcher.kill()
    watcher.wait()
    srun.kill()
    srun.wait()


def _silent_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "silent"]


@pytest.mark.slow
def test_the_watcher_ends_the_step_of_a_node_that_falls_silent(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]],
) -> None:
    run_dir, folder, srun, watcher = watched
    addr = (folder / "addr").read_text().strip()
    (rank0, beater0), (rank1, beater1) = _training(addr, 0, "node1"), _training(addr, 1, "node2")
    try:
        time.sleep(5)  # longer than the timeout: everyone beats, nothing happens
        assert srun.poll() is None and _silent_events(run_dir) == []
        os.kill(beater1, signal.SIGSTOP)  # node2 dies silently
        frozen_at = time.monotonic()
        srun.wait(timeout=30)
        took = time.monotonic() - frozen_at
        assert srun.returncode == -signal.SIGKILL
        # Silence counts from the last beat, up to a second before the freeze.
        assert 2.0 <= took <= 8.0, f"ended {took:.1f} s after the freeze (timeout 3 s)"
        (silent,) = _silent_events(run_dir)
        assert (silent["nodes"], silent["ranks"], silent["step_id"], silent["job_id"]) == (["node2"], [1], "0", "4242")
        assert 3.0 <= silent["silent_s"] < 8.0 and silent["timeout_s"] == 3.0  # silent_s: rounded to 0.1 s
    finally:
        _end([rank0, rank1], [beater0, beater1])
    assert "no heartbeat from node2" in _stderr_so_far(watcher)


def _stderr_so_far(watcher: subprocess.Popen[str]) -> str:
    watcher.kill()
    assert watcher.stderr is not None
    return watcher.stderr.read()


@pytest.mark.slow
def test_the_watcher_leaves_a_step_alone_that_ends_or_whose_every_rank_stops_at_once(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]],
) -> None:
    run_dir, folder, srun, _ = watched
    addr = (folder / "addr").read_text().strip()
    (rank0, beater0), (rank1, beater1) = _training(addr, 0, "node1"), _training(addr, 1, "node2")
    try:
        time.sleep(2)
        rank1.kill()  # a rank ends (a crash): its beater says bye
        time.sleep(5)
        os.kill(beater0, signal.SIGSTOP)  # now the only rank left stops: every rank silent
        time.sleep(5)
        assert srun.poll() is None and _silent_events(run_dir) == []
    finally:
        _end([rank0, rank1], [beater0, beater1])


@pytest.mark.slow
def test_a_relaunched_step_is_heard_afresh(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Step 0 loses node2; the relaunch (step 1, on node1 and node3) is watched in its turn, and
    step 0's frozen beater, thawed late, is not taken for step 1's."""
    run_dir, folder, srun, _ = watched
    addr = (folder / "addr").read_text().strip()
    first = [_training(addr, 0, "node1", "0"), _training(addr, 1, "node2", "0")]
    second: list[tuple[subprocess.Popen[str], int]] = []
    try:
        time.sleep(2)
        os.kill(first[1][1], signal.SIGSTOP)
        srun.wait(timeout=30)
        for proc, _beater in first[:1]:
            proc.kill()  # step 0's live rank ended with its step
        next_srun = subprocess.Popen([str(tmp_path / "srun"), "600"])
        (folder / "srun.pid").write_text(f"{next_srun.pid}\n")
        second = [_training(addr, 0, "node1", "1"), _training(addr, 1, "node3", "1")]
        os.kill(first[1][1], signal.SIGCONT)  # step 0's beater heard again: ignored
        time.sleep(5)
        assert next_srun.poll() is None and len(_silent_events(run_dir)) == 1
        os.kill(second[1][1], signal.SIGSTOP)
        next_srun.wait(timeout=30)
        assert [e["nodes"] for e in _silent_events(run_dir)] == [["node2"], ["node3"]]
        assert [e["step_id"] for e in _silent_events(run_dir)] == ["0", "1"]
    finally:
        _end([proc for proc, _ in [*first, *second]], [beater for _, beater in [*first, *second]])


@pytest.mark.slow
def test_a_steps_silence_heard_after_its_relaunch_leaves_the_relaunched_step_alone(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Slurm saw node2 lost first and the control step relaunched (a new srun) before the
    relaunched ranks' first beats: the watcher still holds step 0, where node2 is silent and node1
    not yet. It must not end the new srun (seen on a loaded dev cluster: the relaunched step killed
    2 s after its launch, charged as a crash and requeued)."""
    run_dir, folder, srun, _ = watched
    addr = (folder / "addr").read_text().strip()
    first = [_training(addr, 0, "node1", "0"), _training(addr, 1, "node2", "0")]
    try:
        time.sleep(2)
        os.kill(first[1][1], signal.SIGSTOP)  # node2 lost
        srun.kill()  # step 0's srun ended by Slurm; the relaunch's srun starts at once
        srun.wait()
        next_srun = subprocess.Popen([str(tmp_path / "srun"), "600"])
        (folder / "srun.pid").write_text(f"{next_srun.pid}\n")
        time.sleep(6)  # twice the timeout: step 0's node1 beats on, node2 silent
        assert next_srun.poll() is None and _silent_events(run_dir) == []
        next_srun.kill()
        next_srun.wait()
    finally:
        _end([proc for proc, _ in first], [beater for _, beater in first])


# A rank that leaves while its peer goes on (a stop with no time to save): it says bye itself,
# and Slurm's step clean-up kills its beater at once (slurmstepd SIGKILLs what a task leaves).
LEAVING = """
import os, signal, sys, time
from hpctrain.process import heartbeat
beating = heartbeat.start(os.environ, int(sys.argv[1]))
time.sleep(2)
beating.bye()
os.kill(beating.beater.pid, signal.SIGKILL)
print("left", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_rank_that_leaves_is_no_silent_node_even_when_its_beater_is_killed_with_it(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]],
) -> None:
    run_dir, folder, srun, _ = watched
    addr = (folder / "addr").read_text().strip()
    rank0, beater0 = _training(addr, 0, "node1")
    env = {**os.environ, ADDR_ENV: addr, "SLURMD_NODENAME": "node2", "SLURM_STEP_ID": "0"}
    leaving = subprocess.Popen([sys.executable, "-c", LEAVING, "1"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert leaving.stdout is not None and leaving.stdout.readline() == "left\n"
        time.sleep(6)  # twice the timeout, node1 beating on
        assert srun.poll() is None and _silent_events(run_dir) == []
    finally:
        _end([rank0, leaving], [beater0])


@pytest.mark.slow
def test_once_the_step_s_srun_has_returned_nothing_is_a_silent_node(
    watched: tuple[Path, Path, subprocess.Popen[bytes], subprocess.Popen[str]],
) -> None:
    """The shell removes srun.pid when srun returns; a rank that left without a word then (the
    hang watchdog's exit, SIGKILLed by the step's end) is the step's end, not a dead node."""
    run_dir, folder, _, _ = watched
    addr = (folder / "addr").read_text().strip()
    (rank0, beater0), (rank1, beater1) = _training(addr, 0, "node1"), _training(addr, 1, "node2")
    try:
        time.sleep(2)
        (folder / "srun.pid").unlink()
        os.kill(beater1, signal.SIGKILL)  # no bye
        time.sleep(6)
        assert _silent_events(run_dir) == []
    finally:
        _end([rank0, rank1], [beater0, beater1])
