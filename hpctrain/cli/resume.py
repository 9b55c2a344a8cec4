"""Resuming a run by its run dir keeps the run's own plan and config unless the line says otherwise.

    hpctrain-train --resume RUN_DIR [key=value ...]      # the run's own command line, then yours
    hpctrain-train hydra.run.dir=RUN_DIR [key=value ...]  # the same run dir: its plan kept

Before, starting a run dir again without its `trainer.max_steps=12` re-planned it to the default
(440 steps) with one line of notice: a resume "by the same command" that left a key out changed
the run. Now, on the command line before Hydra composes it:
- `--resume RUN_DIR` becomes the run's own overrides (its `.hydra/overrides.yaml`, what it was
  started with), `hydra.run.dir=RUN_DIR`, then the keys this line gives (a key given replaces the
  run's own);
- for a run dir that holds a run, every key of the run's plan (common.REPLANNABLE, and the sizes an
  elastic run may change) that the line does not give is the run's own value from its
  `config.yaml`. A key given is a new plan, journaled as before (`replanned`).
A sweep (`-m`) is left as it is: its points' run dirs are Hydra's to make.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hpctrain.cli.common import ELASTIC_REPLANNABLE, REPLANNABLE, fail
from hpctrain.run.paths import RunDir

RESUME_FLAG = "--resume"


def with_the_runs_own(argv: Sequence[str]) -> list[str]:
    """The command line with `--resume RUN_DIR` expanded and the run's plan kept (see above)."""
    args = list(argv)
    if any(a in ("-m", "--multirun") for a in args):
        if RESUME_FLAG in args:
            fail(f"{RESUME_FLAG} resumes one run dir; a sweep's points are resumed with hpctrain-submit --retry")
        return args
    if RESUME_FLAG in args:
        args = _expand_resume(args)
    run_dir = _run_dir(args)
    if run_dir is None or not RunDir(run_dir).config.is_file():
        return args
    given = {_key(a) for a in args if "=" in a and not a.startswith("-")}
    config = _load(RunDir(run_dir).config)
    kept = []
    for key in (*REPLANNABLE, *ELASTIC_REPLANNABLE):
        if key in given:
            continue
        found, value = _leaf(config, key)
        if found:
            kept.append(f"{key}={_spelled(value)}")
    return [*args, *kept]


def _expand_resume(args: list[str]) -> list[str]:
    at = args.index(RESUME_FLAG)
    if at + 1 >= len(args) or args[at + 1].startswith("-") or "=" in args[at + 1]:
        fail(f"{RESUME_FLAG}: name the run dir to resume ({RESUME_FLAG} RUN_DIR)")
    run_dir = Path(args[at + 1])
    run = RunDir(run_dir)
    if not run.config.is_file():
        fail(f"{RESUME_FLAG} {run_dir}: no run there (no config.yaml); name a run dir hpctrain wrote")
    rest = args[:at] + args[at + 2 :]
    given = {_key(a) for a in rest if "=" in a and not a.startswith("-")}
    listed = _listed(run.overrides, run_dir)
    own = [str(line) for line in listed if _key(str(line)) not in given and not _names_run_dir(str(line))]
    # The run's own options of a --config-dir (model=mynet) are found there again, unless this
    # line names a config dir of its own.
    dirs = [] if _gives_config_dir(rest) else [f"--config-dir={folder}" for folder in _listed(run.config_dirs, run_dir)]
    return [*dirs, *own, *(a for a in rest if not _names_run_dir(a)), f"hydra.run.dir={run_dir}"]


def _listed(path: Path, run_dir: Path) -> list[str]:
    """The YAML list in `path` ([] when there is none)."""
    if not path.is_file():
        return []
    try:
        listed = yaml.safe_load(path.read_text()) or []
    except yaml.YAMLError as error:
        fail(f"{path} is unreadable ({str(error).splitlines()[0]}); resume with hydra.run.dir={run_dir}")
    return [str(line) for line in listed]


def _gives_config_dir(args: Sequence[str]) -> bool:
    return any(a in ("--config-dir", "-cd") or a.startswith(("--config-dir=", "-cd=")) for a in args)


def _run_dir(args: Sequence[str]) -> Path | None:
    named = [a.split("=", 1)[1] for a in args if _names_run_dir(a)]
    return Path(named[-1]) if named else None


def _names_run_dir(arg: str) -> bool:
    return arg.lstrip("+").startswith("hydra.run.dir=")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _load(config_yaml: Path) -> dict:
    try:
        loaded = yaml.safe_load(config_yaml.read_text())
    except (OSError, yaml.YAMLError):
        return {}  # the command's own checks say what is wrong with it
    return loaded if isinstance(loaded, dict) else {}


def _leaf(tree: dict, key: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _spelled(value: Any) -> str:
    """A value as a Hydra override writes it: strings quoted (`'01:00:00'`), null, true/false."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"
