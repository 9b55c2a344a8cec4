"""A memory holder: one process per node of a job that keeps ranks' newest states in its memory.

The in-memory tier copies each rank's state, every `trainer.memory_ckpt_every` steps,
to the holder of its own node and to the holder of its partner node (hpctrain.checkpoint.
restore_point.partner_nodes). A holder outlives the training steps of its life: a relaunch on a
spare finds the lost node's ranks' states on the partner, and every other rank's on its own node,
without reading the disk. It holds what it is sent as bytes (it never imports torch: it starts in
tens of milliseconds and costs no more memory than what it holds):

    python -m hpctrain.recovery.memory_holder RUN_DIR --keep 2 --max-bytes N

It listens on TCP (an ephemeral port, on the node's address as the job's other processes see it:
hpctrain.run.node_address) and writes `host:port` to RUN_DIR/memory/NODE.addr once it listens.
Per rank it keeps the newest `keep` steps (two by default: while one rank's newest copy is still on
its way, the step before is whole on every rank). It never holds more than `max-bytes`: a copy
that would pass it drops that rank's oldest first, and is refused, saying the numbers, when it
still would not fit. The CopyStore below is the policy, apart from the sockets (its tests are
tables); wire format: hpctrain.run.memory_wire.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.run import memory_wire as wire
from hpctrain.run.node_address import rank0_address
from hpctrain.run.node_memory import available_bytes


class Refused(ValueError):
    """A copy the holder will not keep; the sentence says why and what to change."""


@dataclass
class CopyStore:
    """The copies a holder keeps: per rank, its newest `keep` steps, `max_bytes` in all."""

    keep: int = 2
    max_bytes: int = 0  # 0: no bound
    by_rank: dict[int, OrderedDict[int, tuple[bytes | bytearray, int]]] = field(default_factory=dict)
    held_bytes: int = 0

    def put(self, rank: int, step: int, payload: bytes | bytearray, crc: int) -> None:
        if wire.crc32(payload) != crc:
            raise Refused(f"rank {rank} step {step}: the copy arrived damaged (its checksum differs)")
        steps = self.by_rank.setdefault(rank, OrderedDict())
        own = sum(len(p) for p, _ in steps.values())
        if self._over(len(payload) - own):  # refused before anything is dropped: the older copies stay
            raise Refused(
                f"rank {rank} step {step}: a copy of {len(payload)} bytes does not fit in the holder's "
                f"{self.max_bytes} bytes ({self.held_bytes - own} held for other ranks); raise "
                "trainer.memory_max_gb or copy less often (trainer.memory_ckpt_every)"
            )
        self._drop(rank, step)  # sent again: the new copy replaces it
        while steps and (len(steps) >= self.keep or self._over(len(payload))):
            self._drop(rank, next(iter(steps)))
        steps[step] = (payload, crc)
        steps.move_to_end(step)
        self.held_bytes += len(payload)

    def _over(self, adding: int) -> bool:
        return self.max_bytes > 0 and self.held_bytes + adding > self.max_bytes

    def _drop(self, rank: int, step: int) -> None:
        held = self.by_rank.get(rank, OrderedDict()).pop(step, None)
        if held is not None:
            self.held_bytes -= len(held[0])

    def listing(self) -> list[list[int]]:
        """[rank, step, size] of every copy held."""
        return [[rank, step, len(p)] for rank, steps in sorted(self.by_rank.items()) for step, (p, _) in steps.items()]

    def get(self, rank: int, step: int) -> tuple[bytes | bytearray, int] | None:
        steps = self.by_rank.get(rank)
        return None if steps is None else steps.get(step)


class Holder:
    """The store behind a socket: one thread per connection, one lock around the store."""

    def __init__(self, store: CopyStore, token: str, node: str) -> None:
        self.store, self.token, self.node = store, token, node
        self.lock = threading.Lock()

    def serve(self, server: socket.socket) -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    began = time.thread_time()  # CPU only: the wait for the next request costs none
                    header, payload = wire.receive(conn)
                    reply, out = self.answer(header, payload)
                    if header.get("op") == "put":
                        # What keeping the copy cost this node's CPU: the rank counts it in a copy's cost.
                        reply["cpu_s"] = round(time.thread_time() - began, 6)
                    wire.send(conn, reply, out)
            except OSError:
                return  # the rank went away (its step ended): its connection with it

    def answer(self, header: dict, payload: bytes | bytearray) -> tuple[dict, bytes | bytearray]:
        if header.get("token") != self.token:
            return {"ok": False, "error": f"the memory holder on {self.node} serves another life of the job"}, b""
        op = header.get("op")
        try:
            rank, step = int(header.get("rank", -1)), int(header.get("step", -1))
        except (TypeError, ValueError):
            return {"ok": False, "error": f"rank and step must be integers: {header!r}"}, b""
        with self.lock:
            if op == "put":
                try:
                    self.store.put(rank, step, payload, int(header.get("crc32", -1)))
                except Refused as error:
                    return {"ok": False, "error": str(error)}, b""
                return {"ok": True}, b""
            if op == "list":
                return {"ok": True, "node": self.node, "copies": self.store.listing()}, b""
            if op == "get":
                held = self.store.get(rank, step)
                if held is None:
                    return {"ok": False, "error": f"no copy of rank {rank} at step {step} on {self.node}"}, b""
                return {"ok": True, "size": len(held[0]), "crc32": held[1]}, held[0]
        return {"ok": False, "error": f"unknown request {op!r}"}, b""


def listen(folder: Path, node: str, host: str) -> socket.socket:
    """The holder's socket, and FOLDER/NODE.addr naming it (written whole: a rank may read it at once)."""
    server = socket.create_server(("", 0), backlog=128)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{node}{wire.ADDR_SUFFIX}.tmp"
    tmp.write_text(f"{host}:{server.getsockname()[1]}\n")
    tmp.replace(folder / f"{node}{wire.ADDR_SUFFIX}")
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.recovery.memory_holder")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--keep", type=int, default=2, help="newest steps kept per rank")
    parser.add_argument(
        "--max-bytes", type=int, default=0, help="the most it holds (0: a quarter of the node's available memory)"
    )
    parser.add_argument("--suffix", default="", help="slurm.network.master_addr_suffix")
    parser.add_argument("--ifname", default="", help="slurm.network.master_addr_ifname")
    args = parser.parse_args(argv)
    token = os.environ.get(wire.TOKEN_ENV, "")
    if not token:
        print(f"memory holder: {wire.TOKEN_ENV} is not set: no ranks to serve", file=sys.stderr)
        return 2
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    host = rank0_address(node, args.suffix, args.ifname)
    server = listen(args.run_dir / "memory", node, host)
    max_bytes = args.max_bytes if args.max_bytes > 0 else (available_bytes() or 0) // 4
    Holder(CopyStore(keep=max(1, args.keep), max_bytes=max_bytes), token, node).serve(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
