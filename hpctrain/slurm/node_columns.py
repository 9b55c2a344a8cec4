"""What `hpctrain.slurm.client.nodes` asks sinfo to list for each node (`sinfo -o` formats), and
how one listing of all columns splits into the listing each parser reads."""

from __future__ import annotations

from enum import Enum


class NodeColumns(Enum):
    """What `nodes` lists for each node (sinfo -o), one line per node and partition."""

    STATES = "%N|%T|%E"  # name, state with sinfo's flags (`down*`), reason (hpctrain.recovery.facts)
    FEATURES = "%N|%f"  # name, available features (hpctrain.recovery.constraints)
    SIZES = "%N|%G|%m"  # name, generic resources, memory in MB (hpctrain.recovery.node_sizes)
    # All three in one call (the reason last: it is free text); `split_columns` gives each back.
    ALL = "%N|%T|%f|%G|%m|%E"


def split_columns(listed: str) -> dict[NodeColumns, str]:
    """One `NodeColumns.ALL` listing as the three listings each parser reads, line for line."""
    views: dict[NodeColumns, list[str]] = {NodeColumns.STATES: [], NodeColumns.FEATURES: [], NodeColumns.SIZES: []}
    for line in listed.splitlines():
        if not line.strip():
            continue
        words = line.split("|", 5)
        if len(words) != 6:
            raise ValueError(f"sinfo line {line!r} is not {NodeColumns.ALL.value}")
        name, state, features, gres, memory, reason = words
        views[NodeColumns.STATES].append(f"{name}|{state}|{reason}")
        views[NodeColumns.FEATURES].append(f"{name}|{features}")
        views[NodeColumns.SIZES].append(f"{name}|{gres}|{memory}")
    return {columns: "".join(f"{line}\n" for line in lines) for columns, lines in views.items()}
