"""The check a relaunch makes of each node it may run on, before its srun: the node answers, and
no process of the step it replaces is left there.

The control step's after-step (hpctrain.recovery.control) runs, once it has decided a relaunch,
a one-task step on each node the new step may use (its training nodes and its spares):

    srun --overlap --jobid=JOB --nodelist=NODE --ntasks=1 ... python -m hpctrain.recovery.node_check JOB NODE

On the node it SIGKILLs every training process of the job still there (hpctrain.run.rank_processes:
a rank of the old step that Slurm's kill did not reach, the kill delayed or lost while slurmctld
waits on a silent node; such a rank holds its GPU and trains on in a collective that never ends),
waits up to END_WAIT_S for them to be gone, and prints one line (NodeCheck): how many it ended,
and the pids that would not end (a process in uninterruptible sleep, stuck in a driver call).

What the control step makes of it (hpctrain.recovery.judge.relaunch): a node that printed no line
in time (NODE_CHECK_S; a spare that died silently while idle, a node Slurm still lists as up) is
lost, not used; a node whose old processes would not end is left out of the relaunch. Before,
a dead spare chosen for a relaunch failed the new step, charged as a crash, and a stale rank
went on holding what the new rank needed.

Standard library only: it starts in a moment, without torch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from hpctrain.run.rank_processes import training_processes

# How long the processes SIGKILLed get to be gone (the kernel frees a GPU's memory as it reaps).
END_WAIT_S = 5.0
POLL_S = 0.05
# The word that starts the line, so the control step never takes srun's own output for it.
WORD = "hpctrain-node-check"


@dataclass(frozen=True)
class NodeCheck:
    """One node's answer: `hpctrain-node-check NODE ended=N lingering=PID,...`."""

    node: str
    ended: int = 0  # old training processes this check ended
    lingering: tuple[int, ...] = ()  # those still there after END_WAIT_S

    def line(self) -> str:
        return f"{WORD} {self.node} ended={self.ended} lingering={','.join(map(str, self.lingering))}"

    @classmethod
    def parse(cls, text: str, node: str) -> NodeCheck | None:
        """The answer of `node` in a check's output; None when it printed none (a line of
        another node, srun's own messages, nothing)."""
        for line in text.splitlines():
            words = line.split()
            if len(words) != 4 or words[:2] != [WORD, node]:
                continue
            fields = dict(word.partition("=")[::2] for word in words[2:])
            try:
                ended = int(fields["ended"])
                lingering = tuple(int(pid) for pid in fields["lingering"].split(",") if pid)
            except (KeyError, ValueError):
                return None
            return cls(node, ended, lingering)
        return None


def check(job_id: str, node: str, wait_s: float = END_WAIT_S) -> NodeCheck:
    """End `job_id`'s training processes on `node` (this process and its parents aside)."""
    mine = _self_and_parents()
    found = training_processes(job_id, node, skip=mine)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    left = _alive(found)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = _alive(left)
    return NodeCheck(node, len(found) - len(left), tuple(left))


def _alive(pids: list[int]) -> list[int]:
    """Those of `pids` not gone: a zombie (ended, not reaped yet) holds nothing and counts as gone."""
    return [pid for pid in pids if _state(pid) not in ("", "Z", "X")]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _self_and_parents() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpctrain.recovery.node_check JOB NODE", file=sys.stderr)
        return 2
    print(check(argv[0], argv[1]).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
