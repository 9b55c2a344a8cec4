"""A sweep's points shared among forked children (hpctrain.submit.forked): the machinery as a
table and with real forks, then end to end through hpctrain-submit -m."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from clitools import run_cli
from conftest import describe
from omegaconf import OmegaConf

from hpctrain.run.exitcodes import CLI_USER_ERROR
from hpctrain.submit import forked

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("count", "parts", "lengths"),
    [
        (10, 3, [4, 3, 3]),
        (9, 3, [3, 3, 3]),
        (2, 4, [1, 1]),  # no empty slice
        (0, 2, []),
        (1000, 1, [1000]),
    ],
)
def test_slices_are_contiguous_and_even(count: int, parts: int, lengths: list[int]) -> None:
    ranges = forked.slices(count, parts)
    assert [len(r) for r in ranges] == lengths
    assert [i for r in ranges for i in r] == list(range(count))


@pytest.mark.parametrize(
    ("count", "cores", "children"),
    [
        (100, 16, 1),  # too few to be worth a fork
        (forked.MIN_PER_CHILD * 2, 16, 2),
        (10_000, 2, 2),  # no more than the cores
        (10_000, 1, 1),
    ],
)
def test_children_for(count: int, cores: int, children: int) -> None:
    assert forked.children_for(count, cores) == children


def test_no_fork_while_a_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert forked.children_for(10_000, 16) == 1
    finally:
        stop.set()
        thread.join()


def _square_all(items: Sequence[int], made: list[tuple[int, int]]) -> int:
    for item in items:
        made.append((item, item * item))
    return os.getpid()


def test_shares_come_back_in_order_each_from_its_own_child() -> None:
    made: list[tuple[int, int]] = []
    shares = forked.in_children(_square_all, list(range(11)), 3, into=made)
    assert [share.exit_code for share in shares] == [0, 0, 0]
    assert made == [(i, i * i) for i in range(11)]
    pids = {share.extra for share in shares}
    assert len(pids) == 3 and os.getpid() not in pids


def _fail_at_seven(items: Sequence[int], made: list[int]) -> None:
    for item in items:
        if item == 7:
            raise SystemExit(2)  # as hpctrain.cli.common.fail, after printing what to change
        made.append(item)


def test_a_failed_child_hands_back_what_it_made_and_its_exit_code() -> None:
    made: list[int] = []
    shares = forked.in_children(_fail_at_seven, list(range(10)), 2, into=made)  # 0..4 and 5..9
    assert [share.exit_code for share in shares] == [0, 2]
    assert made == [0, 1, 2, 3, 4, 5, 6]  # and the run dirs the failed one wrote, to remove


def _killed(items: Sequence[int], made: list[int]) -> None:
    made.extend(items)
    os.kill(os.getpid(), signal.SIGKILL)  # no memory left: the kernel ends it, nothing handed back


def test_a_child_killed_is_a_failure() -> None:
    made: list[int] = []
    shares = forked.in_children(_killed, [1, 2], 1, into=made)
    assert shares[0].exit_code != 0 and made == []


# Run in a process of its own: a test worker's SIGINT handling (pytest-xdist) is not a user's shell.
CTRL_C = """
import os, signal, sys
from hpctrain.submit import forked

def interrupted_at_three(items, made):
    for item in items:
        if item == 3:
            os.kill(os.getppid(), signal.SIGINT)  # Ctrl-C reaches the parent (in a shell, every child)
            raise KeyboardInterrupt
        made.append(item)

made = []
try:
    forked.in_children(interrupted_at_three, list(range(6)), 2, into=made)  # 0..2 and 3..5
    print("no interrupt", made)
except KeyboardInterrupt:
    print("interrupted", made)
"""


def test_ctrl_c_waits_for_every_child_and_keeps_what_they_made() -> None:
    done = subprocess.run([sys.executable, "-c", CTRL_C], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The first child's share whole, the second's nothing: both handed back, to remove.
    assert done.stdout.strip() == "interrupted [0, 1, 2]", done.stdout + done.stderr


# Ctrl-C pressed again and again while the parent reads what the children handed back: one
# landing as a share was read used to leave every share unread (the sweep's run dirs unknown).
CTRL_C_AGAIN = """
import os, signal, time
from hpctrain.submit import forked

HALF = 200_000  # enough that reading the first share takes a while

def interrupted_half_way(items, made):
    for item in items:
        if item == HALF:
            for _ in range(1000):
                os.kill(os.getppid(), signal.SIGINT)
                time.sleep(0.0005)
            raise KeyboardInterrupt
        made.append(item)

made = []
try:
    forked.in_children(interrupted_half_way, list(range(2 * HALF)), 2, into=made)
    print("no interrupt", len(made))
except KeyboardInterrupt:
    print("interrupted", len(made), made == list(range(HALF)))
"""


def test_ctrl_c_again_and_again_as_the_shares_are_read_loses_none() -> None:
    done = subprocess.run([sys.executable, "-c", CTRL_C_AGAIN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted 200000 True", done.stdout + done.stderr


def test_a_bug_in_a_child_is_a_failure_with_its_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    def broken(items: Sequence[int], made: list[int]) -> None:
        raise KeyError("no such thing")

    shares = forked.in_children(broken, [1], 1, into=[])
    assert shares[0].exit_code == 1
    assert "KeyError: 'no such thing'" in capfd.readouterr().err


needs_two_cores = pytest.mark.skipif(CORES < 2, reason="forked children only where there are two cores or more")


@needs_two_cores
def test_a_large_sweep_is_shared_among_children_each_point_its_own(tmp_path: Path) -> None:
    count = forked.MIN_PER_CHILD * 2 + 1
    sweep_dir = tmp_path / "sweep"
    crashes = ",".join(str(i) for i in range(count))
    done = run_cli(
        "submit",
        "-m",
        f"slurm.restart_budget.crash={crashes}",
        "metrics.wandb_group=g${hydra:job.num}",
        "dry_run=true",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, describe(done)
    assert f"checked {count} points" in done.stdout and "in 2 processes" in done.stdout, describe(done)
    for num in range(count):
        run_dir = sweep_dir / str(num)
        config = OmegaConf.load(run_dir / "config.yaml")
        assert config.slurm.restart_budget.crash == num and config.metrics.wandb_group == f"g{num}"
        assert str(run_dir) in (run_dir / "job.sbatch").read_text()
    assert (sweep_dir / "code" / "hpctrain").is_dir()  # the shared code snapshot, taken once


@needs_two_cores
def test_a_bad_point_in_a_child_refuses_the_sweep_and_leaves_nothing(tmp_path: Path) -> None:
    count = forked.MIN_PER_CHILD * 2 + 1
    sweep_dir = tmp_path / "sweep"
    crashes = ",".join([*(str(i) for i in range(count - 1)), "-1"])  # the last point, in the last child
    done = run_cli(
        "submit",
        "-m",
        f"slurm.restart_budget.crash={crashes}",
        "dry_run=true",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == CLI_USER_ERROR, describe(done)
    assert "slurm.restart_budget.crash: must be >= 0 (got -1)" in done.stderr, describe(done)
    assert "Traceback" not in done.stderr
    assert not sweep_dir.exists() or not any(p.is_dir() and p.name.isdigit() for p in sweep_dir.iterdir())
