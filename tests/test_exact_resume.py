"""Exactness holes closed: DataLoader workers and a resume at another world size (torch.compile
with gradient accumulation: test_exact_resume_compiled.py, so the two run side by side).

Cheapest first: the loader in-process (worker randomness is a function of the position, with
persistent workers and without), then real `hpctrain-train` runs stopped by a real SIGTERM
mid-epoch and resumed, each ending with a model.pt bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import assert_ok, describe, events, load_weights, run_train, train_env
from test_signals import assert_bit_identical, run_and_signal
from torch.utils.data import TensorDataset

from hpctrain.config import DataConfig
from hpctrain.data.augment import PixelNoise
from hpctrain.data.worker_seeds import batch_seed
from hpctrain.dist.context import DistContext
from hpctrain.trainer import loaders
from hpctrain.trainer.layout import Layout


def _ctx(rank: int, world_size: int, init_method: str = "") -> DistContext:
    return DistContext(rank, rank, world_size, world_size, init_method, torch.device("cpu"), "spawn")


# ---- worker randomness (in-process) -------------------------------------------------------------


def test_batch_seeds_differ_by_seed_epoch_rank_and_batch_and_repeat_exactly() -> None:
    keys = [(s, e, r, b) for s in (0, 1) for e in (0, 1, 2) for r in (0, 1) for b in (0, 1, 2, 3)]
    seeds = [batch_seed(*key) for key in keys]
    assert len(set(seeds)) == len(keys)
    assert seeds == [batch_seed(*key) for key in keys]
    assert all(0 <= s < 2**64 for s in seeds)
    assert batch_seed(-1, 0, 0, 0) != batch_seed(1, 0, 0, 0)  # negative seeds are accepted, and distinct


def _noise_loader(num_workers: int, persistent: bool) -> torch.utils.data.DataLoader:
    """Rank 1 of 2 over 40 zero images with pixel noise: every batch is the noise its fetch drew."""
    clean = TensorDataset(torch.zeros(40, 3), torch.arange(40))
    data = DataConfig(dataset={}, batch_size=4, num_workers=num_workers, persistent_workers=persistent)
    return loaders.train_loader(
        PixelNoise(clean, std=1.0), data, _ctx(1, 2), seed=7, layout=Layout(2, data.batch_size, 1)
    )


def _epochs(loader: torch.utils.data.DataLoader, starts: list[tuple[int, int]]) -> list[list[torch.Tensor]]:
    """The batches (noise and index) of each (epoch, first batch), in order, on one loader."""
    out = []
    for epoch, first in starts:
        loaders.start_epoch(loader, 7, epoch, first)
        out.append([torch.cat([noise.flatten(), index.float()]) for noise, index in loader])
    return out


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch-workers"])
def test_worker_randomness_depends_on_the_position_only(persistent: bool) -> None:
    """An epoch started 3 batches in (a resume) fetches exactly the batches an uninterrupted run
    fetches from there, the noise drawn in the workers included, and so does the next epoch."""
    whole = _epochs(_noise_loader(2, persistent), [(0, 0), (1, 0)])
    resumed = _epochs(_noise_loader(2, persistent), [(0, 3), (1, 0)])
    assert len(whole[0]) == 5 and len(resumed[0]) == 2  # 20 samples of rank 1, batches of 4
    for got, want in zip(resumed[0] + resumed[1], whole[0][3:] + whole[1], strict=True):
        assert torch.equal(got, want)
    # The workers' draws are used: noise, different for every batch and epoch.
    noise = [batch[:12] for batch in whole[0] + whole[1]]
    assert all(n.abs().sum() > 0 for n in noise)
    assert len({tuple(n.tolist()) for n in noise}) == len(noise)
    # Persistent workers or not, the same numbers (each batch reseeds its worker).
    other = _epochs(_noise_loader(2, not persistent), [(0, 0), (1, 0)])
    assert all(torch.equal(a, b) for a, b in zip(other[0] + other[1], whole[0] + whole[1], strict=True))


def test_without_workers_the_training_process_generator_draws_and_is_not_reseeded() -> None:
    """num_workers=0: the dataset draws from the process's generator, which checkpoints save;
    reseeding it per batch would also reseed dropout."""
    loader = _noise_loader(0, persistent=False)
    torch.manual_seed(123)
    (first,) = _epochs(loader, [(0, 0)])
    torch.manual_seed(123)
    expected = [torch.randn(4, 3) for _ in first]
    assert all(torch.equal(batch[:12], noise.flatten()) for batch, noise in zip(first, expected, strict=True))


# ---- real runs: stopped mid-epoch by SIGTERM, resumed, bit-identical ----------------------------

# 1437 digits at 8 per process x 2 processes: 89 batches an epoch, a few milliseconds a step. On a
# busy machine the stop lands tens of steps after the signal; 240 steps leave 200 for that, and
# the resume crosses two epoch boundaries (persistent workers carry over them).
MAX_STEPS = 240
BATCHES_PER_EPOCH = 89  # micro-batches of one process
STOP_AFTER = 30
BASE = (
    "model=mlp",
    "trainer.nprocs=2",
    "data.batch_size=8",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
)
WORKERS = (*BASE, "data.num_workers=2", "+data.dataset.noise_std=0.3")
# The reference's workers are made again at every epoch; the stopped run keeps them (the default).
WORKERS_EACH_EPOCH = (*WORKERS, "data.persistent_workers=false")


@pytest.fixture(scope="module")
def background() -> Iterator[ThreadPoolExecutor]:
    """Uninterrupted reference runs train here, beside the run a test stops."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-run")
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def references(
    background: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, Future[subprocess.CompletedProcess[str]]]]:
    root = tmp_path_factory.mktemp("references")
    return {
        name: (root / name, background.submit(run_train, root / name, overrides))
        for name, overrides in (("workers", WORKERS_EACH_EPOCH),)
    }


def _reference(references: dict, name: str) -> Path:
    run_dir, future = references[name]
    assert_ok(future.result())
    return run_dir


def _stop_resume_compare(run_dir: Path, overrides: tuple[str, ...], reference: Path, grad_accum: int = 1) -> None:
    stopped = run_and_signal(run_dir, overrides, signal.SIGTERM, after=STOP_AFTER)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.describe()
    assert stopped.newest_train is not None, stopped.describe()
    saved = stopped.newest_train
    # Mid-epoch about 88 times in 89 (the stop lands on whatever step the ranks agree on); on an
    # epoch boundary the position and the bit-identical end are checked all the same. A stop on
    # an epoch's last batch saves (epoch, 89): the epoch is done, the next has not begun. An epoch
    # ends with its last whole step: with 2 micro-batches a step, 88 of its 89 are trained.
    per_epoch = BATCHES_PER_EPOCH - BATCHES_PER_EPOCH % grad_accum
    assert 0 <= saved["batch_in_epoch"] <= per_epoch, saved
    consumed = saved["epoch"] * per_epoch + saved["batch_in_epoch"]
    assert consumed == saved["step"] * grad_accum and saved["step"] < MAX_STEPS, saved
    resumed = run_train(run_dir, overrides)
    assert_ok(resumed)
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, saved["step"]], describe(resumed)
    assert_bit_identical(run_dir, load_weights(reference))


@pytest.mark.slow
def test_workers_with_random_augmentation_resume_bit_identically(references: dict, tmp_path: Path) -> None:
    """Two workers per process drawing pixel noise, kept across epochs (the default), stopped
    mid-epoch and resumed; the uninterrupted reference makes its workers again at every epoch,
    so the two ways of running workers draw alike as well (a worker's randomness depends on its
    position only: test_worker_randomness_depends_on_the_position_only)."""
    _stop_resume_compare(tmp_path / "run", WORKERS, _reference(references, "workers"))


@pytest.mark.slow
def test_resuming_with_another_process_count_is_refused_by_key(references: dict, tmp_path: Path) -> None:
    """The same config in the same run dir, started by torchrun with 1 process instead of 2 (the
    config's own trainer.nprocs is ignored under torchrun): refused, naming what to set."""
    run_dir = tmp_path / "run"
    shutil.copytree(_reference(references, "workers"), run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    command = [*torchrun, "-m", "hpctrain.cli.train", *WORKERS_EACH_EPOCH, f"hydra.run.dir={run_dir}"]
    refused = subprocess.run(command, cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=300)
    message = refused.stderr + refused.stdout
    assert refused.returncode != 0, message[-3000:]
    assert "written by 2 processes and this run has 1" in message, message[-3000:]
    assert "trainer.nprocs=2" in message, message[-3000:]
    # Checkpoints, weights and metrics untouched; the journal only gains the user_error failure
    # (and .run.lock names the command that held the run dir last, hpctrain.run.lock).
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.parent.name != ".hydra"}
    journal, lock = run_dir / "events.jsonl", run_dir / ".run.lock"
    assert {p: b for p, b in after.items() if p not in (journal, lock)} == {
        p: b for p, b in before.items() if p not in (journal, lock) and p.parent.name != ".hydra"
    }
    assert after[journal].startswith(before[journal])
    assert [e["cause"] for e in events(run_dir, "failure")] == ["user_error"]
