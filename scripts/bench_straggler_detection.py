#!/usr/bin/env python
"""How soon a slowed rank is named a straggler (the targets: a rank 1.5x slower named
within 60 s, a rank 1.3x slower within 20 steps of the window).

One real run (`hpctrain-train`, a small GPT on two processes, `trainer.straggler_window_steps`
20, a step logged every step) trains while rank 1 is slowed again and again, the slowdowns in
rotated order: it is stopped (SIGSTOP) for 1 - 1/x of every 10 ms (`--period-ms`), so it runs at 1/x of its
speed, until the run journals `straggler` for it (or `--give-up-s`), then left at full speed
until `straggler_cleared` and two windows more. For each episode: the step the slowdown began at
(the run's newest logged step then), the step and the seconds at which the rank was named, the
slowdown the run measured, and the steps counted from the end of the first window that was slow
throughout (a window's steps are those after a multiple of 20). Printed: per slowdown, median and
p90 of the seconds and the steps, and every episode.

    python scripts/bench_straggler_detection.py [--episodes 4] [--slowdowns 1.5 1.3] [--period-ms 10]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

WINDOW = 20
GPT = [
    "model=gpt",
    "data=tokens",
    "data.dataset.seq_len=64",
    "trainer.nprocs=2",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
    "trainer.log_every=1",
    "trainer.max_steps=1000000",
    f"trainer.straggler_window_steps={WINDOW}",
]
# The slowdown's period: stopped for 1 - 1/x of each. Shorter than a step's forward, so every
# forward is slowed alike, as a throttled GPU slows every kernel; the tests' 100 ms periods are
# longer than this model's forward and land in it unevenly, window by window (with them, a rank
# measured at 1.40x in all went 336 steps before two windows in a row were over 1.3x).
PERIOD_S = 0.01


@dataclass
class Episode:
    slowdown: float  # asked for
    began_step: int
    named_step: int | None
    seconds: float | None
    measured: float | None  # the run's own slowdown for the rank

    @property
    def steps(self) -> int | None:
        return None if self.named_step is None else self.named_step - self.began_step

    @property
    def after_first_full_window(self) -> int | None:
        """Steps from the end of the first window slowed throughout to the naming."""
        if self.named_step is None:
            return None
        # Window k holds steps 20k-19..20k: the first after the slowdown began starts past began_step.
        first_full_end = (-(-self.began_step // WINDOW) + 1) * WINDOW
        return self.named_step - first_full_end


def newest_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


def events(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == name:
            found.append(record)
    return found


def ranks_of(launcher: int) -> list[int]:
    """The launcher's ranks: the children of its forkserver, rank 0 forked (and numbered) first."""

    def children(pid: int) -> list[int]:
        done = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    return sorted(rank for server in children(launcher) for rank in children(server))


def wait_until(predicate, timeout_s: float, launcher: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise SystemExit(f"the run ended (exit {launcher.returncode})")
        if predicate():
            return True
        time.sleep(0.2)
    return False


def slow_until_named(rank: int, slowdown: float, run_dir: Path, give_up_s: float, period_s: float) -> Episode:
    stopped_s = period_s * (1 - 1 / slowdown)
    named_before = len(events(run_dir, "straggler"))
    began_step, began = newest_step(run_dir), time.time()
    try:
        while time.time() - began < give_up_s:
            os.kill(rank, signal.SIGSTOP)
            time.sleep(stopped_s)
            os.kill(rank, signal.SIGCONT)
            time.sleep(period_s - stopped_s)
            named = events(run_dir, "straggler")[named_before:]
            if named:
                first = named[0]
                return Episode(slowdown, began_step, first["step"], first["time"] - began, first["slowdown"][0])
    finally:
        os.kill(rank, signal.SIGCONT)
    return Episode(slowdown, began_step, None, None, None)


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def wait_for_full_speed(run_dir: Path, launcher: subprocess.Popen) -> None:
    """Until the run clears the rank, then two windows more at full speed."""
    cleared_before = len(events(run_dir, "straggler_cleared"))
    wait_until(lambda: len(events(run_dir, "straggler_cleared")) > cleared_before, 120, launcher)
    at = newest_step(run_dir)
    wait_until(lambda: newest_step(run_dir) >= at + 2 * WINDOW, 120, launcher)


def run_episodes(folder: Path, run_dir: Path, order: list[float], give_up_s: float, period_s: float) -> list[Episode]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    command = [sys.executable, "-m", "hpctrain.cli.train", *GPT, f"hydra.run.dir={run_dir}"]
    episodes: list[Episode] = []
    with open(folder / "out.log", "w") as out:
        launcher = subprocess.Popen(
            command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            if not wait_until(lambda: newest_step(run_dir) >= 3 * WINDOW, 300, launcher):
                raise SystemExit(f"no step {3 * WINDOW} within 300 s: {folder / 'out.log'}")
            ranks = ranks_of(launcher.pid)
            if len(ranks) != 2:
                raise SystemExit(f"expected 2 ranks, found {ranks}")
            for slowdown in order:
                episode = slow_until_named(ranks[1], slowdown, run_dir, give_up_s, period_s)
                episodes.append(episode)
                print(
                    f"  {slowdown}x from step {episode.began_step}: named at step {episode.named_step} "
                    f"({episode.steps} steps, {episode.after_first_full_window} after the first full window, "
                    f"{episode.seconds and round(episode.seconds, 1)} s), measured {episode.measured}",
                    flush=True,
                )
                wait_for_full_speed(run_dir, launcher)
        finally:
            os.killpg(launcher.pid, signal.SIGINT)
            launcher.wait(120)
    false = [e for e in events(run_dir, "straggler") if e["ranks"] != [1]]
    print(f"stragglers named other than rank 1: {len(false)}")
    return episodes


def print_table(episodes: list[Episode], slowdowns: list[float]) -> None:
    print(
        f"{'slowdown':>8} {'named':>7} {'s median':>9} {'s p90':>6} {'steps med':>9} {'steps p90':>9} "
        f"{'after full window, max':>22}"
    )
    for slowdown in slowdowns:
        mine = [e for e in episodes if e.slowdown == slowdown]
        named = [e for e in mine if e.named_step is not None]
        if not named:
            print(f"{slowdown:>8} {0:>3}/{len(mine):<3} never named")
            continue
        seconds = [e.seconds for e in named if e.seconds is not None]
        steps = [float(e.steps) for e in named if e.steps is not None]
        after = [e.after_first_full_window for e in named if e.after_first_full_window is not None]
        print(
            f"{slowdown:>8} {len(named):>3}/{len(mine):<3} {statistics.median(seconds):>9.1f} {p90(seconds):>6.1f} "
            f"{statistics.median(steps):>9.0f} {p90(steps):>9.0f} {max(after):>22}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=4, help="episodes of each slowdown")
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[1.5, 1.3])
    parser.add_argument("--give-up-s", type=float, default=120.0)
    parser.add_argument("--period-ms", type=float, default=PERIOD_S * 1000, help="the slowdown's period")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-straggler-"))
    run_dir = folder / "run"
    kinds = len(args.slowdowns)
    order = [args.slowdowns[(e + i) % kinds] for e in range(args.episodes) for i in range(kinds)]  # rotated
    episodes = run_episodes(folder, run_dir, order, args.give_up_s, args.period_ms / 1000)
    print_table(episodes, args.slowdowns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
