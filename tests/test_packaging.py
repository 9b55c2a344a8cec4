"""setup.cfg lists packages by hand (the conf/ and sbatch_templates/ links need it): every
package of the source tree must be in that list, or a wheel install breaks at import time.
tests/test_install.py installs each way for real; these checks are the cheap part."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Namespace packages: no __init__.py, shared with other distributions (Hydra's plugins).
NAMESPACES = {"hydra_plugins"}


def setup_cfg_lines(key: str) -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = (line.strip() for line in parser["options"][key].splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def listed_packages() -> set[str]:
    return set(setup_cfg_lines("packages"))


def distribution_key(name: str) -> str:
    # Package indexes treat Jinja2, jinja2 and jinja_2 alike (PEP 503 normalisation).
    return re.sub(r"[-_.]+", "-", name).lower()


def required_distributions() -> set[str]:
    return {
        distribution_key(re.split(r"[ <>=!~;\[]", line, maxsplit=1)[0]) for line in setup_cfg_lines("install_requires")
    }


def imported_top_modules() -> set[str]:
    """The top-level names the shipped code imports anywhere (at the top or inside a function)."""
    found = set()
    for top in ("hpctrain", "hydra_plugins"):
        for source in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found


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


def test_every_required_distribution_is_imported() -> None:
    # install_requires names what the package uses: a requirement nothing imports is a download
    # (and a version constraint) every user pays for nothing.
    providers = importlib.metadata.packages_distributions()
    used = {distribution_key(dist) for module in imported_top_modules() for dist in providers.get(module, [])}
    unused = required_distributions() - used
    assert not unused, f"setup.cfg install_requires lists distributions nothing imports: {sorted(unused)}"
