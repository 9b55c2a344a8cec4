"""The nodes that meet a job's --constraint (hpctrain.recovery.constraints), from sinfo's output
captured on the dev cluster: node1 and node2 given the features `fast,ib`
(`scontrol update nodename=node1,node2 AvailableFeatures=fast,ib ActiveFeatures=fast,ib`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.recovery.constraints import nodes_meeting, parse_sinfo_features

FEATURES = parse_sinfo_features((Path(__file__).parent / "fixtures" / "slurm" / "sinfo_features.txt").read_text())


def test_features_per_node_as_sinfo_lists_them() -> None:
    fast_ib = frozenset({"fast", "ib"})
    assert {"node1": fast_ib, "node2": fast_ib, "node3": frozenset()} == FEATURES


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (None, None),  # no --constraint: every node counts
        ("(null)", None),
        ("fast", {"node1", "node2"}),
        ("fast&ib", {"node1", "node2"}),
        ("fast|gpu", {"node1", "node2"}),
        ("gpu", set()),
        ("fast&gpu", set()),
        # Forms not read (matching OR, counts, brackets): not known, every node counts.
        ("[fast|ib]", None),
        ("fast*2", None),
        ("[fast*1&ib*1]", None),
        ("(fast|ib)&gpu", None),
        ("fast&ib|gpu", None),
    ],
)
def test_nodes_meeting_a_constraint(constraint: str | None, expected: set[str] | None) -> None:
    found = nodes_meeting(constraint, FEATURES)
    assert (None if found is None else set(found)) == expected


def test_a_line_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="NODE|FEATURES"):
        parse_sinfo_features("node1 fast\n")
