"""Sweep points checked by what they change: one full check per structure, then cheap ones.

`to_typed` costs tens of milliseconds a point, most of it OmegaConf's structured merge and
`to_object` of the whole schema. The points of a sweep that share their structure (the same
group choices) differ only in a few values, and those values were already type-checked and
converted when Hydra applied them to the structured config. So the first point of a structure
gets the full check, and every later one starts from its typed Config and rebuilds only the
sections whose resolved values differ (`dataclasses.replace`, which runs their `__post_init__`
value checks again), then checks again the `_target_` nodes they touch. Anything this cannot
rebuild exactly (a `_target_` swapped, a section appearing or vanishing) gets the full check.
tests/test_sweep_speed.py checks both ways agree, for good points and bad ones.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from hpctrain.config import TARGET_NODES, Config, resolved_plain, setup_lines, targets, to_typed


class _NotCheap(Exception):
    """This point needs the full check."""


@dataclass
class _Reference:
    typed: Config
    plain: dict[str, Any]


class PointChecker:
    """Typed, checked configs for a sweep's points; one per sweep."""

    def __init__(self) -> None:
        self._references: dict[object, _Reference] = {}
        self.full_checks = 0  # how many points needed `to_typed` (the rest: cheap checks)

    def check(self, cfg: DictConfig, overrides: Sequence[str], structure: object) -> tuple[Config, dict[str, Any]]:
        """(typed Config, resolved plain config) of one point, as `to_typed` gives them.
        `structure` names the point's structure (its structural overrides). ValueError naming
        the key to change."""
        reference = self._references.get(structure)
        if reference is not None and not any(_swaps_target(o) for o in overrides):
            setup_lines.check_interpolations(cfg)
            plain = resolved_plain(cfg)
            try:
                return derive(reference, plain), plain
            except _NotCheap:
                pass
        self.full_checks += 1
        typed, resolved = to_typed(cfg, overrides)
        plain = resolved_plain(resolved)
        self._references.setdefault(structure, _Reference(typed, plain))
        return typed, plain


def _swaps_target(override: str) -> bool:
    # A new `_target_` may drop arguments of the old one (targets.drop_foreign_arguments).
    return override.split("=", 1)[0].endswith("._target_")


def derive(reference: _Reference, plain: dict[str, Any]) -> Config:
    """The typed Config of `plain`, rebuilt from a checked point of the same structure."""
    changed = list(changed_paths(reference.plain, plain))
    typed = _rebuild(reference.typed, plain, [path.split(".") for path in changed])
    for key, positional, injected in TARGET_NODES:
        if any(_overlaps(path, key) for path in changed):
            node = _node(typed, key)
            if node is not None:
                targets.check(node, key, positional, injected)
                targets.preflight(node, key)
    assert isinstance(typed, Config)
    return typed


def changed_paths(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the leaves (or lists, or whole sections) that differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            if key not in old or key not in new:
                yield f"{prefix}{key}"
            else:
                yield from changed_paths(old[key], new[key], f"{prefix}{key}.")
    elif old != new or type(old) is not type(new):
        yield prefix.rstrip(".")


def _rebuild(typed: Any, plain: dict[str, Any], paths: list[list[str]]) -> Any:
    """`typed` with the values at `paths` taken from `plain`; dataclasses are replaced (their
    checks run again), any other field gets a copy of its plain value."""
    if not paths:
        return typed
    by_field: dict[str, list[list[str]]] = {}
    for path in paths:
        by_field.setdefault(path[0], []).append(path[1:])
    updates = {}
    for name, rests in by_field.items():
        if not hasattr(typed, name) or name not in plain:
            raise _NotCheap
        old, new = getattr(typed, name), plain[name]
        if dataclasses.is_dataclass(old):
            if not isinstance(new, dict) or not all(rests):
                raise _NotCheap  # a whole section replaced
            updates[name] = _rebuild(old, new, rests)
        elif old is None and isinstance(new, dict):
            raise _NotCheap  # could be an Optional dataclass appearing
        else:
            updates[name] = copy.deepcopy(new)
    return dataclasses.replace(typed, **updates)


def _overlaps(path: str, key: str) -> bool:
    return path == key or path.startswith(key + ".") or key.startswith(path + ".")


def _node(typed: Config, dotted: str) -> Any:
    for part in dotted.split("."):
        typed = getattr(typed, part) if not isinstance(typed, dict) else typed.get(part)
    return typed
