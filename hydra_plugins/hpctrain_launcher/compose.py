"""Sweep points' configs, composed once per distinct set of structural overrides.

Hydra composes every sweep point from scratch (about 90 ms each, twice with the sweeper's
legality check), which made 100 points take half a minute to submit. Most sweeps change
values, not groups: the defaults list, and so the composition, depends only on group choices,
`+`/`~` overrides and `hydra.*` overrides. Those are composed once; the value overrides are
then applied exactly as Hydra applies them after composing (tests/test_sweep_compose.py checks
the result against Hydra's own per-point composition).
"""

import copy
from collections.abc import Iterator, Sequence

# Private Hydra API, pinned by setup.cfg's hydra-core>=1.3,<1.4: Hydra 1.3 has no public way to
# apply value overrides to a composed config, to ask whether a key names a config group (the
# public ConfigLoader hides its repository), or to build override_dirname. What these calls
# produce is checked point by point against Hydra's own composition in tests/test_sweep_compose.py.
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, open_dict


def _structural(override: Override, loader: ConfigLoaderImpl) -> bool:
    return (
        override.is_add()
        or override.is_force_add()
        or override.is_delete()
        or override.is_hydra_override()
        or override.package is not None
        or loader.repository.group_exists(override.key_or_group)
    )


def sweep_configs(
    loader: ConfigLoaderImpl, master: DictConfig, job_overrides: Sequence[Sequence[str]]
) -> Iterator[DictConfig]:
    parser = OverridesParser.create()
    composed: dict[tuple[str, ...], DictConfig] = {}
    for overrides in job_overrides:
        parsed: list[Override] = parser.parse_overrides(list(overrides))
        structural = tuple(o.input_line for o in parsed if _structural(o, loader))
        if structural not in composed:
            composed[structural] = loader.load_sweep_config(master, list(structural))
        config = copy.deepcopy(composed[structural])
        values = [o for o in parsed if not _structural(o, loader)]
        ConfigLoaderImpl._apply_overrides_to_config(values, config)
        app = [o for o in parsed if not o.is_hydra_override()]
        with open_dict(config.hydra):
            config.hydra.overrides.task = [o.input_line for o in app]
            dirname = config.hydra.job.config.override_dirname
            config.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
            )
        yield config
