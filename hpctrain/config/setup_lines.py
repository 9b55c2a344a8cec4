"""`slurm.setup` lines: the user's own shell, run as written in the job script.

That is the trust boundary: hpctrain quotes every value it puts into the script, but a setup
line is a command by design (`module load cuda/12.4`). What it must not do is let a value from
elsewhere, a sweep's value or another override, become a command through a `${...}` in a line.
"""

from __future__ import annotations

import copy
import re

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

# What shlex.quote leaves unquoted: a value made only of these is one inert shell word.
_SHELL_WORD = re.compile(r"^[\w@%+=:,./-]*$", re.ASCII)


def _interpolations(line: str) -> list[str]:
    """The top-level `${...}` parts of a string, nested braces included."""
    found, depth, start = [], 0, 0
    for i, char in enumerate(line):
        if char == "{" and line[i - 1 : i] == "$" and depth == 0:
            start, depth = i - 1, 1
        elif char == "{" and depth:
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                found.append(line[start : i + 1])
    return found


def check_interpolations(cfg: DictConfig) -> None:
    """`slurm.setup` lines are shell, run as the user wrote them. A `${...}` in one brings in a
    value from elsewhere (a sweep's value, an override): only a plain word may come in that way,
    or `slurm.job_name='x; rm -rf ~'` would run in a line that says `echo ${slurm.job_name}`."""
    slurm = cfg.get("slurm") if isinstance(cfg, DictConfig) else None
    raw = OmegaConf.to_container(slurm, resolve=False) if isinstance(slurm, DictConfig) else {}
    lines = raw.get("setup") if isinstance(raw, dict) else None
    if not isinstance(lines, list):
        return
    for index, line in enumerate(lines):
        parts = _interpolations(line) if isinstance(line, str) else []
        if not parts:
            continue
        probe = copy.deepcopy(cfg)
        try:
            with open_dict(probe):
                probe.slurm.setup = parts  # resolved where the line is, so relative keys still work
            values = OmegaConf.to_container(probe.slurm.setup, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as error:
            raise ValueError(f"slurm.setup[{index}]: {str(error).splitlines()[0]}") from None
        assert isinstance(values, list)  # the container of the list set just above
        for part, value in zip(parts, values):
            if not _SHELL_WORD.match(str(value)):
                raise ValueError(
                    f"slurm.setup[{index}]: {part} brings {str(value)!r} into a shell line; setup lines run as "
                    "written, so a value put in by interpolation may hold only letters, digits and @%+=:,./- "
                    "(write the line out in full instead)"
                )
