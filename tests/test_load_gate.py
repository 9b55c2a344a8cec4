"""The suite's load gate (tests/load_gate.py): when a heavy test may start, as a table."""

from __future__ import annotations

from pathlib import Path

import load_gate
import pytest


@pytest.mark.parametrize(
    ("cores", "per_core", "bar"),
    [(2, 3.0, 6.0), (16, 3.0, 48.0), (1, 1.0, 2.0), (2, 0.5, 2.0)],
)
def test_the_bar_is_a_few_processes_a_core_and_never_under_two(cores: int, per_core: float, bar: float) -> None:
    assert load_gate.max_load(cores, per_core) == bar


@pytest.mark.parametrize(
    ("raw", "per_core"),
    [(None, load_gate.MAX_LOAD_PER_CORE), ("", load_gate.MAX_LOAD_PER_CORE), ("0", 0.0), ("4.5", 4.5)],
)
def test_the_bar_from_the_environment(raw: str | None, per_core: float) -> None:
    environ = {} if raw is None else {"HPCTRAIN_TEST_MAX_LOAD_PER_CORE": raw}
    assert load_gate.per_core_from_env(environ) == per_core


@pytest.mark.parametrize("raw", ["many", "-1"])
def test_a_bad_bar_names_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="HPCTRAIN_TEST_MAX_LOAD_PER_CORE"):
        load_gate.per_core_from_env({"HPCTRAIN_TEST_MAX_LOAD_PER_CORE": raw})


@pytest.mark.parametrize(
    ("loadavg", "count"),
    [("0.36 1.39 2.18 1/120 23802\n", 0), ("9.10 7.00 5.00 12/412 999", 11), ("0.00 0.00 0.00 0/10 1", 0)],
)
def test_the_runnable_count_leaves_out_its_reader(loadavg: str, count: int) -> None:
    assert load_gate.runnable(loadavg) == count


def test_the_load_now_is_the_runnable_counts_mean_over_the_sample() -> None:
    counts = iter([3, 5, 1, 11, 1])  # with the reader: 2, 4, 0, 10, 0
    slept: list[float] = []

    def read() -> str:
        return f"0.10 0.10 0.10 {next(counts)}/300 1"

    assert load_gate.load_now(read, slept.append, sample_s=1.0, every_s=0.2) == 16 / 5
    assert slept == [0.2] * 4


def test_without_proc_loadavg_the_load_now_is_the_one_minute_average() -> None:
    def read() -> str:
        raise FileNotFoundError("/proc/loadavg")

    assert load_gate.load_now(read, lambda s: None, fallback=lambda: 4.5) == 4.5


class FakeClock:
    """Time that moves only when the gate sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("last_start", "loads", "calm_load", "waited"),
    [
        (None, [1.0], None, 0.0),  # the first heavy start, room at once
        (None, [9.0, 7.0, 5.9], None, 6.0),  # two polls (3 s each) over the bar of 6, then room
        (None, [6.0, 5.0], None, 3.0),  # the bar itself is over it
        (997.0, [3.0], None, 3.0),  # another worker started 3 s ago: 6 s apart
        (995.0, [3.0], None, 1.0),
        (994.0, [3.0], None, 0.0),  # 6 s ago: its turn at once
        (999.0, [1.0], 2.0, 2.0),  # a calm machine (load under 2): 3 s apart
        (999.0, [3.0], 2.0, 5.0),  # a busy one: 6 s
        (None, [50.0], None, 600.0),  # never room: the cap, then the test runs anyway
    ],
)
def test_a_heavy_test_waits_for_its_turn(
    tmp_path: Path, last_start: float | None, loads: list[float], calm_load: float | None, waited: float
) -> None:
    gate = tmp_path / "gate"
    if last_start is not None:
        gate.write_text(f"{last_start}\n")
    clock = FakeClock()
    clock.now = 1000.0
    calls = [0]

    def load() -> float:  # the loads in turn, the last one from then on
        calls[0] += 1
        return loads[min(calls[0], len(loads)) - 1]

    took = load_gate.take_turn(6.0, gate, load=load, sleep=clock.sleep, clock=clock, calm_load=calm_load)
    assert took == waited
    assert float(gate.read_text()) == 1000.0 + waited  # the next worker counts from this start
