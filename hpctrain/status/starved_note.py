"""A job that waits for nodes it excludes itself, told with the command that lets it start.

The keeper's replacement is watched while it waits by the old job's guardian
(hpctrain.recovery.release), which lets a node back in service in by itself. A job requeued
under its own id, with the nodes that failed it kept out (ExcNodeList), is watched by nothing:
no hpctrain process runs while a job waits, and its guardian starts only once it ends. On a small
partition it can wait for ever (a node it excludes thawed and healthy, another drained), so
hpctrain-status says so, with Slurm's own command. The decision is the guardian's
(hpctrain.recovery.starved.to_release).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from hpctrain.recovery.facts import NodeState
from hpctrain.recovery.starved import reason_word, to_release
from hpctrain.slurm.hostlist import expand
from hpctrain.slurm.records import JobRecord

STARVED_REASON = "ReqNodeNotAvail"


def waits_for_nodes(state: str, reason: str | None) -> bool:
    """What a job starved by its own exclusion shows (squeue's Reason): ReqNodeNotAvail. A job
    waiting for `Resources` waits for its turn on a busy cluster, the common case, and is not
    asked about (hpctrain-status asks Slurm a fixed number of times however many runs it shows)."""
    return state == "PENDING" and reason_word(reason) == STARVED_REASON


def note(
    record: JobRecord, user_exclude: tuple[str, ...], nodes: Mapping[str, NodeState], partition: tuple[str, ...]
) -> str | None:
    """One line for the user when `record` waits for nodes it excludes itself, else None."""
    back = to_release(record, user_exclude, nodes, partition)
    if not back:
        return None
    keep = ",".join(sorted(set(expand(record.exc_node_list or "")) - set(back)))
    return (
        f"job {record.job_id} waits ({record.reason}) for nodes it excludes itself: {','.join(back)} "
        f"{'is' if len(back) == 1 else 'are'} back in service; "
        f"`scontrol update JobId={record.job_id} ExcNodeList={keep}` lets it start"
    )


def user_exclude(config_yaml: Path) -> tuple[str, ...]:
    """The run's own slurm.exclude (never let in), from its config.yaml."""
    try:
        config = yaml.safe_load(config_yaml.read_text())
        listed = config["slurm"]["exclude"]
        return tuple(expand(listed)) if listed else ()
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return ()


def notes(waiting: Sequence[tuple[str, Path]]) -> list[str]:
    """For each (job id, its run's config.yaml) of a job waiting for nodes: a note when its own
    exclusion starves it. Asks Slurm only when there is such a job: one scontrol for all of
    them, one sinfo, one scontrol per partition."""
    if not waiting:
        return []
    from hpctrain.recovery.release import node_states, partition_nodes
    from hpctrain.slurm import client
    from hpctrain.slurm.client import Purpose

    configs = dict(waiting)
    # An array task's record: JobId is its own number, the run names `<array>_<task>`.
    shown = client.show_jobs(list(configs), Purpose.LOOK).value
    asked = {
        record.job_id: name
        for record in shown
        for name in record.names
        if name in configs and record.exc_node_list and waits_for_nodes(record.state, record.reason)
    }
    records = [record for record in shown if record.job_id in asked]
    if not records:
        return []
    nodes = node_states(Purpose.LOOK)
    partitions: dict[str | None, tuple[str, ...]] = {}
    said: list[str] = []
    for record in records:
        if record.partition not in partitions:
            partitions[record.partition] = partition_nodes(record, Purpose.LOOK)
        try:
            line = note(record, user_exclude(configs[asked[record.job_id]]), nodes, partitions[record.partition])
        except ValueError:  # a node list it cannot read
            continue
        if line:
            said.append(line)
    return said
