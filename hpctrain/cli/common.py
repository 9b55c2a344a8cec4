"""What every Hydra entry point does first: check the composed config, write config.yaml."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain.config import Config, save_resolved, to_typed
from hpctrain.rundir import RunDir

# Hydra's own files in a fresh output dir; a run dir holding nothing else can go on a bad config.
_HYDRA_FILES = {".hydra"}


def prepare_run_dir(cfg: DictConfig) -> tuple[Config, RunDir]:
    """Check the config and write the run dir's config.yaml; on a bad config, print what to
    change, remove the run dir Hydra just made (if it holds nothing of a run) and exit 2."""
    hydra_cfg = HydraConfig.get()
    run = RunDir(Path(hydra_cfg.runtime.output_dir))
    try:
        config, resolved = to_typed(cfg, hydra_cfg.overrides.task)
    except ValueError as error:
        _discard_if_empty(run.root)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    save_resolved(resolved, run.config)
    return config, run


def _discard_if_empty(root: Path) -> None:
    if root.is_dir() and {p.name for p in root.iterdir()} <= _HYDRA_FILES:
        shutil.rmtree(root, ignore_errors=True)
