"""Resume at another number of processes (trainer.elastic=true), with real local runs.

Each chain trains one run dir in lives of different sizes (the plan grown by trainer.max_steps at
each start, trainer.nprocs changed): every step trains the same samples as an uninterrupted run
of the same global batch (12), checked exactly from the samples each process fetched
(helpers/recorded.py), and the final weights equal that run's within floating-point reduction
order. At the size a run started with, an elastic resume stays bit-identical.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import assert_ok, describe, events, load_weights, run_train, train_command, train_env
from helpers.recorded import ENV, steps_in_layout

TESTS = Path(__file__).parent
STEPS = 30
COMMON = (
    "model=mlp",
    "sched=constant",
    "data.dataset._target_=helpers.recorded.recorded_digits",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
    "trainer.log_every=5",
    "trainer.elastic=true",
)
# (processes, steps trained to) per life; each chain's first size sets data.batch_size so the
# global batch is 12 samples a step.
CHAINS = {
    "2-3-2": [(2, 10), (3, 20), (2, STEPS)],
    "3-2": [(3, 15), (2, STEPS)],
    "4-1-4": [(4, 8), (1, 19), (4, STEPS)],
}
GLOBAL_BATCH = 12


def train_life(run_dir: Path, nprocs: int, steps: int, batch_size: int, samples: Path) -> None:
    overrides = [*COMMON, f"data.batch_size={batch_size}", f"trainer.nprocs={nprocs}", f"trainer.max_steps={steps}"]
    assert_ok(run_train(run_dir, overrides, TESTS, {ENV: str(samples)}))


def trained_steps(run_dir: Path, samples_of_life: list[Path], global_batch: int = GLOBAL_BATCH) -> list[list[int]]:
    """Every step's samples, life after life, in the layout each life's `start` recorded."""
    steps: list[list[int]] = []
    for start, samples in zip(events(run_dir, "start"), samples_of_life, strict=True):
        assert start["resumed_from_step"] == len(steps), start
        layout = start["layout"]
        assert layout["global_batch"] == global_batch, layout
        steps += steps_in_layout(str(samples), layout)
    return steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    """One process, the whole global batch in one micro-batch, uninterrupted."""
    root = tmp_path_factory.mktemp("reference")
    run_dir, samples = root / "run", root / "samples"
    train_life(run_dir, 1, STEPS, GLOBAL_BATCH, samples)
    return run_dir, trained_steps(run_dir, [samples])


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_run_resumed_at_other_sizes_trains_the_same_samples_and_weights(
    chain: str, reference: tuple[Path, list[list[int]]], tmp_path: Path
) -> None:
    lives = CHAINS[chain]
    batch_size = GLOBAL_BATCH // lives[0][0]
    run_dir = tmp_path / "run"
    samples = [tmp_path / f"samples-{life}" for life in range(len(lives))]
    for (nprocs, steps), recorded in zip(lives, samples, strict=True):
        train_life(run_dir, nprocs, steps, batch_size, recorded)
    reference_dir, reference_steps = reference
    assert [s["world_size"] for s in events(run_dir, "start")] == [n for n, _ in lives]
    assert trained_steps(run_dir, samples) == reference_steps  # the same samples in the same steps
    mine, theirs = load_weights(run_dir), load_weights(reference_dir)
    assert mine.keys() == theirs.keys()
    for name in mine:
        difference = (mine[name] - theirs[name]).abs().max().item()
        assert torch.allclose(mine[name], theirs[name], rtol=1e-4, atol=1e-6), f"{name}: {difference}"


def test_an_elastic_run_resumed_at_its_own_size_is_bit_identical(tmp_path: Path) -> None:
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    train_life(uninterrupted, 2, STEPS, 6, tmp_path / "samples-u")
    train_life(resumed, 2, 12, 6, tmp_path / "samples-0")
    train_life(resumed, 2, STEPS, 6, tmp_path / "samples-1")
    mine, theirs = load_weights(resumed), load_weights(uninterrupted)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_another_size_without_elastic_is_refused_by_key_and_nothing_is_lost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [*COMMON[:-1], "data.batch_size=6", "trainer.nprocs=2", "trainer.max_steps=10"]
    first = subprocess.run(
        train_command(run_dir, overrides), cwd=tmp_path, env=train_env(TESTS), capture_output=True, text=True
    )
    assert_ok(first)
    before = (run_dir / "model.pt").read_bytes()
    again = [*overrides[:-2], "trainer.nprocs=3", "trainer.max_steps=20"]
    refused = subprocess.run(
        train_command(run_dir, again), cwd=tmp_path, env=train_env(TESTS), capture_output=True, text=True
    )
    assert refused.returncode == 2, describe(refused)
    assert "trainer.nprocs" in refused.stderr and "trainer.elastic=true" in refused.stderr, describe(refused)
    assert (run_dir / "model.pt").read_bytes() == before


def test_a_resize_across_epochs_keeps_every_epochs_global_batches(tmp_path: Path) -> None:
    """3 processes x 12 (a global batch of 36) resumed on 2 (2 micro-batches of 9 each), across
    two epoch ends. The digits' 1,437 training samples give 39 steps an epoch at any size: at 2
    processes 79 micro-batches, the 79th left out, since a step never spans two epochs (before:
    it opened the next epoch's first step, and every step after differed)."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    steps = 90  # epochs end after steps 39 and 78
    train_life(reference, 3, steps, 12, tmp_path / "samples-reference")
    train_life(resumed, 3, 30, 12, tmp_path / "samples-0")
    train_life(resumed, 2, steps, 12, tmp_path / "samples-1")
    expected = trained_steps(reference, [tmp_path / "samples-reference"], 36)
    assert len(expected) == steps
    assert trained_steps(resumed, [tmp_path / "samples-0", tmp_path / "samples-1"], 36) == expected
    mine, theirs = load_weights(resumed), load_weights(reference)
    for name in theirs:
        assert torch.allclose(mine[name], theirs[name], rtol=1e-4, atol=1e-6), name


def test_a_global_batch_the_processes_cannot_share_equally_is_still_sample_exact(tmp_path: Path) -> None:
    """45 samples a step: 15 a process at three; resumed on two, 23 and 22 (two micro-batches each,
    of at most data.batch_size=15: 12 + 11 and 11 + 11), each micro-batch's loss weighted by its
    samples; then on three again. Every step trains the same samples as an uninterrupted run at
    three, and the weights equal its within floating-point reduction order."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    train_life(reference, 3, STEPS, 15, tmp_path / "samples-reference")
    lives = [(3, 10), (2, 20), (3, STEPS)]
    samples = [tmp_path / f"samples-{life}" for life in range(len(lives))]
    for (nprocs, steps), recorded in zip(lives, samples, strict=True):
        train_life(resumed, nprocs, steps, 15, recorded)
    layouts = [start["layout"] for start in events(resumed, "start")]
    assert layouts[1] == {"world_size": 2, "micro_batch": 12, "grad_accum": 2, "global_batch": 45}, layouts
    assert layouts[0] == layouts[2] == {"world_size": 3, "micro_batch": 15, "grad_accum": 1, "global_batch": 45}
    expected = trained_steps(reference, [tmp_path / "samples-reference"], 45)
    assert len(expected) == STEPS
    assert trained_steps(resumed, samples, 45) == expected
    mine, theirs = load_weights(resumed), load_weights(reference)
    for name in theirs:
        difference = (mine[name] - theirs[name]).abs().max().item()
        assert torch.allclose(mine[name], theirs[name], rtol=1e-4, atol=1e-6), f"{name}: {difference}"
