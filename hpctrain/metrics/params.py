"""A resolved config as flat MLflow params: `optim.lr` -> "0.001", one per leaf."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# MLflow refuses longer values (6000 characters since MLflow 2.x); config.yaml keeps the whole.
MAX_VALUE_CHARS = 6000


def flatten(config: Any) -> dict[str, str]:
    """Dotted keys of a Config (or a plain dict) to MLflow param strings."""
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    tree = dataclasses.asdict(config) if is_instance else config
    flat: dict[str, str] = {}
    _walk(tree, "", flat)
    return flat


def _walk(node: Any, prefix: str, flat: dict[str, str]) -> None:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            _walk(value, f"{prefix}{key}.", flat)
        return
    key = prefix.rstrip(".")
    # Lists and empty dicts as JSON, so `slurm.setup` reads as the list it is.
    text = json.dumps(node) if isinstance(node, (list, dict)) else str(node)
    flat[key] = text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."
