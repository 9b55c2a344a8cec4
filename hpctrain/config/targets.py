"""Check and build the `_target_` nodes of a config (model, dataset, optimizer, ...).

Hydra's `instantiate` only fails when the object is built, which for a model is inside every
training process. Binding the node's keys to the target's signature here catches a misspelled
or unknown argument on the login node, with the key named, before anything starts.

A target may also carry a `preflight` function taking the same keyword arguments: it is called
at the same moment and checks what a signature cannot (that a dataset's files exist), raising
hpctrain.errors.ArgumentError. It must be cheap: it runs for every point of a sweep.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import hydra.utils
from hydra.errors import InstantiationException

from hpctrain.config import signatures
from hpctrain.errors import ArgumentError, UserError

log = logging.getLogger(__name__)

# Keys of a `_target_` node that Hydra reads itself instead of passing on.
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")


def locate(node: Mapping[str, Any], key: str) -> Callable[..., Any]:
    """The callable a `_target_` node names, imported, or a ValueError naming the key to fix."""
    target = _target(node, key)
    try:
        obj = signatures.load(target)
    except Exception as error:  # ImportError, AttributeError, ... all mean "cannot find it"
        raise ValueError(f"{key}._target_: cannot import {target!r} ({error})") from None
    if not callable(obj):
        raise ValueError(f"{key}._target_: {target!r} is not callable")
    return obj


def _described(node: Mapping[str, Any], key: str) -> signatures.Description:
    """What `locate` checks and the checks read, without importing the target when the cache
    of hpctrain.config.signatures knows it; the same ValueError as `locate`."""
    target = _target(node, key)
    try:
        description = signatures.describe(target)
    except Exception as error:  # ImportError, AttributeError, ... all mean "cannot find it"
        raise ValueError(f"{key}._target_: cannot import {target!r} ({error})") from None
    if not description.callable:
        raise ValueError(f"{key}._target_: {target!r} is not callable")
    return description


def _target(node: Mapping[str, Any], key: str) -> str:
    target = node.get("_target_") if isinstance(node, Mapping) else None
    if not isinstance(target, str) or not target:
        raise ValueError(f"{key}._target_: missing; set {key}._target_=package.module.Callable")
    return target


def _takes_any_keyword(sig: inspect.Signature) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def arguments(node: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in _HYDRA_KEYS}


def check(node: Mapping[str, Any], key: str, positional: int = 0, injected: Sequence[str] = ()) -> None:
    """Raise ValueError unless the target accepts the node's keys (plus `positional` leading
    arguments and the `injected` keywords hpctrain supplies itself)."""
    sig = _described(node, key).signature
    if sig is None:
        return
    kwargs = arguments(node)
    accepted = [name for name in sig.parameters if name != "self"]
    if not _takes_any_keyword(sig):
        unknown = [name for name in kwargs if name not in sig.parameters]
        if unknown:
            close = difflib.get_close_matches(unknown[0], accepted, n=1, cutoff=0.6)
            meant = f"did you mean {key}.{close[0]}? " if close else ""
            raise ValueError(
                f"{key}.{unknown[0]}: {node['_target_']} takes no argument {unknown[0]!r} "
                f"(it takes: {', '.join(accepted)}); {meant}remove it with ~{key}.{unknown[0]}"
            )
    supplied = {name: None for name in injected if name in sig.parameters}
    try:
        sig.bind(*([None] * positional), **{**kwargs, **supplied})
    except TypeError as error:
        raise ValueError(f"{key}: {node['_target_']} cannot be called with these arguments: {error}") from None


def preflight(node: Mapping[str, Any], key: str) -> None:
    """Run the target's `preflight` hook, if it has one; ValueError naming `key.argument`."""
    if not _described(node, key).preflight:
        return
    hook = locate(node, key).preflight  # type: ignore[attr-defined]
    try:
        hook(**arguments(node))
    except ArgumentError as error:
        raise ValueError(f"{key}.{error.argument}: {error.message}") from None


def first_parameter(node: Mapping[str, Any], key: str) -> str | None:
    """The name of the target's first parameter (None: no signature to read)."""
    sig = _described(node, key).signature
    if sig is None:
        return None
    names = [name for name in sig.parameters if name != "self"]
    return names[0] if names else None


def accepts(node: Mapping[str, Any], name: str) -> bool:
    sig = _described(node, "_target_").signature
    return sig is not None and (name in sig.parameters or _takes_any_keyword(sig))


def drop_foreign_arguments(node: dict[str, Any], key: str, overridden: set[str]) -> list[str]:
    """After `key._target_` was overridden, drop the arguments the group's old target had
    that the new one does not name as a parameter (the way LightningCLI treats a new
    class_path), except those the user set on the command line. A target taking `**kwargs`
    (timm.create_model, a Hugging Face `from_config`) would take them all and fail on one it
    never heard of (`in_channels` for timm's `in_chans`): only the names in its signature are
    kept (a subclass of the group's model keeps them all). Returns the dropped names."""
    sig = _described(node, key).signature
    if sig is None:
        return []
    named = {name for name, p in sig.parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    dropped = [name for name in arguments(node) if name not in named and f"{key}.{name}" not in overridden]
    for name in dropped:
        del node[name]
    if dropped:
        log.warning("%s._target_=%s: dropped arguments it does not take: %s", key, node["_target_"], ", ".join(dropped))
    return dropped


def build(node: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    """Instantiate a checked `_target_` node, passing hpctrain's own arguments through.

    hpctrain's own models and datasets refuse a bad argument with a ValueError, a user's code
    with hpctrain.errors.UserError: either becomes a UserError naming the target, told without a
    traceback. Any other error of a user's code keeps its traceback."""
    try:
        return hydra.utils.instantiate(dict(node), *args, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause, target = error.__cause__, str(node.get("_target_"))
        if isinstance(cause, UserError) or (isinstance(cause, ValueError) and target.startswith("hpctrain.")):
            raise UserError(f"{target}: {cause}") from cause
        raise
