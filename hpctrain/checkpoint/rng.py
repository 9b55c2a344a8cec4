"""Every random number generator a rank draws from, as a weights_only-loadable tree."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def capture() -> dict[str, Any]:
    legacy = np.random.get_state(legacy=True)
    # np.random's global generator is a RandomState (MT19937), whose state is always this tuple.
    assert isinstance(legacy, tuple)
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "cached": cached,
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gathered(ctx: Any) -> list[dict[str, Any]]:
    """Collective. Every rank's RNG states (capture()), indexed by rank, on every rank."""
    mine = capture()
    if not ctx.distributed:
        return [mine]
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    return everyone
