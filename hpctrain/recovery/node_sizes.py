"""Which nodes are big enough for the job: its GPUs and memory per node, as sinfo lists them.

A requeue keeps failed nodes out only while enough others could run the job (hpctrain.recovery.
judge.requeue_shape). On a mixed partition (nodes of 4 GPUs beside nodes of 8, of 256 GB beside
1 TB) a node that is up but too small for the job counts for nothing: counted, it let a requeue
keep the failed nodes out and wait for ever (Reason=Resources) on nodes that can never run it.

Pure parsing and filtering; tests/test_node_sizes.py reads sinfo's own lines
(tests/fixtures/slurm/sinfo_resources.txt, from the dev cluster).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSize:
    gpus: int  # GPUs the node has (its gres `gpu`, every type together)
    memory_mb: int  # RealMemory, MB


_GRES = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?(?:\(.*\))?$")


def gpus_in(gres: str) -> int:
    """The GPUs of sinfo's %G: `gpu:2`, `gpu:a100:4(S:0-1)`, `gpu:a100:4,gpu:v100:2`, `(null)`."""
    total = 0
    for part in _split_gres(gres):
        match = _GRES.match(part)
        if match is None or match.group("name") != "gpu":
            continue
        count = match.group("count")
        if count is None and match.group("type") and match.group("type").isdigit():
            count = match.group("type")  # `gpu:2`: the count where a type would be
        total += int(count) if count else 1
    return total


def _split_gres(gres: str) -> list[str]:
    """Comma-separated entries, commas inside parentheses (socket lists) kept."""
    parts, depth, current = [], 0, ""
    for char in gres.strip():
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current and current != "(null)":
        parts.append(current)
    return parts


def parse_sinfo_sizes(text: str) -> dict[str, NodeSize]:
    """`sinfo -N -h -a -o '%N|%G|%m'`: each node's GPUs and memory (a node in two partitions shows
    twice, alike; `%m` may end in `+` for a node group of sizes that differ). Raises ValueError
    on a line of another shape."""
    sizes: dict[str, NodeSize] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3 or not parts[0] or not parts[2].rstrip("+").isdigit():
            raise ValueError(f"sinfo line not of the form NODE|GRES|MEMORY: {line!r}")
        sizes[parts[0]] = NodeSize(gpus_in(parts[1]), int(parts[2].rstrip("+")))
    return sizes


_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.I)
_MB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def memory_mb(text: str | None) -> int | None:
    """sbatch --mem (slurm.mem) in MB: `16000`, `16G`, `512M`, `1T`; None for none or 0 (all of a
    node's memory) or anything else."""
    if not text:
        return None
    match = _MEM.match(text.strip())
    if not match or int(match.group(1)) == 0:
        return None
    return int(int(match.group(1)) * _MB[match.group(2).upper()])


def nodes_big_enough(sizes: dict[str, NodeSize], gpus_per_node: int, mem_mb: int | None) -> frozenset[str] | None:
    """The nodes with at least the job's GPUs and memory per node; None when the job asks for
    neither (every node counts)."""
    if gpus_per_node <= 0 and mem_mb is None:
        return None
    return frozenset(
        node
        for node, size in sizes.items()
        if size.gpus >= gpus_per_node and (mem_mb is None or size.memory_mb >= mem_mb)
    )
