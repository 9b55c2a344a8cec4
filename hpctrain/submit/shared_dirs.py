"""A submitted job's run dir must be one folder that every node of the job sees.

A run dir under /tmp (or another folder each machine has its own of) is written by the submit on
this machine, and each node of the job would read and write its own, empty, copy: the batch
script finds no config, the ranks of other nodes no checkpoint, and a resume starts from nothing.
slurm.node_local_dirs lists such folders; a job of more than one node (training and spare nodes)
whose run dir is under one is refused at the submit, naming the key to change.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def node_local_dir(run_dir: Path, local_dirs: Sequence[str]) -> str | None:
    """The folder of `local_dirs` that `run_dir` is in (symlinks followed), or None."""
    real = Path(os.path.realpath(run_dir))
    for folder in local_dirs:
        if real == Path(folder) or Path(os.path.realpath(folder)) in (real, *real.parents):
            return folder
    return None


def node_local_refusal(run_dir: Path, nodes: int, local_dirs: Sequence[str], key: str) -> str | None:
    """Why a job of `nodes` nodes cannot keep its run dir at `run_dir` (`key` names it), or None."""
    if nodes < 2:
        return None
    folder = node_local_dir(run_dir, local_dirs)
    if folder is None:
        return None
    return (
        f"{key}: {run_dir} is under {folder}, which each node has its own of (slurm.node_local_dirs), "
        f"but the job spans {nodes} nodes: each would write a run dir of its own. Pick a folder every "
        "node sees (your home, a shared scratch), or set slurm.node_local_dirs=[] if this one is shared"
    )
