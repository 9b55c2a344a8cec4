"""Config: the schema, its checks, and the one conversion from Hydra's DictConfig to typed objects.

The entry points call `to_typed` once; everything below them takes a `Config`. A job never
composes Hydra configs again: it runs `load_run_config(run_dir)`, the resolved `config.yaml`
written at launch time, so a requeued job runs exactly what was submitted.

The schema is split by section: schema.py (the root, data, trainer, metrics), slurm.py, network.py,
tune.py with search_space.py (the grammar of tune.params). May import: run, slurm; never tune.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.config import fits, setup_lines, yaml_text
from hpctrain.config.schema import Config, DataConfig, TrainerConfig
from hpctrain.errors import UserError
from hpctrain.run.paths import RunDir

__all__ = [
    "Config",
    "DataConfig",
    "TrainerConfig",
    "register",
    "to_typed",
    "load_run_config",
    "save_resolved",
    "fingerprint",
    "identity",
    "differences",
]

SCHEMA_NAME = "hpctrain_schema"

# The `_target_` nodes and how hpctrain calls them: (key, leading positional args, injected kwargs).
TARGET_NODES: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("model", 0, ()),
    ("data.dataset", 0, ()),
    ("optim", 1, ()),  # the parameters
    ("sched", 1, ("total_steps",)),  # the optimizer
    ("loss", 0, ()),
)


# Drawn once per command: `${hpctrain_token:}` in the default run and sweep dirs, so two commands
# started in the same second (a loop, two login nodes) never name the same run dir.
COMMAND_TOKEN = secrets.token_hex(3)
if not OmegaConf.has_resolver("hpctrain_token"):
    # Cached in the config, as Hydra caches `${now:...}`: a launcher that runs the task in another
    # process (hydra-submitit-launcher pickles the config to the job) names the same dirs there.
    OmegaConf.register_new_resolver("hpctrain_token", lambda: COMMAND_TOKEN, use_cache=True)


def register() -> None:
    """Put the schema in Hydra's ConfigStore; conf/config.yaml lists it first in its defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


def _overridden_keys(overrides: Iterable[str]) -> set[str]:
    """`model.width` for `model.width=3`, `+model.width=3`, `++model.width=3`."""
    keys = set()
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def _plain_node(tree: Any, dotted: str) -> Any:
    for part in filter(None, dotted.split(".")):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _node(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def to_typed(cfg: DictConfig, overrides: Iterable[str] = ()) -> tuple[Config, DictConfig]:
    """Check a composed config and convert it: (typed Config, resolved DictConfig to save).
    A `hydra` node, if present (a sweep point's config), is left out.

    Raises ValueError naming the key to change; nothing has been written when it does."""
    from hpctrain.config import targets  # imports Hydra: not for the control step's schema alone

    setup_lines.check_interpolations(cfg)
    plain = resolved_plain(cfg)
    overridden = _overridden_keys(overrides)
    for key, _, _ in TARGET_NODES:
        parent, _, name = key.rpartition(".")
        holder = _plain_node(plain, parent)
        if isinstance(holder, dict) and isinstance(holder.get(name), dict) and f"{key}._target_" in overridden:
            targets.drop_foreign_arguments(holder[name], key, overridden)
    resolved = OmegaConf.create(plain)
    config = _structured(resolved)
    problem = fits.check_values(plain) or fits.check_fit(plain)
    if problem:
        raise ValueError(problem)
    for key, positional, injected in TARGET_NODES:
        node = _node(config, key)
        if node is not None:
            targets.check(node, key, positional, injected)
            targets.preflight(node, key)
    return config, resolved


def resolved_plain(cfg: DictConfig) -> dict[str, Any]:
    """The config less its `hydra` node, resolved into plain dicts and lists; ValueError naming
    the key of a missing value or a failed interpolation."""
    try:
        return {
            str(key): OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=True)
            if OmegaConf.is_config(cfg[key])
            else cfg[key]
            for key in cfg
            if key != "hydra"
        }
    except OmegaConfBaseException as error:
        raise ValueError(omegaconf_message(error)) from None


def omegaconf_message(error: OmegaConfBaseException) -> str:
    key = getattr(error, "full_key", None)
    text = str(error).splitlines()[0]
    if "Missing mandatory value" in text and key:
        return f"{key}: no value; set {key}=..."
    return f"{key}: {text}" if key else text


def _structured(plain: DictConfig) -> Config:
    """Merge plain values into the schema (type checks) and build the dataclasses (value checks)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), plain)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        cause = error.__cause__
        if isinstance(cause, ValueError) and not isinstance(cause, OmegaConfBaseException):
            raise ValueError(str(cause)) from None  # a __post_init__ check
        raise ValueError(omegaconf_message(error)) from None
    assert isinstance(config, Config)  # to_object of Config's schema is always a Config
    return config


def resolved_yaml(resolved: DictConfig | dict[str, Any] | list[Any]) -> str:
    """config.yaml's text: what OmegaConf.to_yaml writes (OmegaConf.save, for a list)."""
    plain = OmegaConf.to_container(resolved, enum_to_str=True) if isinstance(resolved, DictConfig) else resolved
    return yaml_text.dump_mapping(plain) if isinstance(plain, dict) else yaml_text.dump(plain)


def save_resolved(resolved: DictConfig | dict[str, Any], path: Path) -> None:
    """Write atomically: a reader never sees half a config."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(resolved_yaml(resolved))
    tmp.replace(path)


def load_run_config(run_dir: Path) -> Config:
    """The config a job runs: the run dir's resolved config.yaml, checked again."""
    path = RunDir(Path(run_dir)).config
    if not path.is_file():
        raise UserError(f"{path}: no config.yaml; is {run_dir} a run directory?")
    saved = OmegaConf.load(path)
    if not isinstance(saved, DictConfig):
        raise UserError(f"{path}: holds a list, not the config's keys (edited by hand since it was written?)")
    try:
        return _structured(saved)
    except ValueError as error:  # edited by hand since it was written
        raise UserError(f"{path}: {error}") from None


# The config keys a checkpoint must agree with to be resumed: the model, the data and the
# optimizer kind (a learning rate may change between lives of a run; the model may not).
_IDENTITY_KEYS = {
    "model": "model",
    "dataset": "data.dataset",
    "optim": "optim._target_",
    "batch_size": "data.batch_size",
    "grad_accum": "trainer.grad_accum",
}


def _identity_parts(config: Config) -> dict[str, Any]:
    return {
        "model": config.model,
        "dataset": config.data.dataset,
        "optim": config.optim.get("_target_"),
        "batch_size": config.data.batch_size,
        "grad_accum": config.trainer.grad_accum,
    }


def identity(config: Config) -> dict[str, Any]:
    """What `fingerprint` hashes, by config key (`model`, `data.dataset`, ...), as plain JSON
    values: checkpoints record it so that a refusal can say what differs."""
    parts = json.loads(json.dumps(_identity_parts(config), default=str))
    return {_IDENTITY_KEYS[name]: value for name, value in parts.items()}


def fingerprint(config: Config) -> str:
    """A short hash of `identity`, recorded in every checkpoint and compared on resume."""
    what = _identity_parts(config)
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def differences(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> str:
    """`key: old -> new, ...` for the leaves that differ between two nested dicts ('' if none)."""
    before, after = _flat(old), _flat(new)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed[:limit])
    return shown + (", ..." if len(changed) > limit else "")
