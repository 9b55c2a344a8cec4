"""A replacement job that its own exclusions starve: which excluded nodes to let back in.

The keeper submits a run again without the batch host that fell silent (it may be frozen, still
up in Slurm's eyes), and a requeue keeps failed nodes out. Then the cluster changes under the
waiting job: the silent node thaws and is healthy again, while another node of the old job is
drained ("Kill task failed": its step could not be killed while the silent node held it). On a
small partition the new job then waits for ever, `Reason=ReqNodeNotAvail`, for nodes it excludes
itself (measured on a 3-node cluster: pending until an administrator resumed the drained node).

`to_release` is the decision, a pure function (tests/test_starved.py is its table): a PENDING job
waiting for nodes (not for its turn, its BeginTime or a dependency), that could start on the
nodes in service if it did not exclude some of them, gets those back, and only those: nodes the
user excluded (slurm.exclude) stay out, and a job that the nodes it may use can serve is left
alone (its exclusions still keep it off a node that failed it). The old job's guardian, which
starts when the keeper cancels the old job, watches the replacement while it waits
(hpctrain.recovery.guardian).
"""

from __future__ import annotations

from collections.abc import Mapping

from hpctrain.recovery.facts import NodeState, Service
from hpctrain.slurm.hostlist import expand
from hpctrain.slurm.records import JobRecord

# What Slurm says of a job that waits for nodes (its word before any `,_UnavailableNodes:...`).
WAITING_FOR_NODES = frozenset({"ReqNodeNotAvail", "Resources", "BadConstraints", "NodeDown"})


def reason_word(reason: str | None) -> str:
    """`ReqNodeNotAvail,_UnavailableNodes:node3` -> `ReqNodeNotAvail`."""
    return (reason or "").split(",", 1)[0]


def nodes_needed(record: JobRecord) -> int | None:
    """The fewest nodes the job starts on (NumNodes=2-2, =2, or a range 2-4)."""
    if not record.num_nodes:
        return None
    try:
        return int(record.num_nodes.split("-", 1)[0])
    except ValueError:
        return None


def to_release(
    record: JobRecord, user_exclude: tuple[str, ...], nodes: Mapping[str, NodeState], partition_nodes: tuple[str, ...]
) -> list[str]:
    """The nodes of `record`'s ExcNodeList to drop now (sorted), or [] to leave it as it is."""
    if record.state != "PENDING" or reason_word(record.reason) not in WAITING_FOR_NODES:
        return []
    needed = nodes_needed(record)
    listed = record.exc_node_list
    if needed is None or not listed or listed == "(null)":
        return []
    excluded = set(expand(listed)) - set(user_exclude)
    pool = set(partition_nodes or nodes) - set(user_exclude)
    in_service = {n for n in pool if n in nodes and nodes[n].service is Service.UP}
    if len(in_service - excluded) >= needed:
        return []  # the nodes it may use can serve it: it waits for its turn, not for its exclusions
    back = sorted(in_service & excluded)
    if len(in_service - excluded) + len(back) < needed:
        return []  # even with them it cannot start: nothing is gained by letting them in now
    return back
