"""Your own token ids from a file, read through np.memmap (nanoGPT's train.bin / val.bin).

A token file is a flat array of token ids: a raw binary file (numpy's `tofile`, nanoGPT's
`.bin`) whose element type is `dtype`, or a `.npy` file, whose header gives its type. Only the
pages a batch touches are read, so a file far larger than memory opens at once.

Item i is the window of seq_len + 1 tokens starting at token i * seq_len: the input is its first
seq_len tokens, the target its last seq_len. Windows are fixed (no random offsets), so an item
is a pure function of its index and the sampler's order decides everything: that is what keeps a
run exact on any world size and across resumes, as with the built-in datasets.

The eval split is `eval_path` when given, else the last `eval_fraction` of `path`'s tokens;
the train windows end where that part begins, so no token is in both.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from hpctrain.errors import ArgumentError

if TYPE_CHECKING:
    from hpctrain.data.splits import Splits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    """Where one split's tokens are: `count` tokens of `path` from token `start` on. Checked by
    `preflight` without torch (hpctrain-submit runs it on the login node); the job builds its
    torch Dataset (hpctrain.data.token_windows) from it."""

    path: Path
    dtype: np.dtype
    offset: int  # header bytes before the first token (a .npy file's)
    start: int
    count: int


def _open(path: str, dtype: str, argument: str) -> tuple[Path, np.dtype, int, int]:
    """(resolved path, element type, header bytes, token count), or ArgumentError saying why not."""
    given = Path(path).expanduser()
    resolved = given if given.is_absolute() else Path.cwd() / given
    where = str(resolved) if given.is_absolute() else f"{resolved} (relative to {Path.cwd()})"
    if not resolved.exists():
        raise ArgumentError(argument, f"no such file: {where}")
    if not resolved.is_file():
        raise ArgumentError(argument, f"{where} is not a file of token ids")
    try:
        with open(resolved, "rb") as file:  # readable by this user, not only present
            file.read(1)
        if resolved.suffix == ".npy":
            array = np.load(resolved, mmap_mode="r")
            if not isinstance(array, np.memmap) or array.ndim != 1 or array.dtype.kind not in "iu":
                held = f"{getattr(array, 'dtype', '?')} of shape {getattr(array, 'shape', '?')}"
                raise ArgumentError(argument, f"{resolved} must hold a 1-D integer array (it holds {held})")
            return resolved, array.dtype, int(array.offset), int(array.shape[0])
    except ArgumentError:
        raise
    except OSError as error:
        raise ArgumentError(argument, f"cannot read {resolved}: {error.strerror or error}") from None
    except ValueError as error:  # not a .npy file after all
        raise ArgumentError(argument, f"{resolved} is not a readable .npy file ({error})") from None
    element = _dtype(dtype)
    size = resolved.stat().st_size
    if size % element.itemsize:
        raise ArgumentError(
            argument,
            f"{resolved} is {size} bytes, not a whole number of {element.name} token ids; is data.dataset.dtype right?",
        )
    return resolved, element, 0, size // element.itemsize


def _dtype(name: str) -> np.dtype:
    try:
        element = np.dtype(name)
    except TypeError:
        element = None
    if element is None or element.kind not in "iu":
        raise ArgumentError("dtype", f"{name!r} is not an integer type; use uint16 (nanoGPT's .bin), uint32 or int64")
    return element


def _plan(
    path: str, seq_len: int, vocab_size: int, eval_path: Optional[str], eval_fraction: float, dtype: str
) -> tuple[Window, Window]:
    """Both splits, checked; opens nothing but the files' headers."""
    if seq_len < 1:
        raise ArgumentError("seq_len", f"must be >= 1 (got {seq_len})")
    if vocab_size < 2:
        raise ArgumentError("vocab_size", f"must be >= 2 (got {vocab_size})")
    if eval_path is None and not 0.0 < eval_fraction < 1.0:
        raise ArgumentError("eval_fraction", f"must be in (0, 1) when there is no eval_path (got {eval_fraction})")
    train_file, train_type, train_offset, total = _open(path, dtype, "path")
    window = seq_len + 1
    if eval_path is not None:
        eval_file, eval_type, eval_offset, eval_total = _open(eval_path, dtype, "eval_path")
        _enough("eval_path", eval_file, eval_total, window, "one window")
        _enough("path", train_file, total, window, "one window")
        train = Window(train_file, train_type, train_offset, 0, total)
        held_out = Window(eval_file, eval_type, eval_offset, 0, eval_total)
    else:
        # The eval part is whole windows at the end of the file; it and the train part share no token.
        eval_count = max(int(total * eval_fraction), window)
        _enough("path", train_file, total - eval_count + window, 2 * window, "a train and an eval window")
        train = Window(train_file, train_type, train_offset, 0, total - eval_count)
        held_out = Window(train_file, train_type, train_offset, total - eval_count, eval_count)
    return train, held_out


def _enough(argument: str, file: Path, tokens: int, needed: int, what: str) -> None:
    if tokens < needed:
        raise ArgumentError(argument, f"{file} holds too few tokens for {what} of seq_len + 1 tokens ({needed} needed)")


def preflight(
    path: str,
    seq_len: int = 1024,
    vocab_size: int = 50304,
    eval_path: Optional[str] = None,
    eval_fraction: float = 0.01,
    dtype: str = "uint16",
) -> None:
    """The checks of `token_file` without building anything: run by hpctrain-train and
    hpctrain-submit before any process starts or any job is queued."""
    _plan(path, seq_len, vocab_size, eval_path, eval_fraction, dtype)


def token_file(
    path: str,
    seq_len: int = 1024,
    vocab_size: int = 50304,
    eval_path: Optional[str] = None,
    eval_fraction: float = 0.01,
    dtype: str = "uint16",
) -> Splits:
    """`Splits` of `(x, y)` int64 windows of `seq_len` tokens from a token file, y = x shifted by one.

    Args:
        path: the training tokens: a raw file of `dtype` ids, or a `.npy` 1-D integer array.
            Relative paths are from the directory hpctrain-train / hpctrain-submit ran in (a
            Slurm job runs there too).
        seq_len: tokens per input.
        vocab_size: the tokenizer's vocabulary size; every id must be below it.
        eval_path: held-out tokens in a second file; null: the end of `path` (`eval_fraction`).
        eval_fraction: share of `path`'s tokens held out when there is no `eval_path`.
        dtype: element type of raw files (nanoGPT writes uint16); `.npy` files carry their own.
    """
    from hpctrain.data.splits import Splits
    from hpctrain.data.token_windows import TokenWindows  # torch: only where training runs

    planned = _plan(path, seq_len, vocab_size, eval_path, eval_fraction, dtype)
    train, held_out = (TokenWindows.of(window, seq_len, vocab_size) for window in planned)
    log.debug(
        "token_file %s: %d train / %d eval windows of %d tokens (pid %d)",
        train.path,
        len(train),
        len(held_out),
        seq_len,
        os.getpid(),
    )
    return Splits(train=train, eval=held_out, next_token=True)


token_file.preflight = preflight  # type: ignore[attr-defined]
