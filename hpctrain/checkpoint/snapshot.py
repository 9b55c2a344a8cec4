"""Copy a state tree (nested dicts/lists of tensors and plain values) into reusable CPU buffers.

Training may go on the moment the copy is done: the background write reads the buffers, never
the live tensors. Buffers are allocated on the first snapshot and reused afterwards (pinned when
CUDA is present, so device-to-host copies are fast and asynchronous), which is what keeps the
blocking part of a save close to a plain memory copy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class Snapshotter:
    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        # Within one snapshot: the buffer already holding a tensor seen under another path. Tied
        # weights (a GPT's embedding and head) appear twice in a state_dict but are one tensor:
        # copied once, written once, and still one tensor when loaded.
        self._seen: dict[tuple[Any, ...], torch.Tensor] = {}

    def take(self, tree: Any) -> Any:
        self._seen = {}
        try:
            copied = self._copy(tree, "")
        finally:
            self._seen = {}
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non_blocking device-to-host copies must land first
        return copied

    def _copy(self, node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            return self._copy_tensor(node, path)
        if isinstance(node, dict):
            return {key: self._copy(value, f"{path}/{key}") for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            items = [self._copy(value, f"{path}/{i}") for i, value in enumerate(node)]
            return type(node)(items) if isinstance(node, list) else tuple(items)
        return copy.deepcopy(node)

    def _copy_tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        tensor = tensor.detach()
        identity = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if tensor.numel() > 0 and identity in self._seen:
            return self._seen[identity]
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=torch.cuda.is_available())
            self._buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        self._seen[identity] = buffer
        return buffer


def distinct_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in a state tree once: a tied weight (a GPT's embedding and head) appears
    twice in its state_dict but is one tensor, written once."""
    found: dict[tuple[Any, ...], torch.Tensor] = {}

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            key = (node.device, node.untyped_storage().data_ptr(), node.storage_offset(), tuple(node.shape))
            found.setdefault(key, node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    return list(found.values())


def state_bytes(tree: Any) -> int:
    """The bytes of every distinct tensor in a state tree (a tied weight counts once)."""
    return sum(t.numel() * t.element_size() for t in distinct_tensors(tree))
