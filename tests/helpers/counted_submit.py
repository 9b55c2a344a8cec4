"""`hpctrain-submit ARGS` with the costly steps counted, the counts written as JSON to the file
$HPCTRAIN_TEST_COUNTS at exit. A test compares counts (not seconds, which a busy machine
stretches) between sweeps of different sizes: what is done once per structure must not grow
with the points.

    python -m helpers.counted_submit -m optim.lr=... dry_run=true
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from collections import Counter
from typing import Any

import hydra.utils
import jinja2
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from hpctrain.config import yaml_text

counts: Counter[str] = Counter()


def count(owner: Any, name: str, label: str, size: bool = False, static: bool = False) -> None:
    """Wrap owner.name so that each call adds 1 to counts[label] (or, with size, the length of
    what it returns). `static`: owner.name is a class's staticmethod."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        counts[label] += len(result) if size else 1
        return result

    setattr(owner, name, staticmethod(counted) if static else counted)


def report() -> None:
    counts["torch imported"] = int("torch" in sys.modules)
    with open(os.environ["HPCTRAIN_TEST_COUNTS"], "w") as out:
        json.dump(counts, out)


count(OmegaConf, "load", "OmegaConf.load", static=True)  # reading a YAML file back into OmegaConf
count(OmegaConf, "to_object", "OmegaConf.to_object", static=True)  # the full structured check
count(ConfigLoaderImpl, "load_sweep_config", "composed")  # Hydra's composition
count(hydra.utils, "get_object", "imported targets")  # imports to read a signature (or build)
count(yaml_text, "dump", "YAML characters dumped", size=True)
count(jinja2.Environment, "__init__", "Jinja environments")  # each compiles the template again
count(jinja2.Template, "render", "renders")
count(HydraConfig, "set_config", "HydraConfig.set_config")  # copies the whole hydra node
atexit.register(report)

if __name__ == "__main__":
    from hpctrain.cli.submit import main

    sys.argv = ["hpctrain-submit", *sys.argv[1:]]
    main()
