"""Every config key documented where users look: `--help` and the docs' config reference (both from
the schema's own comments), checked by walking the schema; and the hand-written key tables of the
docs pages agree with the schema's defaults."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

from hpctrain.cli.help_text import key_docs
from hpctrain.config.schema import Config

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "hooks"))
import reference  # noqa: E402  (docs/hooks/reference.py: the generated pages)


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
    assert "  optim: [adamw], adamw_no_decay, sgd" in shown.stdout and "  model: [convnet], gpt, mlp" in shown.stdout


def test_submit_help_names_retry_the_run_dir_and_a_chosen_groups_own_keys(tmp_path: Path) -> None:
    conf = tmp_path / "myconf" / "model"
    conf.mkdir(parents=True)
    (conf / "mynet.yaml").write_text("_target_: mypkg.Net\nwidth: 64\n")
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "hpctrain-submit"), "model=gpt", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "hpctrain-submit --retry SWEEP_DIR|RUN_DIR [POINT ...] [--dry-run]" in shown.stdout
    assert "hydra.run.dir=DIR names the run dir" in shown.stdout
    assert "Keys of model=gpt" in shown.stdout and "  model.n_layer [4]" in shown.stdout
    assert "  optim.lr [" in shown.stdout  # the default optimizer's keys too
    own = subprocess.run(
        [str(Path(sys.executable).parent / "hpctrain-train"), "--config-dir", str(tmp_path / "myconf")]
        + ["model=mynet", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Keys of model=mynet" in own.stdout and "  model.width [64]" in own.stdout, own.stdout[:3000]
    assert "  model: [convnet], gpt, mlp, mynet" in own.stdout  # its own option among the group's
    assert "--retry" not in own.stdout.split("Config groups")[0]  # hpctrain-train has none


def test_the_config_reference_shows_every_key_with_its_default_and_whole_comment() -> None:
    page = reference.config_reference({})
    for doc in key_docs():
        row = f"| `{doc.key}` | `{doc.default}` | {reference._cell(reference._markdown(doc.comment))} |"
        assert row in page, doc.key
    assert set(schema_leaves()) == {doc.key for doc in key_docs()}


def test_the_docs_key_tables_agree_with_the_schema() -> None:
    """A page that explains keys in a table (`| key | default | meaning |`) shows the schema's
    default: the default is written in the schema once, and a page that says otherwise fails."""
    defaults = {doc.key: doc.default for doc in key_docs()}
    wrong = []
    for page in sorted(DOCS.glob("*.md")):
        for key, shown in _key_table_rows(page.read_text()):
            if key in defaults and not _same(shown, defaults[key]):
                wrong.append(f"{page.name}: {key} shows {shown!r}, the schema says {defaults[key]!r}")
    assert not wrong, wrong


def _key_table_rows(text: str) -> Iterator[tuple[str, str]]:
    column = None
    for line in text.splitlines():
        if line.startswith("| key |"):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            column = header.index("default") if "default" in header else None
            continue
        if not line.startswith("|") or column is None:
            column = None if not line.startswith("|") else column
            continue
        if line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        keys = [k for k in re.findall(r"`([\w.]+)`", cells[0]) if not k.startswith(".")]
        values = cells[column].split(", ") if len(keys) > 1 else [cells[column]]
        yield from zip(keys, values if len(values) == len(keys) else [cells[column]] * len(keys))


def _same(shown: str, default: str) -> bool:
    def plain(value: str) -> str:
        code = re.match(r"`([^`]*)`", value.strip())
        value = code.group(1) if code else value.strip()
        return "" if value in ('""', "''") else value

    a, b = plain(shown), plain(default)
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b
