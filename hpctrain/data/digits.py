"""scikit-learn's 8x8 handwritten digits as a small image-classification dataset.

`load_digits()` ships inside scikit-learn (1,797 grey-scale 8x8 images, 10 classes), so it needs
no download and loads in milliseconds, which makes it a good smoke test for multi-node runs on
machines without internet access. Pixels are integers in 0..16; they are scaled to [0, 1].

The train/eval split is FIXED by `split_seed` alone (not by the training seed or the world size),
so every rank and every run evaluates on exactly the same held-out images. The whole dataset is
kept as in-memory tensors, so fetching a batch costs nothing beyond indexing.
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from hpctrain.data.augment import PixelNoise
from hpctrain.data.splits import Splits

log = logging.getLogger(__name__)

# load_digits() pixel values are counts of "on" pixels in 4x4 blocks of the original scan: 0..16.
_MAX_PIXEL = 16.0


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(pixels [1797, 64] float64, targets [1797] int): what `load_digits()` returns, read from the
    file scikit-learn ships (datasets/data/digits.csv.gz: 64 pixels then the label per line).

    Importing sklearn costs a training process about a second of CPU at every start (every rank,
    every life of a job), for a 1,797-line file: it is read directly, found without importing
    sklearn; load_digits() itself only where that file is not there."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:  # Only this dataset needs sklearn; keep it an optional dependency.
        raise ImportError("the digits dataset needs scikit-learn: pip install scikit-learn")
    shipped = [Path(folder) / "datasets" / "data" / "digits.csv.gz" for folder in spec.submodule_search_locations or ()]
    for path in shipped:
        if path.is_file():
            with gzip.open(path, "rt") as lines:
                data = np.loadtxt(lines, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    flat, target = load_digits(return_X_y=True)
    return flat, target


def _num_test(n: int, test_fraction: float) -> int:
    """Number of eval samples: ceil(n * fraction), like scikit-learn's train_test_split.

    Rounding to 6 decimals first keeps float noise (1000 * 0.3 = 300.00000000000006) from
    pushing the ceiling up by one; 1797 * 0.2 = 359.4 gives 360, leaving 1437 for training.
    """
    k = math.ceil(round(n * test_fraction, 6))
    # Both splits must be non-empty whatever the fraction.
    return min(max(k, 1), n - 1)


def digits(test_fraction: float = 0.2, split_seed: int = 0, noise_std: float = 0.0) -> Splits:
    """Return the digits dataset as `Splits` of `(image [1, 8, 8] float32, label int64)`.

    Args:
        test_fraction: share of the 1,797 images held out for eval, in (0, 1).
        split_seed: seeds the permutation that decides the split; the same seed always gives
            the same split.
        noise_std: standard deviation of Gaussian noise added to every training image each time
            it is fetched (augmentation; 0 turns it off). Eval images never get noise.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction (got {test_fraction}) must be in (0, 1)")
    pixels, targets = load_digits_arrays()
    images = torch.as_tensor(pixels, dtype=torch.float32).reshape(-1, 8, 8).div_(_MAX_PIXEL).unsqueeze(1)
    labels = torch.as_tensor(targets, dtype=torch.int64)
    n = images.shape[0]

    # A private generator: the split must not consume or depend on the global RNG state.
    gen = torch.Generator().manual_seed(split_seed)
    perm = torch.randperm(n, generator=gen)
    n_test = _num_test(n, test_fraction)
    train_idx, eval_idx = perm[: n - n_test], perm[n - n_test :]

    log.debug("digits: %d train / %d eval images (split_seed=%d)", n - n_test, n_test, split_seed)
    train = TensorDataset(images[train_idx], labels[train_idx])
    return Splits(
        train=PixelNoise(train, noise_std) if noise_std else train,
        eval=TensorDataset(images[eval_idx], labels[eval_idx]),
    )
