"""The wire between a rank and a memory holder (hpctrain.recovery.memory_holder): one message is a
4-byte length, a JSON header, and `size` bytes of payload where the header has a size.

Requests: `put` (rank, step, size, crc32; the payload is the rank's serialized state), `list` (the
copies held), `get` (rank, step; answered with the payload). Every request carries the life's
token (HPCTRAIN_MEMORY_TOKEN, drawn by the batch shell for the life): a holder answers only its
own job's ranks, and a rank that reaches a holder of an earlier life (its address file left
behind) is told so instead of being given another life's states. Answers: `ok`, and `error` (a
sentence) when not. Standard library only: the holder starts without torch.
"""

from __future__ import annotations

import json
import socket
import struct
import zlib
from typing import Any

TOKEN_ENV = "HPCTRAIN_MEMORY_TOKEN"
# Each holder's address, `host:port`, in RUN_DIR/memory/NODE.addr (RunDir.memory).
ADDR_SUFFIX = ".addr"
_LENGTH = struct.Struct("!I")
# A header is a few hundred bytes; a longer one is another protocol talking to the port.
MAX_HEADER_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20


class WireError(OSError):
    """The other end closed, answered garbage, or refused (its sentence)."""


def crc32(payload: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(payload) & 0xFFFFFFFF


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> None:
    data = json.dumps(header).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)
    if payload:
        sock.sendall(payload)


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], min(CHUNK_BYTES, size - got))
        if n == 0:
            raise WireError(f"the other end closed after {got} of {size} bytes")
        got += n
    return buffer


def receive(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    """One message: its header and its payload (empty where the header has no size)."""
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a header of {length} bytes: not hpctrain's memory protocol")
    try:
        header = json.loads(bytes(_exactly(sock, length)))
    except ValueError as error:
        raise WireError(f"a header that is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise WireError("a header that is not a JSON object")
    size = header.get("size", 0)
    if not isinstance(size, int) or size < 0:
        raise WireError(f"a payload size of {size!r}")
    return header, (_exactly(sock, size) if size else bytearray())
