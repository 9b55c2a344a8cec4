"""The phase-by-fault matrix (tests/phase_fault_matrix.py) is whole, names only tests that exist,
and is what the docs show (docs/fault-matrix.md)."""

from __future__ import annotations

import re
from pathlib import Path

import phase_fault_matrix as matrix
import pytest
import test_decide
import test_guardian

REPO = Path(__file__).resolve().parent.parent


def test_every_phase_meets_every_fault() -> None:
    assert list(matrix.CELLS) == list(matrix.PHASES)
    for phase, row in matrix.CELLS.items():
        assert list(row) == list(matrix.FAULTS), phase


def test_every_point_a_phase_names_is_a_fault_point() -> None:
    from hpctrain.faults import POINTS

    named = [point for _, point in matrix.PHASES.values() if point]
    assert set(named) <= set(POINTS), set(named) - set(POINTS)


@pytest.mark.parametrize(
    "proof", sorted({proof for row in matrix.CELLS.values() for cell in row.values() for proof in cell.proof})
)
def test_every_test_a_cell_names_exists(proof: str) -> None:
    path, _, test = proof.partition("::")
    function, _, row = test.partition("[")
    source = (REPO / path).read_text()
    assert re.search(rf"^def {re.escape(function)}\(", source, re.M), f"{proof}: no such test"
    tables = {"tests/test_decide.py": test_decide.ROWS, "tests/test_guardian.py": test_guardian.ROWS}
    if row:
        assert row.removesuffix("]") in tables[path], f"{proof}: no such row in {path}'s table"


def test_a_cell_not_possible_names_no_test() -> None:
    for row in matrix.CELLS.values():
        for cell in row.values():
            assert not (cell.state == "n/a" and cell.proof), cell


def test_the_docs_show_this_matrix() -> None:
    page = (REPO / "docs" / "fault-matrix.md").read_text()
    assert matrix.render() in page, "docs/fault-matrix.md's table: paste `python tests/phase_fault_matrix.py`"
    assert matrix.render_cells() in page, (
        "docs/fault-matrix.md's cells: paste `python tests/phase_fault_matrix.py --cells`"
    )
