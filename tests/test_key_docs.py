"""Every config key documented where users look: `--help` (from the schema's own comments) and
the README, checked by walking the schema."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

from hpctrain.cli.help_text import key_docs
from hpctrain.config.schema import Config

README = Path(__file__).resolve().parents[1] / "README.md"


def schema_leaves(cls: type = Config, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from schema_leaves(kind, f"{prefix}{field.name}.")
        else:
            yield prefix + field.name


def test_help_lists_every_key_with_its_doc() -> None:
    docs = {doc.key: doc for doc in key_docs()}
    assert set(docs) == set(schema_leaves())
    undocumented = [key for key, doc in docs.items() if len(doc.doc) < 10]
    assert not undocumented, f"no comment above these fields in the schema: {undocumented}"
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "hpctrain-train"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    for key, doc in docs.items():
        assert f"  {key} [{doc.default}]: {doc.doc}" in shown.stdout, key
    assert "  optim: [adamw], sgd" in shown.stdout and "  model: [convnet], gpt, mlp" in shown.stdout


def test_the_readme_names_every_key() -> None:
    text = README.read_text()
    missing = [key for key in schema_leaves() if f"`{key}" not in text]
    assert not missing, f"keys the README never names: {missing}"
