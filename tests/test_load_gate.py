"""The suite's load gate (tests/load_gate.py): when a heavy test may start, as a table."""

from __future__ import annotations

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
    ("loads", "waited"),
    [
        ([1.0], 0.0),  # room at once
        ([9.0, 7.0, 5.9], 10.0),  # two polls over the bar of 6, then room
        ([6.0, 5.0], 5.0),  # the bar itself is over it
        ([50.0] * 1000, 600.0),  # never room: the cap, then the test runs anyway
    ],
)
def test_a_test_waits_while_the_load_is_at_or_over_the_bar(loads: list[float], waited: float) -> None:
    clock = FakeClock()
    seen = iter(loads)
    assert load_gate.wait_for_room(6.0, load=lambda: next(seen), sleep=clock.sleep, clock=clock) == waited
