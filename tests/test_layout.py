"""hpctrain.trainer.layout: how a global batch is split over processes, as tables."""

from __future__ import annotations

import pytest

from hpctrain.errors import UserError
from hpctrain.trainer.layout import Layout, moved_position, range_refusal, resized, resumed


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
        (7 * 4, 1, 5, Layout(1, 5, 6, 28)),  # 28 in at most 5: 6 micro-batches (5, 5, 5, 5, 4, 4)
        (13, 1, 4, Layout(1, 4, 4, 13)),  # a prime share: 4, 3, 3, 3 (not 13 micro-batches of one)
        (256, 8, 32, Layout(8, 32, 1)),
        # Shares that differ by one sample: 45 on 2 is 23 + 22, in 2 micro-batches of at most 15.
        (45, 2, 15, Layout(2, 12, 2, 45)),
        (45, 2, 23, Layout(2, 23, 1, 45)),
        (64, 3, 32, Layout(3, 22, 1, 64)),  # 22, 21, 21
        (45, 7, 2, Layout(7, 2, 4, 45)),  # 7, 7, 7, 6, 6, 6, 6: four micro-batches each
    ],
)
def test_a_global_batch_is_kept_with_the_fewest_micro_batches_that_fit(
    global_batch: int, world_size: int, max_micro: int, expected: Layout
) -> None:
    layout = resized(global_batch, world_size, max_micro)
    assert layout == expected
    assert layout.global_batch == global_batch and layout.micro_batch <= max_micro


@pytest.mark.parametrize(
    "global_batch, world_size, max_micro, why",
    [
        (12, 5, 1, "would take 3 or 2 samples a step"),  # micro-batches of one: 3 and 2 of them
        (6, 8, 32, "leave 2 of them without a sample"),
        (45, 2, 1, "would take 23 or 22 samples a step"),
    ],
)
def test_a_process_count_whose_split_cannot_work_is_refused_by_key(
    global_batch: int, world_size: int, max_micro: int, why: str
) -> None:
    with pytest.raises(UserError) as refused:
        resized(global_batch, world_size, max_micro)
    message = str(refused.value)
    assert message.startswith("trainer.elastic:") and f"global batch is {global_batch}" in message
    assert why in message and "divides" in message


@pytest.mark.parametrize(
    "global_batch, world_size, max_micro",
    [(12, 5, 6), (64, 3, 32), (45, 2, 15), (45, 4, 2), (1000, 7, 3), (17, 16, 2)],
)
def test_every_sample_of_an_uneven_split_is_taken_once_and_weighted_to_the_global_mean(
    global_batch: int, world_size: int, max_micro: int
) -> None:
    layout = resized(global_batch, world_size, max_micro)
    sizes = [layout.micro_sizes(rank) for rank in range(world_size)]
    assert sum(map(sum, sizes)) == global_batch
    assert all(len(mine) == layout.grad_accum and min(mine) >= 1 and max(mine) <= max_micro for mine in sizes)
    assert max(map(max, sizes)) == layout.micro_batch
    # Each micro-batch's mean loss times its weight, averaged over the processes (DDP's all-reduce),
    # is the mean over the global batch: every sample counts 1 / global_batch.
    per_sample = {
        weight / size / world_size
        for rank in range(world_size)
        for weight, size in zip(layout.loss_weights(rank) or [], sizes[rank], strict=True)
    }
    assert all(abs(w - 1 / global_batch) < 1e-15 for w in per_sample)


def test_an_even_layout_keeps_the_plain_mean_over_its_micro_batches() -> None:
    layout = Layout(3, 4, 2)
    assert layout.even and layout.loss_weights(0) is None and layout.micro_sizes(2) == [4, 4]


@pytest.mark.parametrize(
    "nodes, tasks, batch, accum, cannot",
    [
        ("2-4", 8, 16, 1, None),  # the audit's range: 512 on 3 nodes' 24 processes is 22 or 21 each
        ("1-3", 1, 15, 1, None),  # 45 on 2: 23 + 22
        ("2-4", 8, 1, 2, ["started on 4 (a global batch of 64) it cannot go on on 3"]),
        ("1-3", 1, 1, 1, ["started on 1 (a global batch of 1) it cannot go on on 2"]),
        ("2-2", 4, 1, 1, None),
    ],
)
def test_a_node_range_whose_sizes_cannot_go_on_at_each_other_is_refused_naming_them(
    nodes: str, tasks: int, batch: int, accum: int, cannot: list[str] | None
) -> None:
    least, most = (int(n) for n in nodes.split("-"))
    refusal = range_refusal(range(least, most + 1), tasks, batch, accum)
    if cannot is None:
        assert refusal is None
    else:
        assert refusal is not None and f"nodes {nodes} with {tasks} process{'es' if tasks > 1 else ''} each" in refusal
        assert all(pair in refusal for pair in cannot), refusal
        assert "data.batch_size" in refusal


@pytest.mark.parametrize(
    "position, old, new, expected",
    [
        (10, Layout(2, 6, 1), Layout(3, 4, 1), 10),  # 120 samples either way: 10 micro-batches of 12
        (10, Layout(2, 6, 1), Layout(1, 6, 2), 20),  # one process takes 6 at a time: 20 micro-batches
        (20, Layout(1, 6, 2), Layout(4, 3, 1), 10),
        (0, Layout(2, 6, 1), Layout(3, 4, 1), 0),
        (7, Layout(3, 4, 1), Layout(3, 4, 1), 7),  # the same layout: unchanged
        (6, Layout(3, 15, 1), Layout(2, 12, 2, 45), 12),  # 6 steps of 45 either way
    ],
)
def test_a_data_position_is_counted_in_the_new_layouts_micro_batches(
    position: int, old: Layout, new: Layout, expected: int
) -> None:
    assert moved_position(position, old, new) == expected
    # Both count the same samples: whole steps of the one global batch.
    assert expected // new.grad_accum * new.global_batch == position // old.grad_accum * old.global_batch


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
    uneven = Layout(2, 12, 2, 45)
    assert Layout.from_dict(uneven.as_dict()) == uneven and uneven.as_dict()["global_batch"] == 45
