"""Which nodes are big enough for a job (hpctrain.recovery.node_sizes), from sinfo's own lines.

tests/fixtures/slurm/sinfo_resources.txt is `sinfo -N -h -o '%N|%G|%m'` of the dev cluster (3
nodes of 2 GPUs and 6000 MB, each listed once per partition). The gres forms are those sinfo(1)
and gres.conf(5) document: `gpu:2`, `gpu:TYPE:COUNT`, a socket list in parentheses, several
entries joined by commas, `(null)` for none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.recovery.constraints import parse_sinfo_features
from hpctrain.recovery.facts import parse_sinfo_nodes
from hpctrain.recovery.node_sizes import NodeSize, gpus_in, memory_mb, nodes_big_enough, parse_sinfo_sizes
from hpctrain.slurm.node_columns import NodeColumns, split_columns

FIXTURE = Path(__file__).parent / "fixtures" / "slurm" / "sinfo_resources.txt"


def test_the_dev_clusters_nodes_as_sinfo_lists_them() -> None:
    sizes = parse_sinfo_sizes(FIXTURE.read_text())
    assert sizes == {f"node{i}": NodeSize(gpus=2, memory_mb=6000) for i in (1, 2, 3)}


@pytest.mark.parametrize(
    "gres, gpus",
    [
        ("gpu:2", 2),
        ("gpu:a100:4", 4),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a100:4(S:0-1),gpu:v100:2(S:0)", 6),
        ("gpu:tesla:2,mps:200", 2),
        ("mps:100", 0),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_gpus_in_every_gres_form(gres: str, gpus: int) -> None:
    assert gpus_in(gres) == gpus


@pytest.mark.parametrize(
    "mem, mb",
    [("16000", 16000), ("16G", 16384), ("512M", 512), ("1T", 1048576), ("2048K", 2), ("0", None), (None, None)],
)
def test_memory_mb_reads_sbatch_mem(mem: str | None, mb: int | None) -> None:
    assert memory_mb(mem) == mb


def test_a_mixed_partition_keeps_only_the_nodes_big_enough() -> None:
    """The dev cluster's lines with node3 made a smaller node (1 GPU, 4000 MB): the same format."""
    text = FIXTURE.read_text().replace("node3|gpu:2|6000", "node3|gpu:1|4000")
    sizes = parse_sinfo_sizes(text)
    assert nodes_big_enough(sizes, gpus_per_node=2, mem_mb=None) == {"node1", "node2"}
    assert nodes_big_enough(sizes, gpus_per_node=0, mem_mb=5000) == {"node1", "node2"}
    assert nodes_big_enough(sizes, gpus_per_node=1, mem_mb=4000) == {"node1", "node2", "node3"}
    assert nodes_big_enough(sizes, gpus_per_node=0, mem_mb=None) is None


def test_a_line_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="NODE|GRES|MEMORY"):
        parse_sinfo_sizes("node1 gpu:2 6000\n")


def test_one_sinfo_gives_the_states_the_features_and_the_sizes() -> None:
    """The control step lists the nodes once (NodeColumns.ALL, captured on the dev cluster with
    node1's features set and node2 drained): each parser reads its own columns back, the free-text
    reason whole."""
    views = split_columns((FIXTURE.parent / "sinfo_all_columns.txt").read_text())
    states = parse_sinfo_nodes(views[NodeColumns.STATES])
    assert sorted(states) == ["node1", "node2", "node3"]
    assert parse_sinfo_features(views[NodeColumns.FEATURES])["node1"] == {"fast", "ib"}
    assert parse_sinfo_sizes(views[NodeColumns.SIZES])["node2"] == NodeSize(gpus=2, memory_mb=6000)
    assert "Kill task failed" in views[NodeColumns.STATES]
    with pytest.raises(ValueError, match="is not"):
        split_columns("node1|idle|none\n")
