"""A run dir's `slurm` settings, read by the programs of a job that must not wait for Hydra (the
control step, its watcher, the keeper, the guardian): config.yaml's `slurm` node through the
schema, nothing else."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.config.slurm import SlurmConfig


def slurm_settings(config: Path) -> SlurmConfig:
    """config.yaml's `slurm` node through the schema: a key it lacks takes the schema's default
    (not 0), a wrong value is refused with the key named. Only this node: no torch, no Hydra."""
    try:
        loaded = OmegaConf.load(config)
        node = (loaded.get("slurm") if isinstance(loaded, DictConfig) else None) or {}
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SlurmConfig), node))
    except yaml.YAMLError as error:
        raise ValueError(f"{config}: not YAML ({str(error).splitlines()[0]})") from None
    except OmegaConfBaseException as error:  # a wrong type
        key, text = getattr(error, "full_key", None), str(error).splitlines()[0]
        raise ValueError(f"{config}: slurm.{key}: {text}" if key else f"{config}: {text}") from None
    except ValueError as error:  # a __post_init__ check: it names its key
        raise ValueError(f"{config}: {error}") from None
    assert isinstance(settings, SlurmConfig)  # to_object of SlurmConfig's schema
    return settings


def straggler_action(config: Path) -> str:
    """config.yaml's trainer.straggler_action (report or relaunch; "report" where the run's config
    has none): read alone, as the `slurm` node is, by the batch script's watcher."""
    try:
        loaded = OmegaConf.load(config)
        trainer = (loaded.get("trainer") if isinstance(loaded, DictConfig) else None) or {}
        action = str(trainer.get("straggler_action", "report"))
    except (yaml.YAMLError, OmegaConfBaseException) as error:
        raise ValueError(f"{config}: {str(error).splitlines()[0]}") from None
    if action not in ("report", "relaunch"):
        raise ValueError(f"{config}: trainer.straggler_action: must be report or relaunch (got {action!r})")
    return action
