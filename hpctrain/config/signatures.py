"""What the config checks need of a `_target_`, remembered between commands so no import is needed.

Checking a `_target_` node needs its target's signature, and reading a signature meant importing
the target's module: torch for `torch.optim.AdamW` and for hpctrain's own models, more than a
second of every hpctrain-submit on a login node (most of a sweep's start-up). So what a check
reads (callable or not, the parameters' names and kinds and whether they have a default, whether
there is a `preflight` hook) is written to a cache file beside the source files it came from,
each with its modification time (ns) and size. A later command takes an entry only while every
one of those files is unchanged and the top-level package is still found where it was; anything
else imports the target as before and writes the entry again. The files are the modules along
the target's dotted path, the module defining it, and those of its classes' bases and metaclass.

A target with a `preflight` hook is always imported: the hook runs code. A job, which imports the
code snapshot of its run dir, reads the cache but never writes it: its entries would name the
snapshot's copy, the user's next command from their own checkout would find them stale and write
them back, and every command after a job ran would import torch again. Set
HPCTRAIN_TARGET_CACHE=off to import every target every time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra.utils

from hpctrain.run.paths import in_code_snapshot

log = logging.getLogger(__name__)

FORMAT = 1  # of an entry; a new format ignores the old entries
_ENV = "HPCTRAIN_TARGET_CACHE"  # `off`: no cache; a folder: the cache's folder
imports = 0  # how many targets this process imported to describe them (tests count them)


@dataclass(frozen=True)
class Description:
    """What the checks of hpctrain.config.targets read from a target."""

    callable: bool
    signature: inspect.Signature | None  # None: not introspectable (some builtins)
    preflight: bool  # it has a callable `preflight` hook


@functools.lru_cache(maxsize=256)
def describe(target: str) -> Description:
    """The description of `target` (`package.module.Callable`): from the cache while its sources
    are unchanged, else by importing it (which raises what the import raises)."""
    global imports
    store = _store()
    if store is not None:
        entry = _read(store).get(target)
        description = _from_entry(entry) if entry is not None else None
        if description is not None:
            return description
    imports += 1
    obj = hydra.utils.get_object(target)
    description = _describe(obj)
    if store is not None:
        entry = _entry(target, obj, description)
        if entry is not None:
            _write(store, target, entry)
    return description


def load(target: str) -> Any:
    """The object `target` names, imported (for a preflight hook, or to build it)."""
    return _load(target)


@functools.lru_cache(maxsize=256)
def _load(target: str) -> Any:
    return hydra.utils.get_object(target)


def _describe(obj: Any) -> Description:
    try:
        signature: inspect.Signature | None = inspect.signature(obj)
    except (TypeError, ValueError):  # some builtins have no introspectable signature
        signature = None
    return Description(callable(obj), signature, callable(getattr(obj, "preflight", None)))


# --- the cache file ---------------------------------------------------------------------------


def _store() -> Path | None:
    """One file per Python environment (an entry's files belong to one installation)."""
    setting = os.environ.get(_ENV, "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    folder = Path(setting) if setting else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpctrain"
    python = hashlib.sha256(f"{sys.prefix}\n{sys.version}".encode()).hexdigest()[:12]
    return folder / f"targets-{python}.json"


def _read(store: Path) -> dict[str, Any]:
    try:
        entries = json.loads(store.read_text())
    except (OSError, ValueError):  # none yet, unreadable, or torn: it is only a cache
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(store: Path, target: str, entry: dict[str, Any]) -> None:
    """Add one entry; written to a temporary file then renamed, so that commands running at the
    same time never read half a file (one of them may lose its entry: it is written next time)."""
    entries = _read(store)
    entries[target] = entry
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=store.parent, prefix=store.name, delete=False) as tmp:
            json.dump(entries, tmp)
        os.replace(tmp.name, store)
    except OSError as error:  # a read-only home: every command imports its targets, as before
        log.debug("cannot write the target cache %s: %s", store, error)


def _entry(target: str, obj: Any, description: Description) -> dict[str, Any] | None:
    """The cache entry of an imported target, or None when it cannot be checked later: a hook
    to run, a module without a file, a signature that cannot be written down."""
    if description.preflight:
        return None
    files = _source_files(target, obj)
    top = _top_location(target.split(".", 1)[0])
    if files is None or top is None or any(in_code_snapshot(location) for location in top[1:]):
        return None  # see the module's docstring for a snapshot's copy
    parameters = None
    if description.signature is not None:
        parameters = [
            [p.name, int(p.kind), p.default is not p.empty] for p in description.signature.parameters.values()
        ]
    stamps = {}
    for file in sorted(files):
        stamp = _stamp(file)
        if stamp is None:
            return None
        stamps[file] = stamp
    return {"format": FORMAT, "callable": description.callable, "parameters": parameters, "top": top, "files": stamps}


def _from_entry(entry: Any) -> Description | None:
    """The entry's description, or None when it is stale or not one this version wrote."""
    try:
        if entry["format"] != FORMAT or _top_location(entry["top"][0]) != entry["top"]:
            return None
        if any(_stamp(file) != stamp for file, stamp in entry["files"].items()):
            return None
        signature = None
        if entry["parameters"] is not None:
            signature = inspect.Signature(
                [
                    inspect.Parameter(name, _KINDS[kind], default=None if has_default else inspect.Parameter.empty)
                    for name, kind, has_default in entry["parameters"]
                ]
            )
        return Description(bool(entry["callable"]), signature, False)
    except (KeyError, TypeError, ValueError):  # an entry of another shape: describe it again
        return None


# A parameter's kind as the cache writes it (int(kind)); bind() needs only names, kinds and
# whether a default exists, and its messages name nothing else.
_KINDS = {
    int(kind): kind
    for kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.VAR_KEYWORD,
    )
}


def _stamp(file: str) -> list[int] | None:
    try:
        status = os.stat(file)
    except OSError:
        return None
    return [status.st_mtime_ns, status.st_size]


@functools.lru_cache(maxsize=64)
def _top_location(top: str) -> list[str] | None:
    """Where the top-level package (or module) is found now, without importing it: a folder on
    sys.path earlier than before (another version, a checkout) must not be hidden by the cache."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    # As strings: a package's own __spec__ once imported may hold Path objects (Hugging Face's
    # lazy `transformers` module does), which the cache's JSON cannot hold.
    locations = [str(location) for location in spec.submodule_search_locations or []] or [str(spec.origin)]
    return [top, *locations]


def _source_files(target: str, obj: Any) -> set[str] | None:
    """The files whose content decides what `describe` says of `obj`: the modules along the
    target's path, and the modules defining it, what it wraps, its bases and its metaclass.
    None when one of them has no file (it could change unseen)."""
    parts = target.split(".")
    names = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    things = [obj, inspect.unwrap(obj) if callable(obj) else obj, type(obj), *getattr(obj, "__mro__", ())]
    names |= {getattr(thing, "__module__", None) or "" for thing in things}
    files = set()
    for name in names:
        module = sys.modules.get(name)
        if module is None:
            continue  # not a module: an attribute along the path
        file = getattr(module, "__file__", None)
        if file:
            files.add(str(Path(file).resolve()))
        elif name not in sys.builtin_module_names and not hasattr(module, "__path__"):
            return None  # a module without a file: nothing to compare
    return files
