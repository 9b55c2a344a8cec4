"""The base of every record of events.jsonl (hpctrain.run.events lists them all): the life that
wrote it, the fields it does not know, and the words of hpctrain.run.causes held as their enums."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hpctrain.run.causes import Word


@dataclass(frozen=True)
class Event:
    name: ClassVar[str] = ""
    # Fields written even when None (null: hpctrain-train has no job); others only when known.
    always: ClassVar[tuple[str, ...]] = ("job_id",)
    time: float = 0.0
    job_id: str | None = None  # the life's job as Slurm names it, `36_7` in an array (None: no Slurm job)
    restart: int | None = None  # SLURM_RESTART_COUNT of the life that wrote it
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # A cause or reason given as its word (a journal line, a caller's string) is held as its enum.
        for name, kind in word_fields(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, str) and not isinstance(value, kind):
                object.__setattr__(self, name, kind.read(value))

    def to_record(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        always = self.written_when_none()
        kept = {k: v for k, v in fields.items() if v is not None or k in always}
        record = {"event": self.name, **kept, **self.extra}
        return {k: (v.value if isinstance(v, Word) else v) for k, v in record.items()}

    def written_when_none(self) -> tuple[str, ...]:
        return self.always


_WORD_FIELDS: dict[type, dict[str, type[Word]]] = {}


def word_fields(cls: type[Event]) -> dict[str, type[Word]]:
    """The fields of `cls` typed as a word of hpctrain.run.causes, with their enum (read from its
    annotations once per class)."""
    if cls not in _WORD_FIELDS:
        hints = typing.get_type_hints(cls)
        _WORD_FIELDS[cls] = {
            f.name: kind
            for f in dataclasses.fields(cls)
            for kind in (hints[f.name], *typing.get_args(hints[f.name]))
            if isinstance(kind, type) and issubclass(kind, Word)
        }
    return _WORD_FIELDS[cls]
