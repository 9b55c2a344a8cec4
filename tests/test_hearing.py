"""The watcher's record of a step (hpctrain/recovery/hearing.py): judged by node, it gives the
same answer as the rank-by-rank rule on every sequence of beats, and its work does not grow with
the ranks."""

from __future__ import annotations

import random
import time

import pytest

from hpctrain.recovery.hearing import Heard, StepHearing, silent_nodes

T = 10.0


def replay(beats: list[tuple[float, int, str, bool]]) -> tuple[StepHearing, dict[int, Heard]]:
    """The same beats into a StepHearing and into plain records, as the first watcher kept them."""
    hearing, plain = StepHearing(), {}
    for now, rank, node, bye in beats:
        hearing.hear(rank, node, now, bye=bye)
        heard = plain.setdefault(rank, Heard(node, now))
        heard.node, heard.last, heard.gone = node, now, heard.gone or bye
    return hearing, plain


@pytest.mark.parametrize(
    ("beats", "now", "expected"),
    [
        pytest.param([(95, 0, "a", False), (99, 1, "b", False)], 100, {}, id="everyone beats"),
        pytest.param([(89, 1, "b", False), (99, 0, "a", False)], 100, {"b": [1]}, id="one node silent"),
        pytest.param([(80, 0, "a", False), (85, 1, "b", False)], 100, {}, id="every rank silent"),
        pytest.param([(80, 1, "b", True), (99, 0, "a", False)], 100, {}, id="bye is no silence"),
        pytest.param(
            [(80, 1, "b", False), (85, 2, "b", False), (99, 0, "a", False), (99, 3, "c", False)],
            100,
            {"b": [1, 2]},
            id="every rank of a node",
        ),
        pytest.param(
            [(80, 1, "b", False), (99, 2, "b", False), (99, 2, "b", True), (99, 0, "a", False)],
            100,
            {"b": [1]},
            id="the node's beating rank said bye: the one left is silent",
        ),
        pytest.param(
            [(80, 1, "b", False), (99, 1, "c", False), (99, 0, "a", False), (70, 2, "b", False)][:3],
            100,
            {},
            id="a rank heard from another node lives there now",
        ),
    ],
)
def test_judged_by_node_as_by_rank(beats: list, now: float, expected: dict[str, list[int]]) -> None:
    hearing, plain = replay(beats)
    assert hearing.silent(now, T) == silent_nodes(plain, now, T) == expected


def test_the_same_answer_on_random_beats() -> None:
    rng = random.Random(20261202)
    for _ in range(300):
        nodes = [f"n{i}" for i in range(rng.randint(1, 5))]
        beats, now = [], 0.0
        for _ in range(rng.randint(1, 40)):
            now += rng.choice([0.0, 0.5, 3.0, 12.0])
            beats.append((now, rng.randint(0, 7), rng.choice(nodes), rng.random() < 0.1))
        hearing, plain = replay(beats)
        for later in (0.0, 5.0, 10.0, 10.5, 30.0):
            assert hearing.silent(now + later, T) == silent_nodes(plain, now + later, T), beats
        hearing.afresh(now + 50)
        for heard in plain.values():
            heard.last = now + 50
        assert hearing.silent(now + 61, T) == silent_nodes(plain, now + 61, T), beats


def test_a_beat_costs_far_less_than_judging_every_rank_and_a_judgement_follows_the_nodes() -> None:
    """Timed against the rank-by-rank rule in the same process (best of 3: the machine is shared):
    the first watcher did that rule's whole work for every beat."""
    ranks = 16_384
    hearing, plain = StepHearing(), {}
    for rank in range(ranks):  # 8 ranks a node
        hearing.hear(rank, f"n{rank // 8}", 0.0)
        plain[rank] = Heard(f"n{rank // 8}", 0.0)

    def best(work) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return min(times)

    names = [f"n{rank // 8}" for rank in range(ranks)]
    beat_s = best(lambda: [hearing.hear(rank, names[rank], 1.0) for rank in range(ranks)]) / ranks
    by_rank_s = best(lambda: silent_nodes(plain, 1.0, T))
    by_node_s = best(lambda: hearing.silent(1.0, T))
    assert beat_s * 100 < by_rank_s, (beat_s, by_rank_s)
    assert by_node_s < by_rank_s, (by_node_s, by_rank_s)
