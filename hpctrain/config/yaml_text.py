"""config.yaml's text, written section by section with the text of unchanged sections reused.

Dumping a whole config costs about a millisecond (PyYAML's representer is Python even with
libyaml's emitter); a sweep writes one config.yaml per point, and its points differ in a section
or two. A block-style mapping at the top level is the concatenation of its keys' own dumps (no
state crosses from one top-level key to the next), so each `key: value` is dumped on its own and
remembered by the exact value (types included: `1`, `1.0` and `true` differ). Values PyYAML
would tie together with anchors (one object under two keys) get one dump of the whole, as before.
tests/test_sweep_speed.py compares the text with a plain dump for every config it checks.
"""

from __future__ import annotations

from typing import Any

import yaml
from omegaconf._utils import OmegaConfDumper


class _YamlDumper(getattr(yaml, "CDumper", yaml.Dumper)):  # type: ignore[misc]
    """OmegaConf.to_yaml's dumper (strings that read as numbers or booleans quoted), with
    libyaml's emitter when present: the same text, about 3x faster for a sweep's many points."""


_YamlDumper.add_representer(str, OmegaConfDumper.str_representer)

_MEMO_SIZE = 512  # sections remembered; a sweep varies a few, so this is never reached in practice
_memo: dict[Any, str] = {}
dumps = 0  # how many dumps were made (the memo's hits make none): tests count them


class _Unkeyable(Exception):
    """A value that cannot be keyed exactly: dump it whole."""


def dump(tree: Any) -> str:
    """PyYAML's block-style text of plain dicts, lists and scalars, as config.yaml holds it."""
    global dumps
    dumps += 1
    return yaml.dump(tree, Dumper=_YamlDumper, default_flow_style=False, allow_unicode=True, sort_keys=False)


def dump_mapping(tree: dict[Any, Any]) -> str:
    """`dump(tree)`, reusing the text of top-level sections dumped before with the same value."""
    try:
        seen: set[int] = set()
        keys = [(_key(key), _key(value, seen)) for key, value in tree.items()]
    except _Unkeyable:
        return dump(tree)
    if not keys:
        return dump(tree)  # `{}`
    parts = []
    for (key, value), item in zip(keys, tree.items()):
        text = _memo.get((key, value))
        if text is None:
            if len(_memo) >= _MEMO_SIZE:
                _memo.clear()
            text = _memo[key, value] = dump(dict([item]))
        parts.append(text)
    return "".join(parts)


def _key(value: Any, seen: set[int] | None = None) -> Any:
    """A hashable key equal only for values PyYAML writes the same way: the type is part of
    it (True == 1 == 1.0 in Python), floats by repr (-0.0 == 0.0). A dict or list met twice
    raises (PyYAML would write an anchor and an alias)."""
    kind = type(value)
    if kind is dict or kind is list:
        if seen is not None:
            if id(value) in seen:
                raise _Unkeyable
            seen.add(id(value))
        if kind is dict:
            return (dict, tuple((_key(k), _key(v, seen)) for k, v in value.items()))
        return (list, tuple(_key(v, seen) for v in value))
    if kind is float:
        return (float, repr(value))
    if kind in (str, int, bool) or value is None:
        return (kind, value)
    raise _Unkeyable  # anything else (an Enum, a tuple, ...) is rare: no memo
