"""A running job on a node an administrator drains, told by hpctrain-status.

An administrator drains a node (`scontrol update NodeName=.. State=DRAIN Reason=..`) to take it
out for maintenance: Slurm starts nothing new there, and the jobs on it run on until they end. A
run on it trains on (it leaves the node at its next life, which Slurm places elsewhere); the user
should know, and when a reservation (a maintenance window) will take the node, when.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpctrain.recovery.facts import NodeState, Service


def drain_notes(
    running: Sequence[tuple[str, Sequence[str]]],
    states: Mapping[str, NodeState],
    reservations: Sequence[Mapping[str, str]] = (),
) -> list[str]:
    """One line for each (job id, its nodes) of a running job per node Slurm shows drained or
    draining, with the reservation that takes the node, if one names it."""
    lines = []
    for job_id, nodes in running:
        for node in nodes:
            state = states.get(node)
            if state is None or state.service is not Service.DRAINED:
                continue
            why = f" ({state.reason})" if state.reason and state.reason != "none" else ""
            taken = _reserved(node, reservations)
            lines.append(
                f"job {job_id} trains on {node}, which Slurm shows {state.state}{why}: the run trains on "
                f"there, and its next life is placed elsewhere{taken}"
            )
    return lines


def _reserved(node: str, reservations: Sequence[Mapping[str, str]]) -> str:
    from hpctrain.slurm.hostlist import expand

    for reservation in reservations:
        try:
            held = expand(reservation.get("Nodes", "") or "")
        except ValueError:
            continue
        if node in held:
            name, start = reservation.get("ReservationName", "?"), reservation.get("StartTime", "?")
            return f"; reservation {name} takes it from {start}"
    return ""


def notes(running: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """Asks Slurm only when a job runs: one sinfo, and the reservations only when a node drains."""
    if not running:
        return []
    from hpctrain.recovery.release import node_states
    from hpctrain.slurm import client
    from hpctrain.slurm.client import Purpose

    states = node_states(Purpose.LOOK)
    if not drain_notes(running, states):
        return []
    return drain_notes(running, states, client.show_reservations(Purpose.LOOK).value)
