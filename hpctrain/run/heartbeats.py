"""The datagrams on the heartbeat watcher's UDP port: a contract between separate processes.

The batch shell's watcher (hpctrain.recovery.watch) listens on one UDP port of the batch host and
names it `host:port` in ADDR_ENV for the training step. On that port:
  - each training process's beater (hpctrain.process.heartbeat) sends a `Beat` every BEAT_S
    seconds, and a last one with `bye` when its training process leaves;
  - the batch host's keeper (hpctrain.recovery.keeper, on another node) sends PING once every
    BEAT_S and the watcher answers PONG at once;
  - before the watcher ends a step whose node fell silent, it sends each live rank's beater a
    `StacksAsked` (to the address its beats come from): the beater has its training process dump
    every thread's stack (STACKS_SIGNAL, faulthandler) and writes the rank's hang report in the
    folder it names (hpctrain.run.hang_reports).
Beater, watcher and keeper may run different Pythons (a container's, slurm.control_python's) but
always the same hpctrain: the format is versioned all the same, so a stray packet or another
version is ignored, never taken for a beat. Standard library only: the watcher starts without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# The watcher's "host:port", set by the batch script for the training step; unset (a local run, a
# user's own srun) there is no watcher and no beater.
ADDR_ENV = "HPCTRAIN_HEARTBEAT_ADDR"
# Seconds between two beats of one rank, and between two of the keeper's pings.
BEAT_S = 1.0
VERSION = 1
# The keeper asks, the watcher answers: a batch host that stops answering has lost its batch
# script, or is silent itself.
PING, PONG = b"hpctrain-keeper-ping", b"hpctrain-keeper-pong"
# What a training process dumps its stacks on (faulthandler, from C: it answers while the main
# thread waits in a collective or holds the GIL). SIGURG: ignored by default, so a process that
# registered nothing for it is never harmed; no Python, torch or Slurm use of it.
STACKS_SIGNAL_NAME = "SIGURG"
_STACKS = b"hpctrain-stacks "


@dataclass(frozen=True)
class StacksAsked:
    """The watcher asks a beater for its rank's stacks: the hang reports' folder, and why."""

    folder: str  # RUN_DIR/hangs/<life>
    why: str  # "node2 silent for 10 s"

    def encode(self) -> bytes:
        return _STACKS + json.dumps({"v": VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> StacksAsked | None:
        if not data.startswith(_STACKS):
            return None
        try:
            record = json.loads(data[len(_STACKS) :])
            if not isinstance(record, dict) or record.get("v") != VERSION:
                return None
            return cls(folder=str(record["folder"]), why=str(record["why"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Beat:
    """One datagram: who beats, and whether it is the last (its training process ended)."""

    rank: int
    node: str
    step: str  # SLURM_STEP_ID of the training step
    pid: int  # the training process
    seq: int
    bye: bool = False

    def encode(self) -> bytes:
        return json.dumps({"v": VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Beat | None:
        """The beat a datagram carries; None for anything else (a stray packet, another version)."""
        try:
            record = json.loads(data)
            if not isinstance(record, dict) or record.get("v") != VERSION:
                return None
            return cls(
                rank=int(record["rank"]),
                node=str(record["node"]),
                step=str(record["step"]),
                pid=int(record["pid"]),
                seq=int(record["seq"]),
                bye=bool(record.get("bye", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def parse_addr(text: str) -> tuple[str, int]:
    """ADDR_ENV's value as (host, port); ValueError naming the variable for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{ADDR_ENV}={text!r} is not HOST:PORT")
    return host, int(port)
