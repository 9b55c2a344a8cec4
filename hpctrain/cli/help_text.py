"""`--help` of hpctrain-train, -submit and -tune: hpctrain's config groups and every key of the
schema with its default and its one-line doc, read from the schema itself (the comment above
each field in hpctrain/config/schema.py and the section modules it imports), so the help can
never say what the schema does not.
Hydra's own help stays at `--hydra-help`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterator
from importlib import resources
from typing import Any

import yaml

from hpctrain.config.schema_keys import schema_keys


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str  # trainer.max_steps
    default: str  # as it would be written on the command line
    doc: str  # the first sentence of the comment above the field
    comment: str = ""  # the whole comment (the config reference in docs/ shows it)


def key_docs() -> Iterator[KeyDoc]:
    """Every leaf key of the schema, in the schema's order, with its default and doc."""
    for entry in schema_keys():
        if not entry.section:
            comment = _comments_above_fields(entry.owner).get(entry.field.name, "")
            yield KeyDoc(entry.key, _default(entry.field), _first_sentence(comment), comment)


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value: Any = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(from its group)"
    if value is None:
        return "null"
    if value == "???":  # OmegaConf's MISSING: the group's option sets it
        return "from its group"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if value == "" else value
    return str(value) if not isinstance(value, (dict, list)) else yaml.safe_dump(value, default_flow_style=True).strip()


@functools.cache
def _comments_above_fields(cls: type) -> dict[str, str]:
    """field name -> the comment lines right above it, joined."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        name = text.split(":", 1)[0].strip()
        if ":" in text and name.isidentifier() and not text.startswith(("def ", "class ", "@")):
            docs.setdefault(name, " ".join(pending))
        pending = []
    return docs


def _first_sentence(text: str) -> str:
    return text.split(". ", 1)[0] + "." if ". " in text else text


def groups(argv: list[str] | None = None) -> dict[str, tuple[list[str], str | None]]:
    """group -> (its options, the default one); with `argv`, the user's own folders' options too
    (`--config-dir`, `hydra.searchpath`: hpctrain.cli.overrides.config_dirs)."""
    from hpctrain.cli.overrides import ConfigDirs, config_dirs

    conf = resources.files("hpctrain.conf")
    primary = yaml.safe_load((conf / "config.yaml").read_text())
    defaults: dict[str, str] = {}
    for entry in primary.get("defaults", []):
        if isinstance(entry, dict):
            defaults.update({str(k): str(v) for k, v in entry.items()})
    dirs = config_dirs(argv or []) or ConfigDirs([])
    return {group: (dirs.options(group), defaults.get(group)) for group in sorted(dirs.groups())}


def render(program: str, argv: list[str] | None = None) -> str:
    """`--help`: how to call `program`, its groups and keys; with `group=option` (or
    `--config-dir`) on the line, that option's own keys too."""
    lines = [f"usage: {program} [-m] [--config-dir DIR] [group=option ...] [key=value ...]"]
    if program == "hpctrain-submit":
        lines.append(f"       {program} --retry SWEEP_DIR|RUN_DIR [POINT ...] [--dry-run]")
    lines += [
        "",
        "Hydra overrides: `key=value` sets a key, `+key=value` adds one a `_target_` takes, `-m` sweeps",
        "comma-separated values. hydra.run.dir=DIR names the run dir (default runs/<date>/<time>-<token>),",
        "hydra.sweep.dir=DIR a sweep's folder; --config-dir DIR adds your own options (DIR/model/mynet.yaml).",
        "--version: hpctrain's version; --hydra-help: Hydra's own options.",
    ]
    if program == "hpctrain-submit":
        lines += [
            "--retry SWEEP_DIR [POINT ...]: queue again the points (or a run dir) that did not finish, each",
            "resuming from its newest checkpoint; --dry-run says which without queueing.",
        ]
    lines += ["", "Config groups (group=option; the default in brackets):"]
    for group, (options, default) in groups(argv).items():
        shown = ", ".join(f"[{o}]" if o == default else o for o in options)
        lines.append(f"  {group}: {shown}")
    lines += [
        "",
        "model, optim, sched: the arguments of the option's `_target_` (model.hidden=256, optim.lr=3e-4).",
        "",
    ]
    lines += _chosen_keys(argv or [])
    lines.append("Keys (key=value; the default in brackets):")
    for doc in key_docs():
        lines.append(f"  {doc.key} [{doc.default}]: {doc.doc}" if doc.doc else f"  {doc.key} [{doc.default}]")
    return "\n".join(lines)


def _chosen_keys(argv: list[str]) -> list[str]:
    """The keys of each `_target_` group's option, the chosen one (`model=gpt`) or the default."""
    from hpctrain.cli.overrides import TARGET_GROUPS, chosen_options, config_dirs

    dirs = config_dirs(argv)
    if dirs is None:
        return []
    chosen = chosen_options([a for a in argv if "=" in a and not a.startswith("-")], dirs)
    lines: list[str] = []
    for group in TARGET_GROUPS:
        option = chosen.get(group)
        if option is None:
            continue
        values = {k: v for k, v in dirs.option_yaml(group, option).items() if k != "defaults"}
        if not values:
            continue
        lines.append(f"Keys of {group}={option} ({group}.KEY=value; its value in brackets):")
        lines += [f"  {group}.{key} [{value}]" for key, value in values.items()]
        lines.append("")
    return lines
