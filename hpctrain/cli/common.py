"""What every Hydra entry point does first: check the composed config, write config.yaml."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

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
    if run.config.exists():
        _refuse_a_different_config(run, resolved)
    save_resolved(resolved, run.config)
    return config, run


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def _refuse_a_different_config(run: RunDir, resolved: DictConfig) -> None:
    """Starting an existing run dir again resumes it, but only with the config it ran."""
    old = _flat(OmegaConf.to_container(OmegaConf.load(run.config)))
    new = _flat(OmegaConf.to_container(resolved))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if changed:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:5])
        print(
            f"error: {run.root} already holds a run with another config ({shown}"
            f"{', ...' if len(changed) > 5 else ''}); resume it with its own config or pick a new hydra.run.dir",
            file=sys.stderr,
        )
        sys.exit(2)


def _discard_if_empty(root: Path) -> None:
    if root.is_dir() and {p.name for p in root.iterdir()} <= _HYDRA_FILES:
        shutil.rmtree(root, ignore_errors=True)
