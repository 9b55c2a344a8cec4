"""A sharded checkpoint's files on disk (hpctrain.checkpoint.sharded writes them): where they are,
whether they are whole, and the model's weights read from them in one process.

    step_00000120.dcp/    DCP's files and each rank's shard<rank>.sums
    step_00000120.json    the list of every file with its size and sha256 (written last)
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.format import check_readable
from hpctrain.checkpoint.store import sha256_of
from hpctrain.run import fencing
from hpctrain.run.paths import checkpoint_files


def shards_dir(folder: Path, step: int) -> Path:
    return checkpoint_files(folder, step).data.with_suffix(".dcp")


def write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: to a temporary name, synced, renamed (not by a replaced life:
    its checkpoint folder is the one beside the run dir's generations)."""
    fencing.check(path.parent.parent.parent if path.parent.suffix == ".dcp" else path.parent.parent)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as file:
        json.dump(value, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def file_problem(meta: dict[str, Any], target: Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """The first file of the checkpoint in `target` missing, torn or changed against its .json's
    `meta` (None: all whole). `share` (rank, ranks): check every ranks-th file from the rank-th,
    so the ranks of a load share the reading."""
    files = meta.get("files")
    if not isinstance(files, dict) or ".metadata" not in files:
        return "no list of its files"
    rank, ranks = share
    for index, (name, (size, digest)) in enumerate(sorted(files.items())):
        if index % ranks != rank:
            continue  # another rank's share
        path = target / name
        if not path.is_file():
            return f"{name}: missing"
        if path.stat().st_size != size:
            return f"{name}: {path.stat().st_size} bytes, expected {size} (torn write?)"
        if sha256_of(path) != digest:
            return f"{name}: checksum mismatch (corrupted)"
    return None


def read_model_weights(folder: Path, step: int) -> dict[str, torch.Tensor]:
    """The model's full weights from a sharded checkpoint, in one process without a process
    group (hpctrain-export): only the model's tensors are read, never the optimizer's. Raises
    ValueError when a file is missing, torn or changed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta_path = checkpoint_files(folder, step).meta
    meta = json.loads(meta_path.read_text())
    check_readable(meta, str(meta_path))
    target = shards_dir(folder, step)
    problem = file_problem(meta, target)
    if problem is not None:
        raise ValueError(f"{target}/{problem}")
    reader = FileSystemReader(str(target))
    stored = reader.read_metadata().state_dict_metadata
    weights = {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in stored.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.load({"model": weights}, storage_reader=reader, no_dist=True)
    return weights
