"""Expand Slurm host lists (`gpu-[001-003,010],login1`) the way `scontrol show hostnames` does.

Forms Slurm prints and this reads (each checked against `scontrol show hostnames` on 22.05):
  - names and bracket groups separated by commas: `node[1-3],login1`;
  - ranges keep the width of their lower bound: `n[09-11]` -> n09 n10 n11, `n[8-12]` -> n8..n12;
  - several bracket groups in one name multiply: `a[1-2]b[3-4]` -> a1b3 a1b4 a2b3 a2b4;
  - empty items are skipped (`x,,y`), duplicates kept in order, as Slurm does.
What Slurm itself calls an invalid host list (`n[3-1]`, `n[]`, `n[a-b]`) and what it would
misread (an unclosed `[`, a stray `]`) is refused with a ValueError naming the list: a node
list is never guessed at.
"""

from __future__ import annotations

import itertools
import re

# One range inside brackets: `7`, `001-003`.
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
# Characters of a host name outside brackets (Slurm node names and DNS labels).
_NAME = re.compile(r"^[A-Za-z0-9._:-]*$")


class HostlistError(ValueError):
    """A host list Slurm would not print; the message names the list and what is wrong."""


def expand(hostlist: str, what: str = "host list") -> list[str]:
    """`gpu-[001-002],login1` -> ['gpu-001', 'gpu-002', 'login1']; `what` names the source
    (an environment variable) in the error."""
    hosts: list[str] = []
    for item in _split_top_level(hostlist, what):
        if item:
            hosts += _expand_item(item, hostlist, what)
    return hosts


def _split_top_level(hostlist: str, what: str) -> list[str]:
    """Split at commas outside brackets; brackets must pair up and not nest."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise HostlistError(f"{what}={hostlist!r}: brackets do not pair up")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"{what}={hostlist!r}: a '[' is not closed")
    items.append("".join(current))
    return items


def _expand_item(item: str, hostlist: str, what: str) -> list[str]:
    """One name with zero or more bracket groups: `a[1-2]b[3-4]`."""
    # re.split with a group keeps the bracket contents at the odd positions.
    parts = re.split(r"\[([^\]]*)\]", item)
    choices: list[list[str]] = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not _NAME.match(part):
                raise HostlistError(f"{what}={hostlist!r}: {part!r} is not part of a host name")
            choices.append([part])
        else:
            choices.append(_expand_brackets(part, hostlist, what))
    return ["".join(combination) for combination in itertools.product(*choices)]


def _expand_brackets(inside: str, hostlist: str, what: str) -> list[str]:
    """`001-003,010` -> ['001', '002', '003', '010']."""
    numbers: list[str] = []
    for piece in inside.split(","):
        match = _RANGE.match(piece)
        if not match:
            raise HostlistError(f"{what}={hostlist!r}: [{inside}] holds {piece!r}, not a number or a range a-b")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"{what}={hostlist!r}: the range {piece!r} runs backwards")
        width = len(low)
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers
