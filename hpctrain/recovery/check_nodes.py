"""The control step's side of a relaunch's node check: hpctrain.recovery.node_check run on each
node at once, each its own one-task step, what came back as a fact (facts.Checked), and the
relaunch decided again on it (`checked_relaunch`).

One step per node, not one over all: a step over a node that died silently would wait for that
node, and so would the answer of every other. A node that printed no answer within the check's
time (Purpose.NODE_CHECK) did not run it: lost, whatever Slurm still lists.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from hpctrain.recovery.decision import Decision
from hpctrain.recovery.facts import Checked, ClusterView
from hpctrain.recovery.gather import Within
from hpctrain.recovery.node_check import NodeCheck
from hpctrain.run.causes import Action
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose

# Nodes checked at once: each check is an srun waiting on its node, no work here.
MOST_AT_ONCE = 64
# A relaunch's node check, all nodes at once: a node that answers does in a second or two.
NODE_CHECK_BUDGET_S = 20.0


def checked_relaunch(
    decided: Callable[[ClusterView], Decision],
    cluster: ClusterView,
    job_id: str,
    python: str,
    within: Within,
    slurm_answers: Callable[[], bool],
) -> Decision:
    """`decided(cluster)`; a relaunch once every node it may use was checked (each answers, and
    no process of the old step is left there), decided again on what the check found until it is
    no relaunch or nothing is left to check. No node answering while slurmctld does not answer
    either (`slurm_answers`) is slurmctld's outage, not the nodes' (srun could not create the
    checks' steps): the relaunch goes as decided, unchecked."""
    decision = decided(cluster)
    while decision.action is Action.RELAUNCH:
        unchecked = [n for n in cluster.allocated if n not in decision.excluded and n not in cluster.checked.nodes]
        if not unchecked:
            break
        within.renew(NODE_CHECK_BUDGET_S)
        found = check_nodes(job_id, unchecked, python, until=within.until)
        if found is None:
            break
        if found.unanswering == set(unchecked) and not slurm_answers():
            print("hpctrain: slurmctld gives no answer: the relaunch's nodes go unchecked", file=sys.stderr)
            break
        cluster = replace(cluster, checked=cluster.checked | found)
        decision = decided(cluster)
    return decision


def check_nodes(job_id: str, nodes: list[str], python: str, *, until: float | None = None) -> Checked | None:
    """Each of `nodes` checked by `python -m hpctrain.recovery.node_check` in a step of `job_id`
    (the raw SLURM_JOB_ID, which the tasks' environment names). None: no srun where this runs (an
    image without Slurm's commands), nothing was checked."""
    if not nodes:
        return Checked()
    with ThreadPoolExecutor(max_workers=min(len(nodes), MOST_AT_ONCE)) as pool:
        replies = list(pool.map(lambda node: _check(job_id, node, python, until), nodes))
    if all(reply.kind is client.Kind.MISSING for reply in replies):
        print(f"hpctrain: {replies[0].why()}; the relaunch's nodes go unchecked", file=sys.stderr)
        return None
    answers = {node: NodeCheck.parse(reply.stdout, node) for node, reply in zip(nodes, replies, strict=True)}
    for node, reply in zip(nodes, replies, strict=True):
        if answers[node] is None:
            print(
                f"hpctrain: node {node} did not answer the relaunch's check ({reply.why()}): it is left out",
                file=sys.stderr,
            )
    found = [answer for answer in answers.values() if answer is not None]
    for answer in found:
        if answer.lingering:
            pids = ",".join(map(str, answer.lingering))
            print(
                f"hpctrain: on {answer.node} the old step's processes {pids} would not end: it is left out",
                file=sys.stderr,
            )
    return Checked(
        nodes=frozenset(nodes),
        unanswering=frozenset(node for node, answer in answers.items() if answer is None),
        lingering=frozenset(answer.node for answer in found if answer.lingering),
        ended=sum(answer.ended for answer in found),
    )


def _check(job_id: str, node: str, python: str, until: float | None) -> client.Reply:
    command = [python, "-m", "hpctrain.recovery.node_check", job_id, node]
    return client.run_on_node(job_id, node, command, Purpose.NODE_CHECK, until=until)
