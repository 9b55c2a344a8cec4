"""The old job's guardian watching the job its run goes on in while it waits: nodes it excludes
itself that are back in service are let in when it cannot start without them (the decision:
hpctrain.recovery.starved.to_release), and the journal gets `released`.
"""

from __future__ import annotations

import sys
import time

from hpctrain.recovery.facts import NodeState, parse_sinfo_nodes
from hpctrain.recovery.starved import WAITING_FOR_NODES, reason_word, to_release
from hpctrain.run.events import BY_GUARDIAN, Journal, Released
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.hostlist import expand
from hpctrain.slurm.node_columns import NodeColumns
from hpctrain.slurm.records import JobRecord

PAUSE_S = 15.0  # between two looks at the waiting job


def watch_replacement(job_id: str, user_exclude: tuple[str, ...], journal: Journal, deadline: float) -> None:
    """Until `job_id` starts or ends, or `deadline` (time.monotonic()): every call within it too."""
    while time.monotonic() + PAUSE_S < deadline:
        record = client.show_job(job_id, Purpose.GUARDIAN_LOOK, until=deadline).value
        if record is None or record.state != "PENDING":
            return  # it started, ended, or Slurm has no word: nothing to let in
        if reason_word(record.reason) in WAITING_FOR_NODES:
            try:
                nodes = node_states(Purpose.GUARDIAN_LOOK, deadline)
                back = to_release(record, user_exclude, nodes, partition_nodes(record, Purpose.GUARDIAN_LOOK, deadline))
            except ValueError as error:  # a node list it cannot read: left as it is
                print(f"hpctrain guardian: {error}", file=sys.stderr)
                return
            if back and _let_in(record, back, journal, deadline):
                return
        time.sleep(PAUSE_S)


def _let_in(record: JobRecord, back: list[str], journal: Journal, until: float) -> bool:
    keep = sorted(set(expand(record.exc_node_list or "")) - set(back))
    done = client.update_job(record.job_id, {"ExcNodeList": ",".join(keep)}, Purpose.UPDATE_PENDING, until=until)
    if not done.ok:
        print(f"hpctrain guardian: could not let {','.join(back)} in ({done.last_line})", file=sys.stderr)
        return False
    journal.write_event(Released(job_id=record.job_id, nodes=back, reason=record.reason, by=BY_GUARDIAN))
    print(
        f"hpctrain guardian: job {record.job_id} waited ({record.reason}) for nodes it excluded itself; "
        f"{','.join(back)} back in service: let in",
        file=sys.stderr,
    )
    return True


def node_states(purpose: Purpose, until: float | None = None) -> dict[str, NodeState]:
    """Every node's state as sinfo says it ({} when it does not answer)."""
    listed = client.nodes(NodeColumns.STATES, purpose, until=until)
    try:
        return parse_sinfo_nodes(listed.value) if listed.ok else {}
    except ValueError:
        return {}


def partition_nodes(record: JobRecord, purpose: Purpose, until: float | None = None) -> tuple[str, ...]:
    """The nodes of the job's partition (() when Slurm does not say)."""
    if record.partition is None:
        return ()
    nodes = client.show_partition(record.partition, purpose, until=until).value.get("Nodes")
    try:
        return tuple(expand(nodes)) if nodes and nodes != "(null)" else ()
    except ValueError:
        return ()
