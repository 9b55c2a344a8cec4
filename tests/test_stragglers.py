"""Stragglers as a table (hpctrain.trainer.stragglers): which ranks are slower than their peers,
and when an episode begins and ends."""

from __future__ import annotations

import pytest

from hpctrain.run.events import Straggler, StragglerCleared, from_record
from hpctrain.trainer.stragglers import Episodes, slowdowns, window_time

ROWS = {
    # (each rank's median seconds of its own work, threshold) -> slow ranks and their slowdown
    "all alike": ([0.10, 0.10, 0.11, 0.10], 1.3, {}),
    "one rank 1.5x among 2": ([0.10, 0.15], 1.3, {1: 1.5}),
    "one rank 1.3x is not over 1.3x": ([0.10, 0.13], 1.3, {}),
    "one rank 1.35x among 8": ([0.1] * 7 + [0.135], 1.3, {7: 1.35}),
    "two slow ranks among 8": ([0.1, 0.2, 0.1, 0.1, 0.1, 0.1, 0.2, 0.1], 1.3, {1: 2.0, 6: 2.0}),
    "the fast one of 2 is no straggler": ([0.30, 0.10], 1.3, {0: 3.0}),
    "one rank alone": ([0.5], 1.3, {}),
    "peers that took no time: nothing to compare with": ([0.0, 0.0, 0.2], 1.3, {}),
    # Steps of a millisecond: 2x is half a millisecond, the scheduler's noise.
    "2x of a millisecond is under the noise floor": ([0.001, 0.002], 1.3, {}),
    "2x of 10 ms is not": ([0.010, 0.020], 1.3, {1: 2.0}),
    # A rank that timed too few steps of its window (its checkpoint written through it).
    "an untimed rank is neither judged nor a peer": ([None, 0.10, 0.15], 1.3, {2: 1.5}),
    "with one timed rank left, none to compare": ([None, 0.20], 1.3, {}),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_slowdowns(row: tuple) -> None:
    medians, threshold, expected = row
    assert slowdowns(medians, threshold) == expected


QUEUED_ROWS = {
    # (each rank's time, each rank's other threads' wait for a core a step) -> slow ranks
    "workers kept waiting explain the time: the machine's load": ([0.020, 0.034], [0.002, 0.016], {}),
    "a rank stopped waits no more than its peers: named": ([0.020, 0.034], [0.002, 0.003], {1: 1.65}),
    "what the wait does not explain still counts": ([0.020, 0.040], [0.001, 0.006], {1: 1.75}),
    "all ranks waiting alike take nothing off": ([0.020, 0.020, 0.034], [0.01, 0.01, 0.01], {2: 1.7}),
    "a peer that waited more is not made faster": ([0.020, 0.034, 0.020], [0.000, 0.000, 0.010], {1: 1.7}),
    "an untimed rank's wait is no one's baseline": ([None, 0.020, 0.034], [0.5, 0.002, 0.003], {2: 1.65}),
}


@pytest.mark.parametrize("row", QUEUED_ROWS.values(), ids=QUEUED_ROWS.keys())
def test_slowdowns_less_what_other_threads_waited_beyond_the_usual(row: tuple) -> None:
    times, queued, expected = row
    assert slowdowns(times, 1.3, queued=queued) == expected


def test_an_episode_is_journaled_once_and_its_end_once() -> None:
    episodes = Episodes()
    assert episodes.update({}) == ({}, [])
    assert episodes.update({3: 1.5}) == ({}, [])  # one window: not yet persistent
    assert episodes.update({3: 1.6}) == ({3: 1.6}, [])  # two in a row: named
    assert episodes.update({3: 1.6, 5: 1.4}) == ({}, [])  # still slow; 5 only once
    assert episodes.update({3: 1.7, 5: 1.4}) == ({5: 1.4}, [])
    assert episodes.update({5: 1.4}) == ({}, [3])
    assert episodes.update({}) == ({}, [5])
    assert episodes.update({}) == ({}, [])


def test_a_window_a_rank_was_not_judged_in_neither_counts_nor_clears() -> None:
    episodes = Episodes()
    assert episodes.update({1: 1.5}) == ({}, [])
    assert episodes.update({}, unjudged=[1]) == ({}, [])  # writing its checkpoint: as it was
    assert episodes.update({1: 1.5}) == ({1: 1.5}, [])  # its second slow window: named
    assert episodes.update({}, unjudged=[1]) == ({}, [])  # still named, not cleared
    assert episodes.named == {1}
    assert episodes.update({}) == ({}, [1])


def test_a_rank_slow_for_one_window_at_a_time_is_never_named() -> None:
    """A rank that loses its core to another process now and then: slow, fast, slow, fast."""
    episodes = Episodes()
    for window in range(10):
        assert episodes.update({1: 1.8} if window % 2 == 0 else {}) == ({}, [])
    assert Episodes(windows=1).update({1: 1.8}) == ({1: 1.8}, [])


def test_one_slow_step_in_a_window_flags_no_one() -> None:
    """A first step that compiles: left out of its window."""
    slow_start = window_time([3.0, 0.1, 0.1, 0.1, 0.1])
    assert slow_start == pytest.approx(0.1)
    assert slowdowns([slow_start, 0.1], 1.3) == {}


def test_the_events_read_back_whole() -> None:
    began = Straggler(
        time=1.0, job_id="7", restart=0, step=40, ranks=[1], nodes=["n2"], slowdown=[1.5], window_steps=20
    )
    record = began.to_record()
    assert record == {
        "event": "straggler",
        "time": 1.0,
        "job_id": "7",
        "restart": 0,
        "step": 40,
        "ranks": [1],
        "nodes": ["n2"],
        "slowdown": [1.5],
        "window_steps": 20,
    }
    assert from_record(record) == began
    cleared = StragglerCleared(time=2.0, step=60, ranks=[1], nodes=["n2"], window_steps=20)
    assert from_record(cleared.to_record()) == cleared


def test_status_detail_says_each_episode_and_a_run_that_stopped_itself() -> None:
    from hpctrain.run.causes import Action, Cause
    from hpctrain.run.events import Failure
    from hpctrain.status.diagnosis import diagnosis_lines

    events = [
        Straggler(step=300, ranks=[1], nodes=["node2"], slowdown=[2.71], window_steps=20),
        StragglerCleared(step=360, ranks=[1], nodes=["node2"], window_steps=20),
        Straggler(step=400, ranks=[0, 3], nodes=["node1", "node2"], slowdown=[1.4, 1.5], window_steps=20),
        Failure(
            cause=Cause.NO_PROGRESS,
            reason="3 lives in a row ended (crash this one) without a newer checkpoint",
            action=Action.FAIL.value,
        ),
    ]
    assert diagnosis_lines(events) == [
        "straggler: rank 1 on node2 2.71x its peers from step 300, cleared at step 360",
        "straggler: rank 0 on node1 1.40x its peers from step 400, still slow at the last window",
        "straggler: rank 3 on node2 1.50x its peers from step 400, still slow at the last window",
        "stopped: 3 lives in a row ended (crash this one) without a newer checkpoint (no_progress); each "
        "life's own error is in its job's slurm-<job id>.out in the run dir",
    ]
    assert diagnosis_lines([]) == []


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        # Stopped for part of every 100 ms: most forwards untouched (20 ms), some stretched past a
        # stop (70 ms): the median says 20 ms, the rank's real pace is the mean.
        ([0.02] * 11 + [0.07] * 9, (0.02 * 11 + 0.07 * 8) / 19),
        # One step that compiled (2 s) is left out: the window is as its other steps.
        ([2.0] + [0.01] * 19, 0.01),
        ([0.01, 0.03], 0.02),  # too few to leave one out
    ],
)
def test_a_windows_time_is_its_mean_without_the_slowest_step(times: list[float], expected: float) -> None:
    assert window_time(times) == pytest.approx(expected)


def test_a_window_with_too_few_steps_timed_has_no_time() -> None:
    assert window_time([]) is None
    assert window_time([0.01] * 9, fewest=10) is None
    assert window_time([0.01] * 10, fewest=10) == pytest.approx(0.01)
