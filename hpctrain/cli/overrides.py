"""The command line before Hydra sees it: hpctrain's own answers where Hydra's do not help.

- `--version` prints hpctrain's version (Hydra's printed Hydra's).
- `-m`/`--multirun` anywhere on the line (Hydra's parser took `-m` after an override for an
  unknown option and printed its usage).
- A mistyped key gets the closest keys that exist, named by hpctrain, with exit code 2 like every
  other user error (Hydra advised `+optim.lrr=1`, which then failed as well, and exited 1).

Only plain `key=value` overrides are looked at: `+key` and `++key` add keys on purpose (a
constructor argument the config does not set), and `hydra.*` is Hydra's own. The keys are the
schema's (hpctrain/config/schema.py) and, for the `_target_` groups, those of the option the line
chooses (or the default one). Options are looked for where Hydra looks: hpctrain's own configs,
then the user's folders (`--config-dir DIR`, `hydra.searchpath=[file://DIR]`), so a user's
`model=mynet` or `cluster=mysite` is checked like a built-in one, and its own keys are plain
`model.hidden=64` overrides. A command line naming another primary config (`--config-name`,
`--config-path`) is left to Hydra whole.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
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
            print(render(program, argv), flush=True)
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
    dirs = config_dirs(argv)
    if dirs is None:
        return None
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    groups = chosen_options(overrides, dirs)
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") in dirs.groups():
            unknown = _unknown_option(key.lstrip("+"), value, dirs)
            if unknown:
                return unknown
            continue
        if key.startswith(("+", "~", "hydra.", "hydra/")) or "@" in key or key == "hydra" or key in dirs.groups():
            continue
        known, where = _keys_beside(key, groups, dirs)
        if known is not None and key in known:
            wrong = _wrong_type(key, value)
            if wrong:
                return wrong
            continue
        if known is None or _under_a_dict(key, known):
            continue
        group = key.split(".", 1)[0]
        target = _target_set(overrides, group)
        if target is not None and group in TARGET_GROUPS:
            # The group's keys are the old model's: close ones would mislead. The new class's own
            # arguments are checked against its signature once added (hpctrain.config.targets).
            return (
                f"{key}: no such key in {where}, whose class this line replaces with {target}: an "
                f"argument of {target} is added with +{override}"
            )
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        added = (
            f" A constructor argument {where} does not set is added with +{override}."
            if key.split(".", 1)[0] in TARGET_GROUPS
            else ""
        )
        return f"{key}: no such key{f' in {where}' if where else ''}{hint}{added}"
    return None


def _target_set(overrides: Sequence[str], group: str) -> str | None:
    """The `_target_` the line gives `group` (model._target_=mypkg.Net), or None."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == f"{group}._target_":
            return value
    return None


class ConfigDirs:
    """The folders Hydra composes from, in its order: hpctrain's own configs first, then the
    user's (`--config-dir`, `hydra.searchpath`)."""

    def __init__(self, user: Sequence[Any]) -> None:
        self.folders: list[Any] = [_conf(), *user]

    def groups(self) -> set[str]:
        """The config groups (folders of any of them: `cluster=devcluster` chooses an option)."""
        found: set[str] = set()
        for folder in self.folders:
            try:
                found |= {e.name for e in folder.iterdir() if e.is_dir() and not e.name.startswith(("_", "."))}
            except OSError:  # a folder that is not there: Hydra says so
                continue
        return found

    def options(self, group: str) -> list[str]:
        found: set[str] = set()
        for folder in self.folders:
            try:
                found |= {p.name.removesuffix(".yaml") for p in (folder / group).iterdir() if p.name.endswith(".yaml")}
            except OSError:
                continue
        return sorted(found)

    def option_yaml(self, group: str, option: str) -> dict:
        """The option's file as Hydra finds it (the first folder that has it); {} if none."""
        for folder in self.folders:
            try:
                loaded = yaml.safe_load((folder / group / f"{option}.yaml").read_text())
            except OSError:
                continue
            except yaml.YAMLError:
                return {}
            return loaded if isinstance(loaded, dict) else {}
        return {}


def config_dirs(argv: Sequence[str]) -> ConfigDirs | None:
    """Where the command line's configs come from; None when it names another primary config."""
    user: list[Any] = []
    for index, arg in enumerate(argv):
        if arg.startswith(("--config-name", "-cn", "--config-path", "-cp")):
            return None
        if arg in ("--config-dir", "-cd"):
            if index + 1 < len(argv):
                user.append(Path(argv[index + 1]))
        elif arg.startswith(("--config-dir=", "-cd=")):
            user.append(Path(arg.split("=", 1)[1]))
        elif arg.startswith(("hydra.searchpath=", "+hydra.searchpath=", "++hydra.searchpath=")):
            user.extend(_search_path(arg.split("=", 1)[1]))
    return ConfigDirs(user)


def _search_path(value: str) -> Iterator[Any]:
    """`[file://myconf,pkg://mypkg.conf]`: the folders it names (a package not importable here is
    left to Hydra)."""
    for entry in value.strip().strip("[]").split(","):
        entry = entry.strip().strip("'\"")
        if entry.startswith("file://"):
            yield Path(entry.removeprefix("file://"))
        elif entry.startswith("pkg://"):
            try:
                yield resources.files(entry.removeprefix("pkg://"))
            except (ImportError, TypeError, ValueError):
                continue


def _unknown_option(group: str, value: str, dirs: ConfigDirs) -> str | None:
    """`model=resnet`: the group has no such option (each of a sweep's options is looked at)."""
    options = dirs.options(group)
    for option in value.split(","):
        if option and option != "null" and option not in options:
            close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
            hint = f"did you mean {group}={close[0]}? " if close else ""
            folders = "" if len(dirs.folders) > 1 else " (your own options: --config-dir DIR with DIR/" + group + "/)"
            return f"{group}={option}: no such option; {hint}{group} has {', '.join(options)}{folders}"
    return None


def _keys_beside(key: str, groups: dict[str, str], dirs: ConfigDirs) -> tuple[set[str] | None, str]:
    """The keys a key of this section may be, and how to name the section; (None, _) when the
    key's section takes any key."""
    section = key.split(".", 1)[0]
    if section in TARGET_GROUPS and "." in key:
        option = groups.get(section)
        if option is None:
            return None, ""
        return {f"{section}.{k}" for k in _flat(dirs.option_yaml(section, option))}, f"{section}={option}"
    known = {entry.key for entry in schema_keys()}
    if section in groups:  # a schema section filled from a group (data=tokens): its option's keys too
        known |= {f"{section}.{k}" for k in _flat(dirs.option_yaml(section, groups[section]))}
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


def _conf() -> Any:
    return resources.files("hpctrain.conf")


def chosen_options(overrides: Sequence[str], dirs: ConfigDirs) -> dict[str, str]:
    """Each group's option (`cluster` aside: it sets keys anywhere): the command line's
    `group=option`, else the default."""
    chosen: dict[str, str] = {}
    groups = dirs.groups()
    try:
        primary = yaml.safe_load((_conf() / "config.yaml").read_text())
        for entry in primary.get("defaults", []):
            if isinstance(entry, dict):
                chosen.update({k: str(v) for k, v in entry.items() if k in groups - {"cluster"}})
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    for override in overrides:
        key, _, value = override.partition("=")
        group = key.lstrip("+")
        if group in groups - {"cluster"}:
            if "," in value:  # a sweep over options: their keys are not checked
                chosen.pop(group, None)
            else:
                chosen[group] = value
    return chosen
