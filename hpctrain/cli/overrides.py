"""The command line before Hydra sees it: hpctrain's own answers where Hydra's do not help.

- `--version` prints hpctrain's version (Hydra's printed Hydra's).
- `-m`/`--multirun` anywhere on the line (Hydra's parser took `-m` after an override for an
  unknown option and printed its usage).
- A mistyped key gets the closest keys that exist, named by hpctrain, with exit code 2 like every
  other user error (Hydra advised `+optim.lrr=1`, which then failed as well, and exited 1).

Only plain `key=value` overrides are looked at: `+key` and `++key` add keys on purpose (a
constructor argument the config does not set), `group=option` is Hydra's to check (it lists the
options), and `hydra.*` is Hydra's own. The keys are the schema's (hpctrain/config/schema.py)
and, for the `_target_` groups, those of the option the line chooses (or the default one).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

import yaml

from hpctrain import __version__
from hpctrain.config.schema_keys import schema_keys
from hpctrain.run.exitcodes import CLI_USER_ERROR

MULTIRUN_FLAGS = ("-m", "--multirun")
# Config groups whose options are `_target_` nodes: their keys come from the option chosen.
TARGET_GROUPS = ("model", "optim", "sched")


def before_hydra(program: str) -> None:
    """On sys.argv, before `hydra.main` parses it: --version and --help answered (hpctrain's
    groups and keys, hpctrain.cli.help_text), -m moved to the front, a mistyped key refused
    (exit 2) naming the closest keys."""
    argv = sys.argv[1:]
    if "--version" in argv:
        print(version_line(program))
        sys.exit(0)
    if "--help" in argv or "-h" in argv:
        from hpctrain.cli.help_text import render

        try:
            print(render(program), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    sys.argv[1:] = multirun_first(argv)
    wrong = mistyped_key(argv)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        sys.exit(CLI_USER_ERROR)


def version_line(program: str) -> str:
    return f"{program} (hpctrain) {__version__}"


def multirun_first(argv: Sequence[str]) -> list[str]:
    """The arguments with -m/--multirun moved to the front, where Hydra's parser reads it."""
    flags = [a for a in argv if a in MULTIRUN_FLAGS]
    return [*flags[:1], *(a for a in argv if a not in MULTIRUN_FLAGS)]


def mistyped_key(argv: Sequence[str]) -> str | None:
    """The first plain override whose key does not exist, as an error line naming the closest
    keys; None when every key exists."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    groups = _chosen_options(overrides)
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") in _groups():
            unknown = _unknown_option(key.lstrip("+"), value)
            if unknown:
                return unknown
            continue
        if key.startswith(("+", "~", "hydra.", "hydra/")) or "@" in key or key == "hydra" or key in _groups():
            continue
        known, where = _keys_beside(key, groups)
        if known is not None and key in known:
            wrong = _wrong_type(key, value)
            if wrong:
                return wrong
            continue
        if known is None or _under_a_dict(key, known):
            continue
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        added = (
            f" A constructor argument {where} does not set is added with +{override}."
            if key.split(".", 1)[0] in TARGET_GROUPS
            else ""
        )
        return f"{key}: no such key{f' in {where}' if where else ''}{hint}{added}"
    return None


def _unknown_option(group: str, value: str) -> str | None:
    """`model=resnet`: the group has no such option (each of a sweep's options is looked at)."""
    options = sorted(p.name.removesuffix(".yaml") for p in (_conf() / group).iterdir() if p.name.endswith(".yaml"))
    for option in value.split(","):
        if option and option != "null" and option not in options:
            close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
            hint = f"did you mean {group}={close[0]}? " if close else ""
            return f"{group}={option}: no such option; {hint}{group} has {', '.join(options)}"
    return None


def _keys_beside(key: str, groups: dict[str, str]) -> tuple[set[str] | None, str]:
    """The keys a key of this section may be, and how to name the section; (None, _) when the
    key's section takes any key."""
    section = key.split(".", 1)[0]
    if section in TARGET_GROUPS and "." in key:
        option = groups.get(section)
        if option is None:
            return None, ""
        return {f"{section}.{k}" for k in _flat(_option_yaml(section, option))}, f"{section}={option}"
    known = {entry.key for entry in schema_keys()}
    if section in groups:  # a schema section filled from a group (data=tokens): its option's keys too
        known |= {f"{section}.{k}" for k in _flat(_option_yaml(section, groups[section]))}
    return known, ""


def _wrong_type(key: str, value: str) -> str | None:
    """A schema value Hydra could not convert (`data.batch_size=abc`), said as a user error; each
    value of a sweep is looked at. Interpolations and null are left to the config's checks."""
    kind = next((entry.scalar for entry in schema_keys() if entry.key == key), None)
    if kind is None:
        return None
    for item in value.split(","):
        item = item.strip()
        if not item or "${" in item or item == "null":
            continue
        try:
            if kind is bool:
                if item.lower() not in ("true", "false"):
                    raise ValueError(item)
            elif kind is int:
                int(item)
            else:
                float(item)
        except ValueError:
            what = {int: "an integer", float: "a number", bool: "true or false"}[kind]
            return f"{key}={item}: must be {what}"
    return None


def _under_a_dict(key: str, known: set[str]) -> bool:
    """A key below one the schema types as a dict (slurm.restart_budget.crash): any name goes."""
    return any(key.startswith(entry.key + ".") for entry in schema_keys() if entry.takes_any_key and entry.key in known)


def _flat(tree: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield prefix + str(k)
            yield from _flat(v, f"{prefix}{k}.")


def _groups() -> set[str]:
    """The config groups (conf/'s folders: `cluster=devcluster` chooses an option)."""
    return {entry.name for entry in _conf().iterdir() if entry.is_dir() and not entry.name.startswith("_")}


def _conf() -> Any:
    return resources.files("hpctrain.conf")


def _option_yaml(group: str, option: str) -> dict:
    try:
        loaded = yaml.safe_load((_conf() / group / f"{option}.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _chosen_options(overrides: Sequence[str]) -> dict[str, str]:
    """Each group's option (`cluster` aside: it sets keys anywhere): the command line's
    `group=option`, else the default."""
    chosen: dict[str, str] = {}
    try:
        primary = yaml.safe_load((_conf() / "config.yaml").read_text())
        for entry in primary.get("defaults", []):
            if isinstance(entry, dict):
                chosen.update({k: str(v) for k, v in entry.items() if k in _groups() - {"cluster"}})
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    for override in overrides:
        key, _, value = override.partition("=")
        group = key.lstrip("+")
        if group in _groups() - {"cluster"}:
            if "," in value:  # a sweep over options: their keys are not checked
                chosen.pop(group, None)
            else:
                chosen[group] = value
    return chosen
