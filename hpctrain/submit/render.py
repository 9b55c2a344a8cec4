"""Render a config into an sbatch script from a Jinja2 template.

Two kinds of quoting, because two parsers read the script:
  - `#SBATCH` lines are read by sbatch itself, which knows '...' / "..." quotes and backslash
    escapes and treats an unquoted `#` as a comment: the `directive` filter quotes for it.
  - everything else is read by bash: the `q` filter is shlex.quote, and `words` quotes each
    word of a list (a command and its arguments) on its own.
Newlines are refused before this point (the schema checks), so no value can start a line.
"""

from __future__ import annotations

import functools
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from hpctrain import __version__
from hpctrain.config import Config
from hpctrain.config.schema import SlurmConfig
from hpctrain.run import exitcodes
from hpctrain.run.paths import KEEPER_OUTPUT_PATTERN, SLURM_OUTPUT_PATTERN, RunDir
from hpctrain.run.protocol import TEMPLATE_WORDS

_SAFE = re.compile(r"^[A-Za-z0-9_.:,=/@+\-\[\]]+$")
# srun --immediate of the training step: how long it may wait for its nodes before it ends and
# after-step judges why (a node lost as the life started: Slurm would keep it waiting for ever).
STEP_WAIT_S = 60


def sbatch_quote(value: object) -> str:
    """Quote one value for an #SBATCH line so sbatch reads back exactly `value`."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"{text!r}: a newline cannot be put in an #SBATCH line")
    if _SAFE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_flag(flag: str) -> str:
    """`--mail-type=END` stays as is; the value part of `--flag=value` is quoted."""
    name, sep, value = flag.partition("=")
    if not re.match(r"^--?[A-Za-z][A-Za-z0-9-]*$", name):
        raise ValueError(f"slurm.extra: {flag!r} is not a flag like --mail-type=END")
    return name + (sep + sbatch_quote(value) if sep else "")


def shell_words(words: Sequence[object]) -> str:
    """Words for a bash command line, each one argument whatever it holds: ["a b", "c"] -> 'a b' c."""
    return " ".join(shlex.quote(str(word)) for word in words)


def launch_commands(slurm: SlurmConfig, python: str) -> tuple[list[str], list[str]]:
    """(what runs each training task, what runs the batch shell's control steps), both before
    `-m MODULE`. The control steps go through slurm.task_prefix too, unless the site names a
    Python outside the container for them."""
    task = [*slurm.task_prefix, python]
    control = [slurm.control_python] if slurm.control_python else task
    return task, control


def filename_pattern(path: Path) -> str:
    """A literal path for --output: `%` starts Slurm's replacement symbols, `%%` is a `%`."""
    return str(path).replace("%", "%%")


def builtin_templates() -> Path:
    return Path(str(resources.files("hpctrain.sbatch_templates")))


@dataclass(frozen=True)
class Rendered:
    script: str
    template: Path


@functools.lru_cache(maxsize=16)
def _environment(template: str) -> tuple[jinja2.Environment, str]:
    """A site's own template (a path) is searched first; hpctrain's folder stays on the path so
    a site template can `{% extends "ddp.sbatch.j2" %}`. Cached: a sweep renders every point
    with it, and Jinja compiles a template once per environment (about 20 ms)."""
    folders = [builtin_templates()]
    name = template
    if "/" in template or Path(template).is_file():
        path = Path(template).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"slurm.template: no file {path}")
        folders.insert(0, path.parent)
        name = path.name
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(f) for f in folders]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["directive"] = sbatch_quote
    env.filters["flag"] = sbatch_flag
    env.filters["words"] = shell_words
    return env, name


def render(config: Config, run_dir: Path, submit_dir: Path, code_dir: Path | None = None) -> Rendered:
    """Raises ValueError naming slurm.template (or the value) when the script cannot be made.
    `code_dir`: the code snapshot the job imports first (None: the code as installed)."""
    slurm = config.slurm
    python = slurm.python or sys.executable
    task_command, control_command = launch_commands(slurm, python)
    env, name = _environment(slurm.template)
    try:
        template = env.get_template(name)
        script = template.render(
            version=__version__,
            template_name=name,
            slurm=slurm,
            trainer=config.trainer,
            tasks_per_node=slurm.tasks_per_node,
            cpus_per_task=slurm.cpus_per_task or config.trainer.threads,
            gpu_per_task=slurm.gpu_bind == "per_task" and slurm.gpus_per_node > 0,
            # The heartbeat watcher runs on the batch node: it can only ever tell of another node,
            # so a one-node step has none.
            watch_beats=slurm.silent_node_timeout_s > 0 and slurm.max_nodes + slurm.spare_nodes > 1,
            # Only a relaunch (spare nodes) can use a standby; a GPU's binding is not handed over.
            warm_standby=slurm.warm_standby and slurm.spare_nodes > 0 and slurm.gpus_per_node == 0,
            # The in-memory tier's holders (trainer.memory_ckpt_every), only where a relaunch can use
            # them (spare nodes): a requeue's new allocation has none.
            memory_holders=config.trainer.memory_ckpt_every > 0 and slurm.spare_nodes > 0,
            memory_max_bytes=round(config.trainer.memory_max_gb * 1e9) if config.trainer.memory_max_gb else 0,
            step_wait_s=STEP_WAIT_S,
            run_dir=str(run_dir),
            sigterm_mark_prefix=str(RunDir(run_dir).sigterm_mark_prefix),
            submit_dir=str(submit_dir),
            code_dir=str(code_dir) if code_dir else "",
            output=filename_pattern(run_dir) + "/" + SLURM_OUTPUT_PATTERN,
            keeper_output=KEEPER_OUTPUT_PATTERN,
            python=python,
            task_command=task_command,
            control_command=control_command,
            exit_codes=exitcodes,  # the batch script's own exit codes, from the one table
            **TEMPLATE_WORDS,  # the control steps' and the answer line's words, from the protocol
        )
    except jinja2.TemplateNotFound as error:
        where = "" if error.name == name else f" (included by {name})"
        raise ValueError(f"slurm.template: no template {error.name!r}{where} in {builtin_templates()}") from None
    except jinja2.TemplateError as error:  # a site template's syntax, or a name it uses that is not given
        line = getattr(error, "lineno", None)
        raise ValueError(f"slurm.template: {name}{f' line {line}' if line else ''}: {error}") from None
    if code_dir and shlex.quote(str(code_dir)) not in script:
        # A site template of its own that ignores `code_dir` would run today's code silently.
        raise ValueError(
            f"slurm.template: {name} does not put the code snapshot on PYTHONPATH (it never uses "
            "`code_dir`); copy the slurm.code_snapshot lines of ddp.sbatch.j2 or set slurm.code_snapshot=false"
        )
    return Rendered(script=script, template=Path(template.filename or name))


# The guardian's time limit: one look at Slurm and two sbatch calls, each retried for a few
# minutes while slurmctld is away.
GUARDIAN_TIME = "00:15:00"
GUARDIAN_OUTPUT = "guardian-%j.out"


def render_guardian(config: Config, run_dir: Path, submit_dir: Path, code_dir: Path | None = None) -> str:
    """The run's guardian.sbatch (hpctrain.recovery.guardian), from guardian.sbatch.j2: hpctrain's
    own, or one in the folder of a site's slurm.template (searched first)."""
    slurm = config.slurm
    _, control_command = launch_commands(slurm, slurm.python or sys.executable)
    env, _ = _environment(slurm.template)  # the job's environment: one per sweep
    return env.get_template("guardian.sbatch.j2").render(
        version=__version__,
        slurm=slurm,
        guardian_time=GUARDIAN_TIME,
        run_dir=str(run_dir),
        submit_dir=str(submit_dir),
        code_dir=str(code_dir) if code_dir else "",
        output=filename_pattern(run_dir) + "/" + GUARDIAN_OUTPUT,
        control_command=control_command,
    )
