"""The built-in data factories: digits and synthetic tokens."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_ok, run_train

from hpctrain.data.digits import digits, load_digits_arrays
from hpctrain.data.splits import Splits
from hpctrain.data.tokens import synthetic_tokens
from hpctrain.models.gpt import GPT

# digits ---------------------------------------------------------------------------------------


def test_digits_split_sizes_and_types() -> None:
    s = digits()
    assert isinstance(s, Splits)
    assert (len(s.train), len(s.eval)) == (1437, 360)
    x, y = s.train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    assert y.dtype == torch.int64
    for ds in (s.train, s.eval):
        images, labels = ds.tensors
        assert images.min() >= 0.0 and images.max() <= 1.0
        assert images.max() == 1.0  # scaled by 16, not left at 0..16 or normalised away
        assert set(labels.tolist()) == set(range(10))


def test_digits_split_disjoint_and_complete() -> None:
    from sklearn.datasets import load_digits

    def rows(ds: torch.utils.data.TensorDataset) -> list[tuple]:
        return [tuple(x.flatten().tolist()) + (int(y),) for x, y in zip(*ds.tensors)]

    s = digits()
    # Images are not unique in general, so compare (image, label) rows as a multiset.

    raw = load_digits()
    everything = sorted(
        tuple((img / 16.0).astype("float32").flatten().tolist()) + (int(t),) for img, t in zip(raw.images, raw.target)
    )
    assert sorted(rows(s.train) + rows(s.eval)) == everything


def test_digits_are_read_as_load_digits_gives_them_without_importing_sklearn() -> None:
    """The shipped file, read directly, gives load_digits()'s arrays exactly, and a training
    process that reads it never imports sklearn (about a second of CPU at every start)."""
    from sklearn.datasets import load_digits

    pixels, targets = load_digits_arrays()
    want = load_digits()
    assert np.array_equal(pixels, want.data) and pixels.dtype == want.data.dtype
    assert np.array_equal(targets, want.target)
    probe = "import sys; from hpctrain.data.digits import digits; digits(); print('sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_digits_deterministic_and_seeded() -> None:
    torch.manual_seed(123)  # the global RNG must not matter
    a = digits()
    torch.manual_seed(456)
    b = digits()
    assert torch.equal(a.eval.tensors[0], b.eval.tensors[0])
    assert torch.equal(a.train.tensors[1], b.train.tensors[1])
    c = digits(split_seed=1)
    assert not torch.equal(a.eval.tensors[1], c.eval.tensors[1])


def test_digits_other_fraction() -> None:
    s = digits(test_fraction=0.5)
    assert len(s.train) + len(s.eval) == 1797
    assert len(s.eval) == 899


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
def test_digits_bad_fraction(frac: float) -> None:
    with pytest.raises(ValueError, match=rf"test_fraction \(got {frac}\) must be in \(0, 1\)"):
        digits(test_fraction=frac)


def test_splits_is_frozen() -> None:
    s = digits()
    with pytest.raises(FrozenInstanceError):
        s.train = s.eval  # type: ignore[misc]


# synthetic tokens -----------------------------------------------------------------------------


def test_tokens_shapes_and_shift() -> None:
    s = synthetic_tokens(vocab_size=100, seq_len=32, num_train=64, num_eval=8)
    assert (len(s.train), len(s.eval)) == (64, 8)
    x, y = s.train[0]
    assert x.shape == y.shape == (32,)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])
    for ds in (s.train, s.eval):
        for t in ds.tensors:
            assert t.min() >= 0 and t.max() < 100


def test_tokens_deterministic() -> None:
    torch.manual_seed(1)
    a = synthetic_tokens()
    torch.manual_seed(2)
    b = synthetic_tokens()
    for da, db in ((a.train, b.train), (a.eval, b.eval)):
        for ta, tb in zip(da.tensors, db.tensors):
            assert torch.equal(ta, tb)
    c = synthetic_tokens(seed=1)
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])


def test_tokens_eval_is_separate_stream() -> None:
    a = synthetic_tokens(num_train=64)
    b = synthetic_tokens(num_train=128)
    # Eval does not depend on how much training data was asked for, and differs from train.
    assert torch.equal(a.eval.tensors[0], b.eval.tensors[0])
    assert not torch.equal(a.eval.tensors[0], a.train.tensors[0][: len(a.eval)])


def _conditional_entropy(x: torch.Tensor, y: torch.Tensor, vocab: int) -> float:
    """Empirical H(next | current) in nats from all (x_t, y_t) pairs."""
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    counts.index_add_(0, (x * vocab + y).flatten(), torch.ones(x.numel(), dtype=torch.float64))
    counts = counts.view(vocab, vocab)
    p_joint = counts / counts.sum()
    p_cond = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    mask = counts > 0
    return float(-(p_joint[mask] * p_cond[mask].log()).sum())


def test_tokens_learnable_low_entropy() -> None:
    s = synthetic_tokens()
    h = _conditional_entropy(*s.train.tensors, vocab=512)
    assert h < 0.3 * math.log(512)  # ~1.1 nats vs 6.24 for uniform tokens


def test_tokens_fast_enough() -> None:
    import time

    start = time.perf_counter()
    synthetic_tokens(num_train=4096, seq_len=128)
    assert time.perf_counter() - start < 1.0


def test_tiny_gpt_loss_decreases_on_tokens() -> None:
    torch.manual_seed(0)
    s = synthetic_tokens(vocab_size=64, seq_len=32, num_train=256, num_eval=32)
    model = GPT(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = s.train.tensors
    ex, ey = s.eval.tensors

    def eval_loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(model(ex).flatten(0, 1), ey.flatten()).item()

    before = eval_loss()
    for step in range(60):
        i = torch.arange(step * 32, step * 32 + 32) % len(x)
        loss = F.cross_entropy(model(x[i]).flatten(0, 1), y[i].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = eval_loss()
    assert before > 0.9 * math.log(64)
    assert after < 0.6 * before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 1}, r"vocab_size \(got 1\) must be >= 2"),
        ({"seq_len": 0}, r"seq_len \(got 0\)"),
        ({"num_train": 0}, r"num_train \(got 0\)"),
        ({"num_eval": -1}, r"num_eval \(got -1\)"),
    ],
)
def test_tokens_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic_tokens(**kwargs)


# ---- DataLoader workers of local ranks --------------------------------------------------------


def test_local_ranks_fork_their_dataloader_workers_as_ranks_under_srun_do(tmp_path: Path) -> None:
    """Ranks come from a forkserver, whose start method they would inherit: each DataLoader
    worker then imported torch again (8 of a 12-CPU-second run went there). A rank's workers
    are its own forked children, as under srun or torchrun."""
    notes = tmp_path / "workers"
    notes.mkdir()
    overrides = (
        "model=mlp",
        "trainer.nprocs=2",
        "trainer.max_steps=3",
        "trainer.eval_every=0",
        "data.num_workers=2",
        "data.persistent_workers=false",
        "data.dataset._target_=helpers.worker_parents.digits_noting_worker_parents",
        f"+data.dataset.out_dir={notes}",
        "~data.dataset.test_fraction",
        "~data.dataset.split_seed",
    )
    assert_ok(run_train(tmp_path / "run", overrides, pythonpath=Path(__file__).parent))
    seen = [json.loads(p.read_text()) for p in notes.glob("*.json")]
    assert len(seen) == 4, seen  # 2 workers in each of 2 ranks
    assert all(note["os_parent"] == note["asked_by"] for note in seen), seen
