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
        (None, [9.0, 7.0, 5.9], None, 10.0),  # two polls over the bar of 6, then room
        (None, [6.0, 5.0], None, 5.0),  # the bar itself is over it
        (990.0, [3.0], None, 10.0),  # another worker started 10 s ago: 20 s apart
        (995.0, [3.0], None, 15.0),
        (980.0, [3.0], None, 0.0),  # 20 s ago: its turn at once
        (997.0, [1.0], 2.0, 2.0),  # a calm machine (load under 2): 5 s apart
        (997.0, [3.0], 2.0, 17.0),  # a busy one: 20 s
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
