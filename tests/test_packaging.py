"""setup.cfg lists packages by hand (the conf/ and sbatch_templates/ links need it): every
package of the source tree must be in that list, or a wheel install breaks at import time.
tests/test_install.py installs each way for real; these checks are the cheap part."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Namespace packages: no __init__.py, shared with other distributions (Hydra's plugins).
NAMESPACES = {"hydra_plugins"}


def listed_packages() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return {line.strip() for line in parser["options"]["packages"].splitlines() if line.strip()}


def source_packages() -> set[str]:
    found = set()
    for top in ("hpctrain", "hydra_plugins"):
        # followlinks: hpctrain/conf and hpctrain/sbatch_templates are links to the top level.
        for folder, _, files in os.walk(ROOT / top, followlinks=True):
            if "__init__.py" in files:
                found.add(".".join(Path(folder).relative_to(ROOT).parts))
    return found | NAMESPACES


def test_every_source_package_is_listed_in_setup_cfg() -> None:
    missing = source_packages() - listed_packages()
    assert not missing, f"add to [options] packages in setup.cfg: {sorted(missing)}"


def test_every_listed_package_exists() -> None:
    stale = listed_packages() - source_packages()
    assert not stale, f"setup.cfg lists packages with no __init__.py: {sorted(stale)}"


def test_hydra_plugins_stays_a_namespace_package() -> None:
    # An __init__.py would shadow every other Hydra plugin installed beside hpctrain.
    assert (ROOT / "hydra_plugins").is_dir()
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists(), "hydra_plugins must have no __init__.py"
