"""Which nodes meet a job's `--constraint`: the nodes a requeued job can ever run on.

A job submitted with `--constraint` (a site profile's `slurm.extra`, a user's own script) runs
only on nodes whose features satisfy it. When a requeue counts the nodes left to the job after
keeping failed ones out, a node without the features is no node for it: counted, it would let
the exclusion stand with too few nodes, and the job would wait for ever (Reason=BadConstraints).

Slurm's constraint language (sbatch(1), --constraint) has single features, AND (`&`), OR (`|`),
matching OR (`[a|b]`), counts (`a*2`), brackets and parentheses. The plain forms (one feature, or
features joined by all `&` or all `|`) are read here; for any other the answer is None (not known)
and every node counts, as before.
"""

from __future__ import annotations

import re

_FEATURE = re.compile(r"^[A-Za-z0-9_.:-]+$")


def parse_sinfo_features(text: str) -> dict[str, frozenset[str]]:
    """`sinfo -N -h -a -o '%N|%f'`: each node's available features (`(null)`: none). A node in
    two partitions shows twice, alike. Raises ValueError on a line of another shape."""
    features: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        node, bar, listed = line.partition("|")
        if not bar or not node:
            raise ValueError(f"sinfo line not of the form NODE|FEATURES: {line!r}")
        names = listed.strip()
        features[node] = frozenset() if names in ("", "(null)") else frozenset(names.split(","))
    return features


def nodes_meeting(constraint: str | None, features: dict[str, frozenset[str]]) -> frozenset[str] | None:
    """The nodes whose features satisfy `constraint` (the job record's Features=); None when the
    job has none, or when it is not one of the plain forms (then every node counts)."""
    if constraint is None or constraint in ("", "(null)"):
        return None
    for joiner, wanted in (("&", all), ("|", any)):
        names = constraint.split(joiner)
        if all(_FEATURE.match(name) for name in names):
            return frozenset(node for node, has in features.items() if wanted(name in has for name in names))
    return None
