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

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.config import (
    TARGET_NODES,
    Config,
    fits,
    omegaconf_message,
    resolved_plain,
    setup_lines,
    targets,
    to_typed,
)

_ABSENT = object()


class _NotCheap(Exception):
    """This point needs the full check."""


@dataclass
class _Reference:
    """The first point of a structure, fully checked."""

    typed: Config
    plain: dict[str, Any]
    keys: set[str]  # the keys its value overrides set
    dynamic: set[str]  # paths holding an interpolation: their values may follow any other


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
            keys = _value_keys(overrides) | reference.keys
            if any(_overlaps(path, "slurm.setup") for path in keys | reference.dynamic):
                setup_lines.check_interpolations(cfg)  # else its lines are the reference's, checked
            try:
                plain = _patched(reference, cfg, keys)
                return derive(reference, plain), plain
            except _NotCheap:
                pass
        self.full_checks += 1
        typed, resolved = to_typed(cfg, overrides)
        plain = resolved_plain(resolved)
        if structure not in self._references:
            unresolved = OmegaConf.to_container(cfg, resolve=False)
            assert isinstance(unresolved, dict)  # a DictConfig's container is a dict
            unresolved.pop("hydra", None)
            dynamic = set(_interpolated_paths(unresolved))
            self._references[structure] = _Reference(typed, plain, _value_keys(overrides), dynamic)
        return typed, plain


def _value_keys(overrides: Sequence[str]) -> set[str]:
    """The config keys a point's value overrides set (structural ones are the same for every
    point of a structure; hydra.* is not in the job's config)."""
    keys = (line.split("=", 1)[0] for line in overrides)
    return {key for key in keys if not key.startswith(("+", "~", "hydra.")) and "@" not in key}


def _interpolated_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Paths of the values holding a `${...}` (a list holding one counts as a whole)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _interpolated_paths(value, f"{prefix}{key}.")
    elif "${" in str(node):
        yield prefix.rstrip(".")


def _patched(reference: _Reference, cfg: DictConfig, keys: set[str]) -> dict[str, Any]:
    """This point's resolved config: the reference's, with the values that can differ resolved
    again (the keys either point set, and every interpolation). Only the dicts on the way to
    those values are copied; the rest is the reference's own (a deep copy of it all cost more
    than the rest of the check): what this returns is read, never written into."""
    plain = dict(reference.plain)
    copied = {id(plain)}
    for path in sorted(keys | reference.dynamic):  # a parent before its children
        *parents, leaf = path.split(".")
        holder: Any = plain
        for part in parents:
            child = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(child, dict) and id(child) not in copied:
                child = holder[part] = dict(child)
                copied.add(id(child))
            holder = child
        if not isinstance(holder, dict):
            raise _NotCheap
        try:
            value = OmegaConf.select(cfg, path, default=_ABSENT, throw_on_missing=True)
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as error:
            raise ValueError(omegaconf_message(error)) from None
        if value is _ABSENT and leaf not in holder:
            continue  # a group choice (cluster=mysite): no key of the config, the same for the structure
        if value is _ABSENT:
            raise _NotCheap
        holder[leaf] = value
    return plain


def _swaps_target(override: str) -> bool:
    # A new `_target_` may drop arguments of the old one (targets.drop_foreign_arguments).
    return override.split("=", 1)[0].endswith("._target_")


def derive(reference: _Reference, plain: dict[str, Any]) -> Config:
    """The typed Config of `plain`, rebuilt from a checked point of the same structure."""
    changed = list(changed_paths(reference.plain, plain))
    typed = _rebuild(reference.typed, plain, [path.split(".") for path in changed])
    problem = fits.check_values(plain) or fits.check_fit(plain)
    if problem:
        raise ValueError(problem)
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
    if old is new:  # a section `_patched` shared with the reference: nothing to walk
        return
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
    node: Any = typed
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)
    return node
