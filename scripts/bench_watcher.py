"""The heartbeat watcher under the beats of a large job, on this machine.

    python scripts/bench_watcher.py --ranks 16384 [--timeout-s 10] [--ranks-per-node 8]

Starts a real watcher (`python -m hpctrain.recovery.watch`, as the batch shell does) with a stand-in
srun, and sender processes that beat for N synthetic ranks (8 a node by default) over UDP, each rank
once every BEAT_S as real beaters do, spread evenly over the second. A keeper stand-in pings the
watcher once a second, as hpctrain.recovery.keeper does, and counts the answers that came before
its next ping. After a warm-up longer than the timeout one node falls silent (its senders stop
beating for it, as a node that dies says nothing); the watcher should name that node, and only that
node, within the timeout plus a tick or two. Prints one line:

    watcher: ranks=N beats_per_s=.. timeout_s=.. pings_answered=A/B false_silent=F detect_s=D cpu_s=..

beats_per_s: the beats the senders sent a second; false_silent: nodes the watcher named that beat on;
detect_s: from the victim's last beat to the watcher's `silent` event (`none` if it never came);
cpu_s: the watcher's CPU seconds over the whole run. Exit status 1 when a ping went unanswered,
a node was named falsely, or the victim was not found within timeout + 5 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.run.heartbeats import BEAT_S, PING, PONG, Beat

SENDER_RANKS = 8192  # ranks one sender process beats for (at most 4 senders)
SLACK_S = 5.0  # detection allowed beyond the timeout


def node_of(rank: int, per_node: int) -> str:
    return f"node{rank // per_node:05d}"


def send(port: int, lo: int, hi: int, per_node: int, victim: str, silence_at: float, end_at: float) -> int:
    """Beat for ranks [lo, hi) until end_at (wall clock), the victim's ranks only until silence_at;
    print how many beats were sent."""
    nodes = [node_of(rank, per_node) for rank in range(lo, hi)]
    # One datagram a rank, made once (the watcher reads no sequence number): the senders' CPU goes
    # to sending, so a few processes can beat for tens of thousands of ranks.
    datagrams = [(node, Beat(lo + i, node, "0", os.getpid(), 0).encode()) for i, node in enumerate(nodes)]
    target = ("127.0.0.1", port)
    count, sent = len(datagrams), 0
    start = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        while time.time() < end_at:
            due = int((time.monotonic() - start) / BEAT_S * count)
            silenced = time.time() >= silence_at
            while sent < due:
                node, data = datagrams[sent % count]
                if not (silenced and node == victim):
                    try:
                        out.sendto(data, target)
                    except OSError:
                        pass  # a full socket buffer: a lost datagram, as on a real network
                sent += 1
            time.sleep(0.005)
    print(sent)
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def silent_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "silent"]


def bench(ranks: int, per_node: int, timeout_s: float) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-watcher-"))
    try:
        run_dir, folder, bin_dir = work / "run", work / "beats", work / "bin"
        for d in (run_dir, folder, bin_dir):
            d.mkdir()
        (run_dir / "config.yaml").write_text(f"slurm:\n  silent_node_timeout_s: {timeout_s}\n")
        shutil.copy("/bin/sleep", bin_dir / "srun")  # the watcher checks its srun's name
        (bin_dir / "scancel").write_text("#!/bin/sh\nexit 0\n")  # the step kill it asks for
        (bin_dir / "scancel").chmod(0o755)
        srun = subprocess.Popen([str(bin_dir / "srun"), "3600"])
        (folder / "srun.pid").write_text(f"{srun.pid}\n")
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "SLURM_JOB_ID": "4242",
            "SLURM_RESTART_COUNT": "0",
            "SLURMD_NODENAME": "localhost",
        }
        command = [sys.executable, "-m", "hpctrain.recovery.watch", str(run_dir), str(folder)]
        watcher = subprocess.Popen(command, env=env)
        try:
            deadline = time.monotonic() + 60
            while not (folder / "addr").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            port = int((folder / "addr").read_text().strip().rpartition(":")[2])
            return _drive(ranks, per_node, timeout_s, port, run_dir, watcher, srun)
        finally:
            watcher.kill()
            watcher.wait()
            srun.kill()
            srun.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _drive(
    ranks: int,
    per_node: int,
    timeout_s: float,
    port: int,
    run_dir: Path,
    watcher: subprocess.Popen[bytes],
    srun: subprocess.Popen[bytes],
) -> int:
    warm_s = timeout_s + 10.0
    started = time.time()
    silence_at = started + warm_s
    end_at = silence_at + timeout_s + SLACK_S + 3.0
    victim = node_of(ranks // 2, per_node)
    senders = max(1, min(4, math.ceil(ranks / SENDER_RANKS)))
    bounds = [ranks * i // senders for i in range(senders + 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--sender", str(port), str(lo), str(hi), str(per_node), victim]
            + [str(silence_at), str(end_at)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for lo, hi in zip(bounds, bounds[1:], strict=False)
    ]
    asked = answered = 0
    detected: float | None = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as keeper:
        keeper.settimeout(0.05)
        next_ask = time.monotonic()
        waiting = False
        while time.time() < end_at:
            if time.monotonic() >= next_ask:
                waiting = True  # an unanswered ping stays unanswered: one answer a ping
                keeper.sendto(PING, ("127.0.0.1", port))
                asked += 1
                next_ask += BEAT_S
            try:
                if keeper.recv(64) == PONG and waiting:
                    answered += 1
                    waiting = False
            except TimeoutError:
                pass
            if detected is None and silent_events(run_dir):
                detected = time.time()
    cpu_s = cpu_seconds(watcher.pid)
    sent = sum(int((p.communicate()[0] or "0").strip() or 0) for p in procs)
    events = silent_events(run_dir)
    named = {node for e in events for node in e["nodes"]}
    false_silent = len(named - {victim})
    found = victim in named
    # The victim's last beat came within a beat period before silence_at.
    detect_s = (events[0]["time"] - silence_at) if found else None
    beats_per_s = sent / (end_at - started)
    print(
        f"watcher: ranks={ranks} beats_per_s={beats_per_s:.0f} timeout_s={timeout_s:g} "
        f"pings_answered={answered}/{asked} false_silent={false_silent} "
        f"detect_s={'none' if detect_s is None else f'{detect_s:.1f}'} cpu_s={cpu_s:.1f}",
        flush=True,
    )
    ok = answered == asked and false_silent == 0 and detect_s is not None and detect_s <= timeout_s + SLACK_S
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["--sender"]:
        port, lo, hi, per_node, victim, silence_at, end_at = argv[1:]
        return send(int(port), int(lo), int(hi), int(per_node), victim, float(silence_at), float(end_at))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, required=True, help="synthetic ranks beating (e.g. 16384)")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=10.0, help="slurm.silent_node_timeout_s (default 10)")
    args = parser.parse_args(argv)
    if args.ranks < 2 * args.ranks_per_node:
        parser.error("--ranks: at least two nodes' worth (a silent node is judged against others that beat)")
    return bench(args.ranks, args.ranks_per_node, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
