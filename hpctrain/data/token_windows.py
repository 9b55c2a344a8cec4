"""The torch side of a token file (hpctrain.data.token_file): its windows as a Dataset, imported
only where training runs, so the checks before a submit never import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from hpctrain.data.token_file import Window


class TokenWindows(Dataset):
    """`(input, target)` int64 windows of `seq_len` tokens over `count` tokens of a file from
    token `start` on. The file is opened lazily in each process (a memmap does not pickle
    cheaply into DataLoader workers)."""

    def __init__(
        self, path: Path, dtype: np.dtype, offset: int, start: int, count: int, seq_len: int, vocab_size: int
    ) -> None:
        self.path, self.dtype, self.offset = path, dtype, offset
        self.start, self.count, self.seq_len, self.vocab_size = start, count, seq_len, vocab_size
        self._tokens: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return max(0, (self.count - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of {len(self)}")
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset)
        first = self.start + index * self.seq_len
        window = np.array(self._tokens[first : first + self.seq_len + 1], dtype=np.int64)
        if window.min() < 0 or window.max() >= self.vocab_size:
            # An embedding lookup would fail far from here (on a GPU, as a device-side assert).
            bad = int(window[(window < 0) | (window >= self.vocab_size)][0])
            raise ValueError(
                f"{self.path}: token id {bad} near token {first} is outside the vocabulary of "
                f"data.dataset.vocab_size={self.vocab_size}; set it to the tokenizer's vocabulary size"
            )
        tokens = torch.from_numpy(window)
        return tokens[:-1], tokens[1:]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}

    @classmethod
    def of(cls, window: Window, seq_len: int, vocab_size: int) -> TokenWindows:
        return cls(window.path, window.dtype, window.offset, window.start, window.count, seq_len, vocab_size)
