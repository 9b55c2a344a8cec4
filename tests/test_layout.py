"""hpctrain.trainer.layout: how a global batch is split over processes, as tables."""

from __future__ import annotations

import pytest

from hpctrain.errors import UserError
from hpctrain.trainer.layout import Layout, moved_position, resized, resumed


@pytest.mark.parametrize(
    "global_batch, world_size, max_micro, expected",
    [
        (12, 2, 6, Layout(2, 6, 1)),  # the configured split comes back
        (12, 3, 6, Layout(3, 4, 1)),  # a smaller share fits one micro-batch
        (12, 4, 6, Layout(4, 3, 1)),
        (12, 1, 6, Layout(1, 6, 2)),  # one process: twice the accumulation, never a larger batch
        (12, 12, 6, Layout(12, 1, 1)),
        (96, 2, 32, Layout(2, 24, 2)),  # 48 a process: 2 micro-batches of 24, not 32 + 16
        (64, 1, 32, Layout(1, 32, 2)),
        (7 * 4, 1, 5, Layout(1, 4, 7)),  # 28 in at most 5: the fewest equal parts is 7 of 4
        (13, 1, 4, Layout(1, 1, 13)),  # a prime share: micro-batches of one sample
        (256, 8, 32, Layout(8, 32, 1)),
    ],
)
def test_a_global_batch_is_kept_with_the_fewest_micro_batches_that_fit(
    global_batch: int, world_size: int, max_micro: int, expected: Layout
) -> None:
    layout = resized(global_batch, world_size, max_micro)
    assert layout == expected
    assert layout.global_batch == global_batch and layout.micro_batch <= max_micro


@pytest.mark.parametrize("global_batch, world_size", [(12, 5), (64, 3), (6, 4)])
def test_a_process_count_that_cannot_share_the_global_batch_is_refused_by_key(
    global_batch: int, world_size: int
) -> None:
    with pytest.raises(UserError) as refused:
        resized(global_batch, world_size, 32)
    message = str(refused.value)
    assert message.startswith("trainer.elastic:") and f"global batch is {global_batch}" in message
    assert f"{world_size} processes" in message and "divides" in message


@pytest.mark.parametrize(
    "position, old, new, expected",
    [
        (10, Layout(2, 6, 1), Layout(3, 4, 1), 10),  # 120 samples either way: 10 micro-batches of 12
        (10, Layout(2, 6, 1), Layout(1, 6, 2), 20),  # one process takes 6 at a time: 20 micro-batches
        (20, Layout(1, 6, 2), Layout(4, 3, 1), 10),
        (0, Layout(2, 6, 1), Layout(3, 4, 1), 0),
        (7, Layout(3, 4, 1), Layout(3, 4, 1), 7),  # the same layout: unchanged
    ],
)
def test_a_data_position_is_counted_in_the_new_layouts_micro_batches(
    position: int, old: Layout, new: Layout, expected: int
) -> None:
    assert moved_position(position, old, new) == expected
    assert expected * new.samples_per_micro_batch == position * old.samples_per_micro_batch


def test_a_position_between_steps_of_the_new_layout_is_a_bug_not_a_guess() -> None:
    with pytest.raises(ValueError, match="not a whole number"):
        moved_position(1, Layout(1, 6, 2), Layout(2, 6, 1))  # half a global batch


@pytest.mark.parametrize(
    "saved, world_size, elastic, expected",
    [
        (Layout(2, 6, 1), 2, False, Layout(2, 6, 1)),
        (Layout(2, 6, 1), 2, True, Layout(2, 6, 1)),
        (Layout(2, 6, 1), 3, True, Layout(3, 4, 1)),
        (Layout(3, 4, 1), 2, True, Layout(2, 6, 1)),  # back to the configured split
        (Layout(4, 3, 1), 1, True, Layout(1, 6, 2)),
        (Layout(2, 6, 1), 3, False, None),  # refused: another size needs trainer.elastic
    ],
)
def test_a_resume_keeps_the_global_batch_or_is_refused(
    saved: Layout, world_size: int, elastic: bool, expected: Layout | None
) -> None:
    if expected is None:
        with pytest.raises(UserError) as refused:
            resumed(saved, world_size, 6, elastic, step=40)
        message = str(refused.value)
        assert f"written by {saved.world_size} processes and this run has {world_size}" in message
        assert f"trainer.nprocs={saved.world_size}" in message and "trainer.elastic=true" in message
        assert "hydra.run.dir" in message
    else:
        assert resumed(saved, world_size, 6, elastic, step=40) == expected


def test_a_layout_round_trips_through_its_checkpoint_record() -> None:
    layout = Layout(3, 4, 2)
    assert layout.as_dict() == {"world_size": 3, "micro_batch": 4, "grad_accum": 2, "global_batch": 24}
    assert Layout.from_dict(layout.as_dict()) == layout
