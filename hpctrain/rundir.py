"""Kept for imports written before hpctrain.run: the run dir's paths live in hpctrain.run.paths."""

from hpctrain.run.paths import (  # noqa: F401
    CheckpointFiles,
    RunDir,
    checkpoint_files,
    checkpoints_in,
    remove_empty_parents,
    restrict_umask,
)
