"""Checkpoint files in the run dir's `checkpoints/` folder: atomic, self-checking, newest wins.

A checkpoint is two files:
    step_00000120.pt     torch.save of the state (loaded with weights_only=True)
    step_00000120.json   written last: size and sha256 of the .pt, step, reason
Each is written to a temporary name and renamed into place, so a checkpoint counts only when
its .json exists, and the .json is checked against the .pt before use. A torn or corrupt newest
checkpoint is skipped with a warning and the one before it is used.

A .pt without its .json is a write cut between its two renames (a kill, a node lost), or a
prune cut between its two unlinks. Either way the .pt is whole: it is renamed into place only
after it was written and fsynced. When no published checkpoint is newer and usable, it is
loaded (said in the log) rather than failing the run or starting it over.

A read that fails for the filesystem's own reasons is tried again and then raised as the OSError
it is, never taken for an unusable checkpoint (hpctrain.checkpoint.transient).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from hpctrain import faults
from hpctrain.checkpoint import read_ahead
from hpctrain.checkpoint.transient import transient, with_retries
from hpctrain.run import fencing
from hpctrain.run.paths import CheckpointFiles as Entry
from hpctrain.run.paths import checkpoint_files as paths_for
from hpctrain.run.paths import checkpoints_in as entries
from hpctrain.run.paths import unpublished_checkpoints_in

log = logging.getLogger(__name__)

# Refuses a checkpoint's .json or state by raising (hpctrain.checkpoint.format.check_readable):
# (what was read, where it was read from).
Check = Callable[[Mapping[str, Any], str], None]


class NoUsableCheckpoint(RuntimeError):
    """Checkpoints exist but none can be loaded: the run must not silently start over."""


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save computes a CRC32 of every record for the zip format: a second pass over every
    byte (~0.4 s of CPU for 2.4 GB) that the sha256 below already covers (torch.load does not
    need it). Switched off around our own saves where torch has the option (>= 2.6)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        yield
        return
    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


class WriteAbandoned(Exception):
    """The write was cancelled (WriteControl.cancel) before it was complete; nothing of it is left."""


class WriteControl:
    """Shared by a write and whoever started it: the bytes written so far, and a cancel request
    the write honours within one chunk (a forced save that cannot wait for it)."""

    def __init__(self, in_flight: Callable[[], None] | None = None) -> None:
        self.bytes_done = 0
        self.cancel = threading.Event()
        # Called once, right after the write's first bytes (a fault point: the write in flight).
        self.in_flight = in_flight


# A cancel request is seen within one chunk: 64 MiB take well under a second to hash and write.
CHUNK_BYTES = 64 << 20


class _HashingWriter(io.RawIOBase):
    """A file wrapper that hashes what passes through, so verifying costs no second read."""

    def __init__(self, file: BinaryIO, control: WriteControl) -> None:
        self.file = file
        self.control = control
        self.digest = hashlib.sha256()
        self.size = 0
        # torch.save hides an exception of ours behind its own "unexpected pos": kept to re-raise.
        self.error: BaseException | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, CHUNK_BYTES):
            self._write_chunk(view[start : start + CHUNK_BYTES])
        return view.nbytes

    def _write_chunk(self, chunk: memoryview) -> None:
        if self.control.cancel.is_set():
            self.error = WriteAbandoned(f"cancelled after {self.size} bytes")
            raise self.error
        self.digest.update(chunk)
        try:
            self.file.write(chunk)
        except OSError as error:
            self.error = error
            raise
        first = self.size == 0
        self.size += chunk.nbytes
        self.control.bytes_done = self.size
        if first and self.control.in_flight is not None:
            self.control.in_flight()


def fsync_dir(folder: Path) -> None:
    """Make the renames and unlinks in `folder` durable (its entries, not only its files)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(
    folder: Path, step: int, state: dict[str, Any], info: dict[str, Any], control: WriteControl | None = None
) -> Entry:
    """Write one checkpoint atomically. On any error (a full disk, a cancel through `control`)
    the temporary files are removed and the earlier checkpoints are untouched."""
    run_root = folder.parent
    fencing.check(run_root)  # a replaced life writes no checkpoint (hpctrain.run.generations)
    folder.mkdir(parents=True, exist_ok=True)
    entry = paths_for(folder, step)
    tmp_data = entry.data.with_name(entry.data.name + ".tmp")
    tmp_meta = entry.meta.with_name(entry.meta.name + ".tmp")
    published = False  # the .json is what makes a checkpoint count; before it, undo everything
    try:
        with open(tmp_data, "wb") as file:
            writer = _HashingWriter(file, control or WriteControl())
            try:
                with _without_zip_crc32():
                    torch.save(state, writer)  # type: ignore[arg-type]
            except Exception:
                if writer.error is not None:  # the real cause: a full disk, a quota, a cancel
                    raise writer.error from None
                raise
            if writer.control.cancel.is_set():  # asked after the last chunk: still not published
                raise WriteAbandoned(f"cancelled after all {writer.size} bytes")
            file.flush()
            os.fsync(file.fileno())
        fencing.check(run_root)  # replaced while writing: publish nothing
        os.replace(tmp_data, entry.data)
        faults.point("checkpoint.between_renames")
        meta = {"step": step, "size": writer.size, "sha256": writer.digest.hexdigest(), **info}
        tmp_meta.write_text(json.dumps(meta))
        os.replace(tmp_meta, entry.meta)
        published = True
        fsync_dir(folder)
    except fencing.Fenced:
        raise  # touch nothing more: the step's names may be the new life's by now
    except BaseException:
        leftovers = (tmp_data, tmp_meta) if published else (tmp_data, tmp_meta, entry.data)
        for path in leftovers:
            path.unlink(missing_ok=True)
        raise
    return entry


def has_any(folder: Path) -> bool:
    return folder.is_dir() and any(p.suffix in (".pt", ".json") for p in folder.iterdir())


def sha256_of(path: Path) -> str:
    """Taken while the rendezvous formed where the start read this file ahead (hpctrain.checkpoint.read_ahead)."""
    return read_ahead.sha256_of(path)


def verify(entry: Entry) -> dict[str, Any]:
    """The entry's metadata if its data file is whole and unchanged; raises ValueError if not."""
    try:
        meta = json.loads(entry.meta.read_text())
    except OSError as error:
        if transient(error):
            raise
        raise ValueError(f"{entry.meta.name}: unreadable ({error})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{entry.meta.name}: unreadable ({error})") from None
    if not entry.data.is_file():
        raise ValueError(f"{entry.data.name}: missing")
    size = entry.data.stat().st_size
    if size != meta.get("size"):
        raise ValueError(f"{entry.data.name}: {size} bytes, expected {meta.get('size')} (torn write?)")
    if sha256_of(entry.data) != meta.get("sha256"):
        raise ValueError(f"{entry.data.name}: checksum mismatch (corrupted)")
    return meta


def load_newest(folder: Path, check: Check | None = None) -> tuple[Entry, dict[str, Any]] | None:
    """The newest valid checkpoint's state, None when there are no checkpoints at all.

    Raises NoUsableCheckpoint when checkpoints exist but none passes the checks, and whatever
    `check` raises for the newest whole checkpoint's .json or state (a format not read here)."""
    problems: list[str] = []
    published = entries(folder)
    unpublished = unpublished_checkpoints_in(folder)
    for entry in sorted([*published, *unpublished], key=lambda e: e.step, reverse=True):
        if entry in published:
            try:
                meta = with_retries(entry.data.name, lambda: verify(entry))  # noqa: B023 (called here)
            except Exception as error:  # a bad file of any kind: try the one before
                if transient(error):
                    raise  # the filesystem, not the checkpoint: fail as a crash, try again later
                _unusable(problems, entry, error)
                continue
            # Another format is refused, not skipped: falling back would silently drop its steps.
            if check is not None:
                check(meta, str(entry.meta))
        else:
            log.warning(
                "checkpoint %s has no %s (its write or prune was cut between two renames); "
                "the .pt is whole (renamed only after it was synced): loading it",
                entry.data.name,
                entry.meta.name,
            )
        try:
            state = with_retries(entry.data.name, lambda: _read_state(entry.data))  # noqa: B023 (called here)
        except Exception as error:
            if transient(error):
                raise
            _unusable(problems, entry, error)
            continue
        if check is not None:
            check(state, str(entry.data))
        return entry, state
    if problems or has_any(folder):
        raise NoUsableCheckpoint(
            f"{folder} has checkpoints but none is usable:\n  "
            + "\n  ".join(problems or ["no complete checkpoint"])
            + "\nRefusing to start over; move the folder away to train from scratch."
        )
    return None


def _read_state(data: Path) -> dict[str, Any]:
    return torch.load(data, map_location="cpu", weights_only=True)


def _unusable(problems: list[str], entry: Entry, error: Exception) -> None:
    problems.append(f"{entry.data.name}: {error}")
    log.warning("checkpoint %s is not usable (%s); trying the one before", entry.data.name, error)


def looks_whole(entry: Entry) -> bool:
    """The cheap half of `verify`: the .json reads and the .pt has the size it records. A torn
    write (a node lost mid-write, a full disk) fails it; a checksum is left to the load."""
    try:
        size = json.loads(entry.meta.read_text()).get("size")
        return entry.data.stat().st_size == size
    except (OSError, ValueError, AttributeError):
        return False


def prune(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` whole checkpoints, the unpublished .pt files older than
    the ones kept, and stray temporary files. A torn checkpoint (its .json published, its .pt not
    the size it records) is never counted among those kept, which would leave fewer to resume
    from (none, were every kept one torn), and is deleted: no load can use it, and no write is
    under way on a published one. Called by the one writer after its write: no other write is
    under way (one would be newer than every published checkpoint). A replaced life prunes
    nothing: the files may be the new life's."""
    fencing.check(folder.parent)
    published = entries(folder)
    kept: list[Entry] = []
    for entry in published:
        whole = len(kept) < keep and looks_whole(entry)
        if whole:
            kept.append(entry)
            continue
        if len(kept) < keep:
            log.warning(
                "checkpoint %s is torn (not the size its %s records): deleted", entry.data.name, entry.meta.name
            )
        entry.meta.unlink(missing_ok=True)  # the marker first: a half-deleted checkpoint never counts
        entry.data.unlink(missing_ok=True)
    if kept:
        for entry in unpublished_checkpoints_in(folder):
            if entry.step < kept[-1].step:
                entry.data.unlink(missing_ok=True)
    for tmp in folder.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
