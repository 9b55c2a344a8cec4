"""A rank's side of the memory holders (hpctrain.recovery.memory_holder): send a copy, ask what
is held, fetch a copy back.

A rank keeps one connection per holder it talks to (its own node's and its partner's) and opens
it again once when it finds it closed. Every call has a timeout: a holder on a node that died
silently answers nothing, and the rank must go on training (a copy not sent is a step the tier
does not have, never a stop). The holders' addresses are files in RUN_DIR/memory (one per node,
`host:port`, written by each holder once it listens).
"""

from __future__ import annotations

import socket
from pathlib import Path

from hpctrain.checkpoint.restore_point import HeldCopy
from hpctrain.run import memory_wire as wire
from hpctrain.run.memory_wire import ADDR_SUFFIX


def holder_addresses(folder: Path) -> dict[str, str]:
    """Node name -> `host:port` of the holders that wrote their address to `folder`."""
    found = {}
    for path in sorted(folder.glob(f"*{ADDR_SUFFIX}")):
        text = path.read_text().strip()
        if text:
            found[path.name[: -len(ADDR_SUFFIX)]] = text
    return found


class HolderClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.address = (host, int(port))
        self.token = token
        self.timeout_s = timeout_s
        self.sock: socket.socket | None = None

    def _request(self, header: dict, payload: bytes | bytearray | memoryview = b"") -> tuple[dict, bytearray]:
        header = {**header, "token": self.token}
        for attempt in (1, 2):
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(self.address, timeout=self.timeout_s)
                wire.send(self.sock, header, payload)
                reply, out = wire.receive(self.sock)
                break
            except OSError:
                self.close()
                if attempt == 2:
                    raise
        if not reply.get("ok"):
            raise wire.WireError(str(reply.get("error") or f"refused: {reply!r}"))
        return reply, out

    def put(self, rank: int, step: int, payload: bytes | bytearray | memoryview) -> float:
        """Keep this copy of RANK's state at STEP; raises WireError with the holder's reason. The
        CPU seconds keeping it took the holder (receiving, checking, storing)."""
        header = {"op": "put", "rank": rank, "step": step, "size": len(payload), "crc32": wire.crc32(payload)}
        reply, _ = self._request(header, payload)
        return float(reply.get("cpu_s", 0.0))

    def listing(self) -> list[HeldCopy]:
        reply, _ = self._request({"op": "list"})
        node = str(reply.get("node", ""))
        return [HeldCopy(rank=int(rank), step=int(step), node=node) for rank, step, _size in reply.get("copies", [])]

    def get(self, rank: int, step: int) -> bytearray:
        reply, payload = self._request({"op": "get", "rank": rank, "step": step})
        if wire.crc32(payload) != reply.get("crc32"):
            raise wire.WireError(f"rank {rank} step {step}: the copy came back damaged (its checksum differs)")
        return payload

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
