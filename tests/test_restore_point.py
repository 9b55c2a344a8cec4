"""Where a life's state comes from with copies in memory (hpctrain.checkpoint.restore_point), as tables."""

from __future__ import annotations

import pytest

from hpctrain.checkpoint.restore_point import HeldCopy, RestorePoint, partner_nodes, restore_point


@pytest.mark.parametrize(
    ("nodes", "partners"),
    [
        ([], {}),
        (["n1"], {}),  # one node: its copies die with it
        (["n1", "n2"], {"n1": "n2", "n2": "n1"}),
        (["n1", "n2", "n3"], {"n1": "n2", "n2": "n3", "n3": "n1"}),
    ],
)
def test_each_nodes_partner_is_the_next_node(nodes: list[str], partners: dict[str, str]) -> None:
    assert partner_nodes(nodes) == partners
    assert all(node != partner for node, partner in partners.items())


def kept(steps: dict[int, list[int]], partners: dict[str, str], node_of: dict[int, str]) -> list[HeldCopy]:
    """Each rank's states at `steps` (step -> ranks that finished it), on its node and its partner's."""
    copies = []
    for step, ranks in steps.items():
        for rank in ranks:
            copies.append(HeldCopy(rank, step, node_of[rank]))
            if node_of[rank] in partners:
                copies.append(HeldCopy(rank, step, partners[node_of[rank]]))
    return copies


# Four ranks, two a node, three nodes' worth of partners: n1 <-> n2 (the job's two training nodes).
NODE_OF = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
PAIRED = partner_nodes(["n1", "n2"])


@pytest.mark.parametrize(
    ("steps", "partners", "lost", "disk", "point"),
    [
        # nothing lost: the newest step every rank holds
        ({41: [0, 1, 2, 3], 42: [0, 1, 2, 3]}, PAIRED, [], 40, RestorePoint("memory", 42)),
        # a node lost: its ranks' states survive on the partner
        ({41: [0, 1, 2, 3], 42: [0, 1, 2, 3]}, PAIRED, ["n2"], 40, RestorePoint("memory", 42)),
        # step 42 not yet copied by rank 3 when the node went: 41, one step redone
        ({41: [0, 1, 2, 3], 42: [0, 1, 2]}, PAIRED, ["n1"], 40, RestorePoint("memory", 41)),
        # no partner (one node's copies only) and that node lost: the disk
        ({41: [0, 1, 2, 3]}, {}, ["n2"], 40, RestorePoint("disk", 40)),
        # both copies lost (a node and its partner): the disk
        ({41: [0, 1, 2, 3]}, PAIRED, ["n1", "n2"], 40, RestorePoint("disk", 40)),
        # the disk newer than memory (a forced save after the last copy): the disk
        ({41: [0, 1, 2, 3]}, PAIRED, [], 45, RestorePoint("disk", 45)),
        # a tie: memory, the same state without the read
        ({45: [0, 1, 2, 3]}, PAIRED, [], 45, RestorePoint("memory", 45)),
        # nothing in memory, nothing on disk: a fresh start
        ({}, PAIRED, [], None, RestorePoint("none", 0)),
        # memory only (no disk checkpoint yet)
        ({3: [0, 1, 2, 3]}, PAIRED, ["n2"], None, RestorePoint("memory", 3)),
        # a step some rank never copied is no restore point, even the newest
        ({10: [0, 1, 2, 3], 11: [0, 2, 3], 12: [1, 2, 3]}, PAIRED, [], None, RestorePoint("memory", 10)),
    ],
)
def test_the_newest_step_every_rank_survives_for(
    steps: dict[int, list[int]], partners: dict[str, str], lost: list[str], disk: int | None, point: RestorePoint
) -> None:
    assert restore_point(4, kept(steps, partners, NODE_OF), lost, disk) == point


def test_copies_of_ranks_outside_the_world_do_not_complete_a_step() -> None:
    # Rank 4 of a larger world that saved before a resize, and a smaller world asked: only 0..1 count.
    copies = [HeldCopy(0, 7, "n1"), HeldCopy(4, 7, "n2"), HeldCopy(0, 6, "n1"), HeldCopy(1, 6, "n2")]
    assert restore_point(2, copies, [], None) == RestorePoint("memory", 6)


def test_an_empty_world_restores_from_disk_or_nothing() -> None:
    assert restore_point(0, [HeldCopy(0, 5, "n1")], [], 3) == RestorePoint("disk", 3)
    assert restore_point(0, [], [], None) == RestorePoint("none", 0)
