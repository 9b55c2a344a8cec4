"""The order in which pytest-xdist workers get the suite's modules (tests/suite_order.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import suite_order


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class FakeItem:
    nodeid: str
    marks: tuple[str, ...] = field(default=())

    def iter_markers(self) -> list[Mark]:
        return [Mark(name) for name in self.marks]


@pytest.mark.parametrize(
    "marks, seconds",
    [
        ((), suite_order.OTHER_GUESS_S),
        (("slow",), suite_order.GUESS_S["slow"]),
        (("slurm",), suite_order.GUESS_S["slurm"]),
        (("slurm", "slow", "soak"), suite_order.GUESS_S["slurm"]),  # the largest guess, not the sum
        (("parametrize",), suite_order.OTHER_GUESS_S),
    ],
)
def test_a_tests_guess_comes_from_its_markers(marks: tuple[str, ...], seconds: float) -> None:
    assert suite_order.guess_seconds(marks) == seconds


def ids(items: list) -> list[str]:
    return [item.nodeid for item in items]


ITEMS = [
    FakeItem("tests/test_a.py::test_1"),
    FakeItem("tests/test_b.py::test_1", ("slurm",)),
    FakeItem("tests/test_a.py::test_2"),
    FakeItem("tests/test_c.py::test_1", ("slow",)),
    FakeItem("tests/test_b.py::test_2"),
]


@pytest.mark.parametrize(
    "measured, expected",
    [
        # Nothing measured: the guesses (b: 60.5 s, c: 20 s, a: 1 s); each module's tests in their order.
        (
            {},
            ["tests/test_b.py::test_1", "tests/test_b.py::test_2", "tests/test_c.py::test_1"]
            + ["tests/test_a.py::test_1", "tests/test_a.py::test_2"],
        ),
        # Measured times win over guesses; a test not measured is still guessed (b: 5 s + 0.5 s).
        (
            {"tests/test_a.py::test_1": 299.0, "tests/test_a.py::test_2": 1.0, "tests/test_b.py::test_1": 5.0},
            ["tests/test_a.py::test_1", "tests/test_a.py::test_2", "tests/test_c.py::test_1"]
            + ["tests/test_b.py::test_1", "tests/test_b.py::test_2"],
        ),
        # Equal times keep the collection order of the modules.
        (
            {
                "tests/test_a.py::test_1": 5.0,
                "tests/test_a.py::test_2": 5.0,
                "tests/test_b.py::test_1": 9.5,
                "tests/test_c.py::test_1": 10.0,
            },
            ["tests/test_a.py::test_1", "tests/test_a.py::test_2", "tests/test_b.py::test_1"]
            + ["tests/test_b.py::test_2", "tests/test_c.py::test_1"],
        ),
    ],
)
def test_modules_go_longest_first_and_keep_their_tests_together(measured: dict, expected: list[str]) -> None:
    assert ids(suite_order.longest_first(ITEMS, measured)) == expected


def test_a_parametrized_id_belongs_to_its_file() -> None:
    assert suite_order.module_of("tests/test_a.py::test_x[a::b]") == "tests/test_a.py"
    assert suite_order.module_of("tests/test_a.py::Klass::test_x") == "tests/test_a.py"


def test_stored_times_merge_and_a_damaged_file_reads_as_nothing(tmp_path: Path) -> None:
    path = tmp_path / "test_seconds.json"
    assert suite_order.read_measured(path) == {}
    suite_order.store_measured({"tests/test_a.py::test_1": 12.344, "tests/test_b.py::test_1": 1.0}, path)
    suite_order.store_measured({"tests/test_b.py::test_1": 2.0}, path)
    assert suite_order.read_measured(path) == {"tests/test_a.py::test_1": 12.34, "tests/test_b.py::test_1": 2.0}
    path.write_text("[1, 2]")
    assert suite_order.read_measured(path) == {}


def test_every_module_of_the_waiting_lane_exists_and_the_rest_is_the_main_lane() -> None:
    """A module renamed away would silently move to the main lane: each name must be a file."""
    repo = Path(__file__).resolve().parents[1]
    assert all((repo / module).is_file() for module in suite_order.WAITING_LANE)
    assert suite_order.lane_of("tests/test_slurm_silent_node.py::test_x[a]") == "waiting"
    assert suite_order.lane_of("tests/test_trainer.py::test_x") == "main"
