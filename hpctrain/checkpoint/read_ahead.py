"""The newest checkpoint read, and its checksums taken, while the rendezvous forms.

A life's start reads its checkpoint twice over before its first step: a sha256 of every byte (the
check that it is whole: hpctrain.checkpoint.store.verify, shard_files.file_problem) and then the
load itself. Both used to wait for the process group to form and the model to be built (which
imports torch._dynamo through the optimizer's constructor: a second or more). A thread started
before the rendezvous (`start`) now reads the files this rank will check, hashing as it reads:
file reads and sha256 release the GIL, so they overlap the rendezvous and the model's building.
The check then finds the checksum already taken (`sha256_of`, keyed by the file's identity:
path, size, mtime, inode; a file changed since is hashed again), and the load finds the bytes in
the page cache. Files this rank loads but does not check (rank 1 and up of a plain checkpoint)
are only read.

One reader a process (a training process starts once). It is stopped once the state is loaded
(`stop`): a life resumed from the in-memory tier never loads from disk, and its training must not
share the node's cores and disk with a read it does not need.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from hpctrain.run.paths import checkpoints_in

log = logging.getLogger(__name__)

BLOCK = 1 << 22  # 4 MiB a read: large enough that hashing releases the GIL, small enough to stop soon

_lock = threading.Lock()
_sums: dict[tuple[str, int, int, int], str] = {}  # a file's identity -> its sha256 (hex)
_busy: dict[str, threading.Event] = {}  # files the reader still has to hash, set once it has
_stop = threading.Event()


def _identity(path: Path) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def _digest(path: Path, stoppable: bool = False) -> str | None:
    """The file's sha256 as it is; None when `stoppable` (the reader) and stopped before its end."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(BLOCK), b""):
            if stoppable and _stop.is_set():
                return None
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """The file's sha256: remembered from the reader when it hashed this very file (waiting for it
    if it is hashing it now), else computed here."""
    with _lock:
        pending = _busy.get(str(path))
    if pending is not None:
        pending.wait()
    before = _identity(path)
    with _lock:
        known = _sums.get(before)
    if known is not None:
        return known
    digest = _digest(path)
    assert digest is not None  # not stoppable: always the whole file's
    return digest


def _hash_ahead(path: Path) -> None:
    try:
        before = _identity(path)
        digest = _digest(path, stoppable=True)
        if digest is not None and _identity(path) == before:  # unchanged while it was read
            with _lock:
                _sums[before] = digest
    except OSError as error:  # the check will meet the same error and say it
        log.debug("read-ahead of %s: %s", path, error)


def _read_ahead(path: Path) -> None:
    try:
        with open(path, "rb") as file:
            while not _stop.is_set() and file.read(BLOCK):
                pass
    except OSError as error:
        log.debug("read-ahead of %s: %s", path, error)


def files_to_read(folder: Path, rank: int, ranks: int) -> tuple[list[Path], list[Path]]:
    """(files to hash, files only to read) of the newest published checkpoint for this rank: of a
    plain one, rank 0 checks the .pt and the others load it; of a sharded one (a .dcp folder),
    each rank checks its share of the files its .json lists (shard_files.file_problem's share)."""
    newest = checkpoints_in(folder)
    if not newest:
        return [], []
    entry = newest[0]
    shards = entry.data.with_suffix(".dcp")
    if not shards.is_dir():
        return ([entry.data], []) if rank == 0 else ([], [entry.data])
    try:
        files = json.loads(entry.meta.read_text()).get("files")
    except (OSError, ValueError):
        return [], []
    if not isinstance(files, dict):
        return [], []
    return [shards / name for index, name in enumerate(sorted(files)) if index % ranks == rank], []


def start(folder: Path, rank: int, ranks: int) -> threading.Thread | None:
    """The reader of this rank's files of the newest checkpoint in `folder`, started (None: none)."""
    to_hash, to_read = files_to_read(folder, rank, ranks)
    if not to_hash and not to_read:
        return None
    _stop.clear()
    with _lock:
        for path in to_hash:
            _busy[str(path)] = threading.Event()

    def read() -> None:
        for path in to_hash:
            _hash_ahead(path)
            with _lock:
                done = _busy.pop(str(path), None)
            if done is not None:
                done.set()
        for path in to_read:
            _read_ahead(path)

    reader = threading.Thread(target=read, name="hpctrain-read-ahead", daemon=True)
    reader.start()
    return reader


def stop() -> None:
    """No more reading ahead: what is left is read by the load, if it needs it."""
    _stop.set()
    with _lock:
        waiting = list(_busy.values())
        _busy.clear()
    for event in waiting:
        event.set()  # a check waiting for the reader hashes the file itself
