"""The two reference pages, generated each time the docs are built and never committed: the
config keys from the schema (hpctrain.cli.help_text reads every key's default and comment from
hpctrain/config/schema.py and the section modules beside it, the groups and options from conf/)
and the commands from their own parsers (the console scripts of setup.cfg; the Hydra apps'
`--help` is hpctrain.cli.help_text's). mkdocs.yml names this file under `hooks:`.
"""

from __future__ import annotations

import argparse
import configparser
import importlib
import os
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from hpctrain.cli.help_text import groups, key_docs, render

REPO = Path(__file__).resolve().parents[2]
CONFIG_PAGE = "reference/config.md"
CLI_PAGE = "reference/cli.md"
HELP_COLUMNS = "100"  # argparse wraps its help to $COLUMNS: the page must not depend on a terminal


def on_files(files: Files, config: Any) -> Files:
    pages = {f.src_uri: f for f in files if f.src_uri.endswith(".md")}
    texts = {uri: Path(f.abs_src_path).read_text() for uri, f in pages.items() if f.abs_src_path}
    files.append(File.generated(config, CONFIG_PAGE, content=config_reference(texts)))
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    return files


def console_scripts() -> list[tuple[str, str]]:
    """(command, module:function) of every console script, in setup.cfg's order."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return [tuple(part.strip() for part in line.split("=", 1)) for line in lines]  # type: ignore[misc]


def command_help(command: str, target: str) -> list[tuple[str, list[str]]]:
    """(heading, Markdown lines) for a command: its usage, then its arguments as a table (from its
    argparse parser); the Hydra apps (no `parser()` of their own): their usage and groups, their
    keys being the config reference's."""
    module = importlib.import_module(target.split(":")[0])
    if not hasattr(module, "parser"):
        shown = [(command, _hydra_app(command))]
        if command == "hpctrain-submit":  # `--retry` hands the command line to its own parser
            retry = importlib.import_module("hpctrain.cli.retry").parser()
            shown.append((f"{command} --retry", _argparse_table(retry)))
        return shown
    return [(command, _argparse_table(module.parser()))]


def _hydra_app(command: str) -> list[str]:
    text = render(command)
    head = text.split("Config groups")[0].rstrip()
    usage = [line for line in head.splitlines() if line.startswith(("usage:", "       "))]
    words = " ".join(line.strip() for line in head.splitlines()[len(usage) :] if line.strip())
    lines = [
        "```text",
        *usage,
        "```",
        "",
        _markdown(words),
        "",
        "| group | options (the default in bold) |",
        "|---|---|",
    ]
    for group, (options, default) in groups().items():
        shown = ", ".join(f"**`{o}`**" if o == default else f"`{o}`" for o in options)
        lines.append(f"| `{group}` | {shown} |")
    lines += ["", "Every key, its default and meaning: the [config reference](config.md).", ""]
    return lines


def _argparse_table(parser: Any) -> list[str]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        usage = parser.format_usage().strip()
        formatter = parser._get_formatter()
        rows = []
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            name = ", ".join(action.option_strings) or str(action.metavar or action.dest)
            if action.option_strings and action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
            default = action.default
            shown = "" if default in (None, False, argparse.SUPPRESS, []) else f"`{default}`"
            meaning = formatter._expand_help(action) if action.help else ""
            rows.append(f"| `{name}` | {_cell(_markdown(meaning))} | {shown} |")
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    lines = ["```text", usage, "```", ""]
    if parser.description:
        lines += [_markdown(parser.description), ""]
    if rows:
        lines += ["| argument | meaning | default |", "|---|---|---|", *rows, ""]
    return lines


def cli_reference() -> str:
    lines = [
        "# Command-line reference",
        "",
        "Every console script hpctrain installs, from its own parser: this page is generated when the",
        "docs are built. `hpctrain-train`, `hpctrain-submit` and `hpctrain-tune` take Hydra overrides",
        "(`key=value`, `group=option`, `-m` to sweep); their keys are in the [config reference](config.md).",
        "",
    ]
    for command, target in console_scripts():
        for heading, shown in command_help(command, target):
            lines += [f"## {heading}", "", f"`{target}`", "", *shown, ""]
    return "\n".join(lines)


def config_reference(pages: dict[str, str]) -> str:
    lines = [
        "# Config reference",
        "",
        "Every key of the schema with its default and the comment above it in",
        "`hpctrain/config/schema.py` (the `slurm`, `slurm.network` and `tune` sections in `slurm.py`,",
        "`network.py` and `tune.py` beside it); the groups' options are the YAML files in `conf/`.",
        "This page is generated from them when the docs are built. `hpctrain-train --help` (and `-submit`, `-tune`)",
        "prints the same keys with the first sentence of each comment. A key is set on the command line",
        "(`trainer.max_steps=500`), a group's option by its name (`model=gpt`), an argument the option's",
        "`_target_` takes but does not set with `+` (`+optim.momentum=0.9`). Pages that explain a key",
        "in prose are linked beside it.",
        "",
        "## Groups",
        "",
        "| group | options (the default in bold) |",
        "|---|---|",
    ]
    for group, (options, default) in groups().items():
        shown = ", ".join(f"**{o}**" if o == default else o for o in options)
        lines.append(f"| `{group}` | {shown} |")
    lines.append("")
    for title, docs in _sections():
        lines += [f"## {title}", "", "| key | default | meaning | explained in |", "|---|---|---|---|"]
        for doc in docs:
            named = [] if doc.comment.startswith("A `_target_` node") else _pages_naming(doc.key, pages)
            where = ", ".join(f"[{_title(pages[uri], uri)}](../{uri})" for uri in named)
            default = f"`{doc.default}`" if doc.default else ""
            lines.append(f"| `{doc.key}` | {_cell(default)} | {_cell(_markdown(doc.comment))} | {where} |")
        lines.append("")
    lines += ["## The groups' options", ""]
    conf = resources.files("hpctrain.conf")
    for group, (options, _) in groups().items():
        for option in options:
            text = (conf / group / f"{option}.yaml").read_text().rstrip()
            lines += [f"### {group}={option}", "", f"`conf/{group}/{option}.yaml`:", "", "```yaml", text, "```", ""]
    return "\n".join(lines)


def _sections() -> Iterable[tuple[str, list[Any]]]:
    sections: dict[str, list[Any]] = {}
    for doc in key_docs():
        section = doc.key.rsplit(".", 1)[0] if "." in doc.key else "Top-level keys"
        sections.setdefault(section if section == "Top-level keys" else f"`{section}`", []).append(doc)
    return sections.items()


def _pages_naming(key: str, pages: dict[str, str]) -> list[str]:
    """The hand-written pages that name the key in code (`trainer.ckpt_every`, `slurm.nodes=2`);
    not asked of a `_target_` node, whose name (`loss`, `model`) is also a word of its own."""
    named = re.compile(rf"`\+?{re.escape(key)}(?![\w.])")
    return sorted(uri for uri, text in pages.items() if not uri.startswith("reference/") and named.search(text))


def _title(text: str, uri: str) -> str:
    heading = next((line[2:] for line in text.splitlines() if line.startswith("# ")), uri)
    return heading.replace("`", "").split(":")[0]


def _markdown(text: str) -> str:
    """Plain comment text as Markdown: `<` outside code spans is not a tag."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
