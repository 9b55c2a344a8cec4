"""The docs site builds strictly, its generated references are whole, and the commands it shows run.

- `mkdocs build --strict` (mkdocs.yml): a broken link, anchor or nav entry fails the build.
- The config reference (generated from the schema by docs/hooks/reference.py) names every key, the
  command-line reference every console script of setup.cfg.
- The commands shown in the docs that can run on one machine without Slurm run here, from the
  pages themselves. A code block is runnable when the line right before its opening fence is

      <!-- docs-test: [exit=N] [only=1,3-5] [add='k=v ...'] [before='command'] [output=no] -->

  (an HTML comment: GitHub and the site show nothing). Every command of the block runs in order,
  in one fresh folder: the lines of a ```bash block (`\\` continuations joined, `#` comments left
  out), or the `$ ` lines of a console block. `exit` is the exit code each must give (default 0);
  `only` picks commands by their number in the block; `add` appends overrides to every
  hpctrain-train/-submit/-tune command that does not set that key already (`trainer.max_steps=2`
  keeps a run tiny, `dry_run=true` queues nothing); `before` runs a command first (a sweep for
  hpctrain-cancel to look at). In a console block each `error: ...` line shown under a command must
  be a line of what it printed (`...` standing for anything), unless `output=no`. A command that
  could queue a job must say so (`dry_run=true`, `--dry-run`): no job is ever submitted.
- A page that builds files (`<!-- docs-test: file=PATH -->` above a block: its text is written to
  PATH) is walked as a reader follows it: its marked blocks, files and commands, in page order,
  all in one folder (docs/first-hour.md).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_key_docs import schema_leaves

from hpctrain.config.slurm import SlurmConfig
from hpctrain.submit.shared_dirs import node_local_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARK = re.compile(r"^<!-- docs-test:(?P<options>.*)-->\s*$")
OPTIONS = {"exit", "only", "add", "before", "output", "file"}
HYDRA_APPS = ("hpctrain-train", "hpctrain-submit", "hpctrain-tune")
MAY_QUEUE = ("hpctrain-submit", "hpctrain-tune", "hpctrain-cancel")


def console_scripts() -> list[str]:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    return [line.split("=")[0].strip() for line in setup["options.entry_points"]["console_scripts"].split("\n") if line]


# ---- the site ------------------------------------------------------------------------------------


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Not `-q`: it drops the warnings that --strict counts, and the build would pass anyway.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(REPO / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "fault-matrix" / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text(
        (REPO / "mkdocs.yml").read_text().replace("docs/hooks/reference.py", str(REPO / "docs/hooks/reference.py"))
    )
    page = tmp_path / "docs" / "operate.md"
    page.write_text(page.read_text() + "\nSee [the guardian](lost-nodes.md#no-such-heading).\n")
    built = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "no-such-heading" in built.stderr, built.stderr


def test_the_config_reference_names_every_key(site: Path) -> None:
    page = (site / "reference" / "config" / "index.html").read_text()
    missing = [key for key in schema_leaves() if f"<code>{key}</code>" not in page]
    assert not missing, f"keys the config reference does not show: {missing}"


def test_the_command_line_reference_shows_every_console_script(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    for command in console_scripts():
        assert f'id="{command}"' in page and f"usage: {command}" in page, command


def test_the_readmes_links_lead_to_pages() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (REPO / "README.md").read_text())
    assert links and all((REPO / link).is_file() for link in links if "://" not in link), links


# ---- the commands the docs show --------------------------------------------------------------------


@dataclass
class Block:
    where: str  # page:line of the marker
    commands: list[tuple[str, list[str]]]  # (command line, error lines shown under it)
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""  # a file block's text, written to options["file"]


def runnable_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            found = MARK.match(line)
            if not found:
                continue
            where = f"{page.relative_to(REPO)}:{number + 1}"
            options = dict(word.split("=", 1) for word in shlex.split(found["options"]))
            assert set(options) <= OPTIONS, f"{where}: unknown options {set(options) - OPTIONS}"
            assert lines[number + 1].startswith("```"), f"{where}: a docs-test mark must sit right above a code block"
            end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
            body = lines[number + 2 : end]
            if "file" in options:
                blocks.append(Block(where, [], options, "".join(line + "\n" for line in body)))
            else:
                blocks.append(Block(where, commands_of(body), options))
    return blocks


def commands_of(body: list[str]) -> list[tuple[str, list[str]]]:
    if any(line.startswith("$ ") for line in body):  # a console block: commands, then their output
        commands: list[tuple[str, list[str]]] = []
        for line in body:
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands and line.startswith("error:"):
                commands[-1][1].append(line)
        return commands
    joined = re.sub(r"\\\n\s*", " ", "\n".join(body))
    return [(line, []) for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def picked(spec: str | None, count: int) -> list[int]:
    if not spec:
        return list(range(1, count + 1))
    numbers: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        numbers += range(int(low), int(high or low) + 1)
    assert all(1 <= n <= count for n in numbers), f"only={spec}: the block has {count} commands"
    return numbers


def argv_of(command: str, add: list[str]) -> list[str]:
    argv = shlex.split(command, comments=True)
    program = argv[0]
    assert program in console_scripts(), f"{program}: not a console script of hpctrain (only those run here)"
    if program in HYDRA_APPS and "--help" not in argv and "--retry" not in argv:
        for word in add:
            key = word.split("=", 1)[0]
            if not any(a.split("=", 1)[0].lstrip("+~") == key for a in argv[1:]):
                argv.append(word)
    return [str(BIN / program), *argv[1:]]


def environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCTRAIN_FAULT"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        SLURM_CONF=str(folder / "no-slurm.conf"),  # should a command reach Slurm, it finds no cluster
        OMP_NUM_THREADS="1",
        HPCTRAIN_TARGET_CACHE=str(folder / ".target-cache"),
        PYTHONPATH="",
    )
    return env


def run(argv: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    # 600 s: the FSDP block (4 s alone) took over 180 s once, beside the suite's heaviest Slurm
    # tests on 2 cores; a hang still ends the test.
    return subprocess.run(argv, cwd=folder, env=environment(folder), capture_output=True, text=True, timeout=600)


def shown(line: str, output: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in line.split("..."))
    return any(re.fullmatch(pattern, printed.strip()) for printed in output.splitlines())


ALL_BLOCKS = runnable_blocks()
# Pages that build files are walked whole (test_a_page_that_builds_files_runs_as_read); the
# blocks of the other pages run each on its own.
WALKED = sorted({b.where.split(":")[0] for b in ALL_BLOCKS if "file" in b.options})
BLOCKS = [b for b in ALL_BLOCKS if b.where.split(":")[0] not in WALKED]


def test_the_docs_mark_commands_to_run() -> None:
    pages = {block.where.split(":")[0] for block in BLOCKS}
    assert len(BLOCKS) >= 10 and {"README.md", "docs/getting-started.md", "docs/sweeps.md"} <= pages


@pytest.fixture
def users_folder() -> Iterator[Path]:
    """An empty folder outside /tmp to run a block's commands in, as a user's own folder is: a
    multi-node submit refuses a run dir under /tmp, which each node has its own of."""
    FOLDERS.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=FOLDERS))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def users_folders() -> Path:
    """Where users' folders go: beside the checkout (git ignores it), or under the home folder
    when the checkout itself is in a node-local folder (a clone in /tmp)."""
    if node_local_dir(REPO, SlurmConfig().node_local_dirs) is None:
        return REPO / ".docs-test-runs"
    return Path.home() / ".cache" / "hpctrain" / "docs-test-runs"


FOLDERS = users_folders()


@pytest.mark.slow  # seconds each: a block may train locally (a few steps) or compose several configs
@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_a_command_the_docs_show_runs(block: Block, users_folder: Path) -> None:
    run_block(block, users_folder)


@pytest.mark.slow
@pytest.mark.parametrize("page", WALKED)
def test_a_page_that_builds_files_runs_as_read(page: str, users_folder: Path) -> None:
    blocks = [b for b in ALL_BLOCKS if b.where.split(":")[0] == page]
    assert any(b.commands for b in blocks), f"{page}: files but no command to run with them"
    for block in blocks:
        if "file" in block.options:
            path = users_folder / block.options["file"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)
        else:
            run_block(block, users_folder)


def test_the_first_hour_page_is_walked() -> None:
    assert "docs/first-hour.md" in WALKED


def run_block(block: Block, tmp_path: Path) -> None:
    """Every command of `block`, in order, in `tmp_path`, with its options."""
    expected = int(block.options.get("exit", "0"))
    add = block.options.get("add", "").split()
    steps = [(block.options["before"], [], 0)] if "before" in block.options else []
    chosen = picked(block.options.get("only"), len(block.commands))
    steps += [(*block.commands[n - 1], expected) for n in chosen]
    for command, errors, code in steps:
        argv = argv_of(command, add)
        if argv[0].endswith(MAY_QUEUE) and code == 0:
            assert {"dry_run=true", "--dry-run", "--help"} & set(argv), f"{block.where}: `{command}` could queue a job"
        done = run(argv, tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode == code, f"{block.where}: `{shlex.join(argv)}` exited {done.returncode}:\n{output}"
        if block.options.get("output") != "no":
            for line in errors:
                assert shown(line, output), f"{block.where}: `{command}` did not print\n{line}\nbut\n{output}"


def test_search_finds_a_bare_key_name_and_keys_never_break(site: Path) -> None:
    """`elastic` finds trainer.elastic: the search index splits at dots and underscores; the text
    column is wide and a key in a table stays whole (docs/stylesheets/hpctrain.css)."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    separator = index["config"]["separator"]
    assert re.split(separator, "trainer.ckpt_every") == ["trainer", "ckpt", "every"], separator
    css = (site / "stylesheets" / "hpctrain.css").read_text()
    assert "max-width: 90rem" in css and "white-space: nowrap" in css
    assert "stylesheets/hpctrain.css" in (site / "index.html").read_text()
