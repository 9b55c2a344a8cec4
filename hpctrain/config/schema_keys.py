"""Every key of the schema (hpctrain/config/schema.py), walked once: what the command line's
checks (hpctrain.cli.overrides) and `--help` (hpctrain.cli.help_text) both read."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any

from hpctrain.config.schema import Config


@dataclass(frozen=True)
class SchemaKey:
    key: str  # trainer.max_steps; a section's own name (trainer) too
    field: dataclasses.Field  # type: ignore[type-arg]
    owner: type  # the dataclass that declares it (its comments document it)
    section: bool  # a nested dataclass: its keys follow it
    takes_any_key: bool  # typed as a dict: any name below it goes (slurm.restart_budget.crash)
    scalar: type | None  # int, float or bool (Optional[...] too), else None


@functools.cache
def schema_keys() -> tuple[SchemaKey, ...]:
    """Every key of Config in the schema's order, sections before their keys."""
    return tuple(_walk(Config, ""))


def _walk(cls: type, prefix: str) -> typing.Iterator[SchemaKey]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        name = prefix + field.name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield SchemaKey(name, field, cls, section=True, takes_any_key=False, scalar=None)
            yield from _walk(kind, name + ".")
            continue
        yield SchemaKey(name, field, cls, section=False, takes_any_key=_is_dict(kind), scalar=_scalar(kind))


def _without_none(kind: Any) -> list[Any]:
    return (
        [a for a in typing.get_args(kind) if a is not type(None)] if typing.get_origin(kind) is typing.Union else [kind]
    )


def _scalar(kind: Any) -> type | None:
    options = _without_none(kind)
    return options[0] if len(options) == 1 and options[0] in (int, float, bool) else None


def _is_dict(kind: Any) -> bool:
    return any(typing.get_origin(option) is dict or option is dict for option in _without_none(kind))
