"""hpctrain-status --detail: what the journal says about why a run is slow or why it stopped.

straggler: rank 1 on node2 2.71x its peers from step 300, cleared at step 360
straggler: rank 1 on node3 2.10x its peers from step 40, its node left for node4
node_health: node2 failed its scratch check in job 41 restart 0: 0.2 GB free in /tmp (...)
kept out: node2 (named by the failures of 2 lives in a row: slurm.health.keep_out_after_lives)
stopped: 3 lives in a row ended (crash this one) without a newer checkpoint (no_progress)
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.recovery.history import nodes_failing_in_a_row
from hpctrain.run.causes import Cause
from hpctrain.run.events import Event, Failure, Straggler, StragglerCleared, StragglerLeaving


def diagnosis_lines(events: Sequence[Event], keep_out_after_lives: int = 2) -> list[str]:
    return [*_stragglers(events), *_unhealthy(events, keep_out_after_lives), *_stopped(events)]


def _stragglers(events: Sequence[Event]) -> list[str]:
    """One line per rank and episode, the newest 5 episodes."""
    open_: dict[int, str] = {}
    on_node: dict[int, str] = {}  # an open episode's rank -> its node
    lines: list[str] = []
    for event in events:
        if isinstance(event, Straggler):
            for rank, node, slowdown in zip(event.ranks, event.nodes, event.slowdown):
                open_[rank] = f"straggler: rank {rank} on {node} {slowdown:.2f}x its peers from step {event.step}"
                on_node[rank] = node
        elif isinstance(event, StragglerCleared):
            for rank in event.ranks:
                if rank in open_:
                    lines.append(f"{open_.pop(rank)}, cleared at step {event.step}")
        elif isinstance(event, StragglerLeaving):  # trainer.straggler_action=relaunch: the node left
            spares = dict(zip(event.nodes, event.spares))
            for rank in [r for r in open_ if on_node[r] in spares]:
                lines.append(f"{open_.pop(rank)}, its node left for {spares[on_node[rank]]}")
    lines += [f"{line}, still slow at the last window" for line in open_.values()]
    return lines[-5:]


def _unhealthy(events: Sequence[Event], keep_out_after_lives: int) -> list[str]:
    """The newest 3 failed node checks, and the nodes kept out for failing lives in a row."""
    failed = [e for e in events if isinstance(e, Failure) and e.cause == Cause.NODE_HEALTH]
    lines = [
        f"node_health: {','.join(e.nodes or [])} failed its {e.check} check in job {e.job_id} "
        f"restart {e.restart}: {e.result}"
        for e in failed[-3:]
    ]
    kept_out = sorted(nodes_failing_in_a_row(events, keep_out_after_lives))
    if kept_out:
        lines.append(
            f"kept out: {','.join(kept_out)} (named by the failures of {keep_out_after_lives} lives in a row: "
            "slurm.health.keep_out_after_lives)"
        )
    return lines


def _stopped(events: Sequence[Event]) -> list[str]:
    """Why a run stopped itself rather than being requeued again."""
    ends = [e for e in events if isinstance(e, Failure) and e.cause in (Cause.NO_PROGRESS, Cause.BUDGET)]
    if not ends:
        return []
    last = ends[-1]
    return [
        f"stopped: {last.reason or last.cause} ({last.cause}); each life's own error is in its job's "
        "slurm-<job id>.out in the run dir"
    ]
