"""The run directory contract: the files users, tools and a requeued job read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model.pt"


def restrict_umask() -> int:
    """Never make a file or folder writable by everyone, whatever umask the user has (000 on
    some shared machines): add `o-w` to this process's umask, which every file hpctrain writes,
    Hydra's run dir, sbatch's job (SLURM_UMASK) and its slurm-%j.out inherit. Group write is
    the user's choice and stays. Returns the umask now in force."""
    mask = os.umask(0) | 0o002
    os.umask(mask)
    return mask


def remove_empty_parents(path: Path) -> None:
    """After removing a run dir made by a failed command: the folders Hydra made for it
    (`runs/<date>/`), as long as they are empty, up to but never including the current directory."""
    here = Path.cwd().resolve()
    parent = path.resolve().parent
    while parent != here and here in parent.parents:
        try:
            parent.rmdir()  # only an empty folder goes
        except OSError:
            return
        parent = parent.parent
