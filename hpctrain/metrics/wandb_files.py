"""Reading back what an offline W&B run wrote: the steps in its `.wandb` files.

W&B writes each run's records (protobuf `Record` messages of wandb's own `wandb_internal_pb2`)
into `run-<id>.wandb`, framed as a LevelDB log: a 7-byte W&B header (":W&B", a magic number, a
version), then 32 KiB blocks of chunks, each with a 7-byte header (checksum, length, type).
wandb 0.20+ ships no Python reader for it (its Go core reads it for `wandb sync`), so this is
one. A run killed mid-write leaves a torn last chunk: reading stops there, as `wandb sync` does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
MAGIC = 0xBEE1
BLOCK = 32 * 1024
CHUNK = struct.Struct("<IHB")  # masked crc32c, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    """The serialized records of one .wandb file, up to a torn or unreadable end."""
    data = path.read_bytes()
    if len(data) < HEADER.size:
        return
    ident, magic, _ = HEADER.unpack_from(data)
    if ident != b":W&B" or magic != MAGIC:
        raise ValueError(f"{path}: not a W&B transaction log")
    offset, pending = HEADER.size, b""
    while True:
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK.size:
            offset += left_in_block  # the block's zero padding
            continue
        if offset + CHUNK.size > len(data):
            return
        _, length, kind = CHUNK.unpack_from(data, offset)
        body = data[offset + CHUNK.size : offset + CHUNK.size + length]
        if len(body) < length or kind not in (FULL, FIRST, MIDDLE, LAST):
            return  # torn by a killed writer
        offset += CHUNK.size + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        else:
            yield pending + body
            pending = b""


def logged_steps(path: Path) -> list[int]:
    """The `_step` of every history row in one .wandb file, in the order logged."""
    from wandb.proto import wandb_internal_pb2

    steps: list[int] = []
    for raw in records(path):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        try:
            record.ParseFromString(raw)
        except Exception:  # protobuf's DecodeError: a torn record's bytes
            return steps
        if record.WhichOneof("record_type") == "history":
            steps.append(record.history.step.num)
    return steps


def run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """Every life's file of one run under a `wandb/` folder, oldest first (names carry the time)."""
    return sorted(wandb_dir.glob(f"*-{run_id}/run-{run_id}.wandb"))


def last_logged_step(wandb_dir: Path, run_id: str) -> int:
    """The highest step any earlier life logged to this run offline; -1 when none."""
    return max((step for path in run_files(wandb_dir, run_id) for step in logged_steps(path)), default=-1)
