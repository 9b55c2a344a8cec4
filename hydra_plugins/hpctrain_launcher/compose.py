"""Sweep points' configs, composed once per distinct set of structural overrides.

Hydra composes every sweep point from scratch (about 90 ms each), which made 100 points take
half a minute to submit. Most sweeps change values, not groups: the defaults list, and so the
composition, depends only on group choices, `+`/`~` overrides and `hydra.*` overrides. Those
are composed once per distinct set; each point's value overrides are then applied to that one
config with Hydra's own function, after putting back the values the previous point changed
(a deep copy per point cost more than everything else a point needs).
tests/test_sweep_compose.py checks the result against Hydra's own per-point composition.
"""

import dataclasses
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

# Private Hydra API, pinned by setup.cfg's hydra-core>=1.3,<1.4: Hydra 1.3 has no public way to
# apply value overrides to a composed config, to ask whether a key names a config group (the
# public ConfigLoader hides its repository), or to build override_dirname. What these calls
# produce is checked point by point against Hydra's own composition in tests/test_sweep_compose.py.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

_ABSENT = object()


# `key=number`, the bulk of a sweep's lines, in the forms Hydra's grammar reads as int or float
# (it reads `007` as a string: no leading zeros).
_NUMBER_LINE = re.compile(
    r"^(?P<key>[A-Za-z_][\w.]*)=(?:(?P<int>-?(?:0|[1-9]\d*))"
    r"|(?P<float>-?(?:(?:0|[1-9]\d*)\.\d*|\.\d+)(?:[eE][-+]?\d+)?|-?(?:0|[1-9]\d*)[eE][-+]?\d+))$"
)


def _parse(line: str) -> Override:
    """Hydra's parse of one override line. Its ANTLR parser takes about a millisecond a line, and
    every point of a numeric sweep has a line of its own: `key=number` takes Hydra's parse of
    the key's first such line, with the number read as Hydra reads it."""
    number = _NUMBER_LINE.match(line)
    if number is None:
        return _parse_with_hydra(line)
    value: Any = int(number["int"]) if number["int"] is not None else float(number["float"])
    template = _parse_with_hydra(f"{number['key']}=0")
    return dataclasses.replace(template, _value=value, input_line=line)


@lru_cache(maxsize=4096)
def _parse_with_hydra(line: str) -> Override:
    return OverridesParser.create().parse_overrides([line])[0]


def _structural(override: Override, loader: ConfigLoaderImpl) -> bool:
    return (
        override.is_add()
        or override.is_force_add()
        or override.is_delete()
        or override.is_hydra_override()
        or override.package is not None
        or _is_group(loader, override.key_or_group)
    )


@lru_cache(maxsize=1024)
def _is_group(loader: ConfigLoaderImpl, key: str) -> bool:
    return bool(loader.repository.group_exists(key))


class _Structure:
    """One composed config, shared by every point with the same structural overrides."""

    def __init__(self, config: DictConfig) -> None:
        self.config = config
        self.original: dict[str, Any] = {}  # key -> its composed value (unresolved), or _ABSENT
        self.changed: list[str] = []  # keys the last point set
        # The same for every point of the structure (hydra.* overrides are structural): read once.
        hydra = config.hydra
        self.task = hydra.overrides._get_node("task")
        self.override_dirname = hydra.job._get_node("override_dirname")
        dirname = hydra.job.config.override_dirname
        self.dirname = {"kv_sep": dirname.kv_sep, "item_sep": dirname.item_sep, "exclude_keys": dirname.exclude_keys}

    def apply(self, values: list[Override]) -> None:
        for override in values:
            key = override.key_or_group
            if key not in self.original:
                self.original[key] = _composed_value(self.config, key)
        # A scalar set over a scalar needs no putting back first: it replaces the last point's
        # value as it would the composed one (a dict would be merged into what is there).
        overwritten = {o.key_or_group for o in values if _is_scalar(o.value())}
        for key in self.changed:  # back to the composed config
            original = self.original[key]
            if original is not _ABSENT and not (key in overwritten and _is_scalar(original)):
                OmegaConf.update(self.config, key, original, merge=False)
        self.changed = [o.key_or_group for o in values]
        ConfigLoaderImpl._apply_overrides_to_config(values, self.config)


def _set_lines(task: Any, lines: list[str]) -> None:
    """hydra.overrides.task := lines. A sweep's points mostly have as many lines as the last one:
    each element node then takes its new line (a List[str] element checks it is a string), which
    costs a tenth of making the list anew."""
    if len(task) != len(lines):
        task._set_value(lines)
        return
    for index, line in enumerate(lines):
        task._get_node(index)._set_value(line)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _composed_value(config: DictConfig, key: str) -> Any:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None) if parent_key else config
    if not isinstance(parent, DictConfig) or leaf not in parent:
        return _ABSENT  # Hydra's apply says what is wrong
    values = OmegaConf.to_container(parent, resolve=False)
    assert isinstance(values, dict)  # a DictConfig's container is a dict
    return values[leaf]


def sweep_configs(
    loader: ConfigLoaderImpl, master: DictConfig, job_overrides: Sequence[Sequence[str]]
) -> Iterator[DictConfig]:
    """Each point's config, in order. Points with the same structure get the same object, set
    to that point: use it (or copy it) before asking for the next point."""
    structures: dict[tuple[str, ...], _Structure] = {}
    for overrides in job_overrides:
        parsed = [_parse(line) for line in overrides]
        structural = tuple(str(o.input_line) for o in parsed if _structural(o, loader))
        if structural not in structures:
            structures[structural] = _Structure(loader.load_sweep_config(master, list(structural)))
        structure = structures[structural]
        structure.apply([o for o in parsed if not _structural(o, loader)])
        config = structure.config
        app = [o for o in parsed if not o.is_hydra_override()]
        # Set on the nodes themselves: Hydra's schema types them (List[str], str) and each checks
        # its value as an assignment through the config would, for a fraction of the cost.
        _set_lines(structure.task, [str(o.input_line) for o in app])
        structure.override_dirname._set_value(get_overrides_dirname(overrides=app, **structure.dirname))  # type: ignore[union-attr]
        yield config
