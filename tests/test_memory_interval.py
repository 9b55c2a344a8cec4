"""How often the in-memory tier copies (hpctrain.checkpoint.memory_interval), as tables."""

from __future__ import annotations

import pytest

from hpctrain.checkpoint.memory_interval import AGREE_EVERY, AGREE_FIRST, Measured, agreed, agrees_at, widened


@pytest.mark.parametrize(
    ("copy_s", "step_s", "overhead", "minimum", "interval"),
    [
        (0.005, 0.017, 0.02, 1, 15),  # this machine's ConvNet: 5 ms a copy, 17 ms a step, 2% -> 15 steps
        (0.005, 0.5, 0.02, 1, 1),  # a GPU's long steps: every step
        (0.005, 0.5, 0.02, 4, 4),  # never under memory_ckpt_every
        (2.0, 0.5, 0.02, 1, 200),  # a large state: every 200 steps
        (1e6, 0.001, 0.02, 1, 10_000),  # capped
        (0.005, 0.017, 0.0, 3, 3),  # overhead 0: exactly memory_ckpt_every
        (0.0, 0.017, 0.02, 2, 2),  # not measured yet
        (0.005, 0.0, 0.02, 2, 2),
    ],
)
def test_the_interval_is_the_fewest_steps_a_copy_fits_in(
    copy_s: float, step_s: float, overhead: float, minimum: int, interval: int
) -> None:
    assert widened(copy_s, step_s, overhead, minimum) == interval


@pytest.mark.parametrize(
    ("views", "interval"),
    [
        ([Measured(True, 0.005, 0.5), Measured(True, 0.005, 0.017)], 15),  # the widest any rank needs
        ([Measured(True, 0.005, 0.5), Measured(None, 0.0, 0.0)], 1),  # a rank not measured yet needs nothing wider
        ([Measured(True, 0.005, 0.5), Measured(False, 0.005, 0.5)], 0),  # a node that cannot hold them: off for all
        ([], 1),
    ],
)
def test_the_ranks_agree_on_the_widest_interval_or_none(views: list[Measured], interval: int) -> None:
    assert agreed(views, 0.02, 1) == interval


def test_the_ranks_agree_twenty_steps_into_a_life_then_every_two_hundred() -> None:
    first = 41  # a life resumed at step 40
    at = [step for step in range(first, first + 3 * AGREE_EVERY) if agrees_at(step, first)]
    assert at == [first + AGREE_FIRST - 1 + k * AGREE_EVERY for k in range(3)]
    assert at[0] == 60
