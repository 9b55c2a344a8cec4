"""hpctrain's commands compose their config once: Hydra's first composition (only to read
`hydra.mode`) is skipped where it could only find the key unset (hpctrain/cli/compose_once.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from hpctrain.cli import compose_once
from hpctrain.cli import submit as _submit  # noqa: F401  (each command puts its schema in Hydra's store)
from hpctrain.cli import train as _train  # noqa: F401
from hpctrain.cli import tune as _tune  # noqa: F401

PRIMARY_CONFIGS = ["config", "submit", "tune"]  # hpctrain-train, hpctrain-submit, hpctrain-tune


@pytest.fixture
def hydra_of(tmp_path: Path) -> Iterator[object]:
    """A Hydra on hpctrain's configs (and, for the user's folder, on `tmp_path` first)."""

    def make(config_dir: Path | None = None) -> Hydra:
        search_path = create_config_search_path("pkg://hpctrain.conf")
        if config_dir is not None:
            search_path.prepend(provider="command-line", path=f"file://{config_dir}")
        GlobalHydra.instance().clear()  # one Hydra at a time
        return Hydra.create_main_hydra2(task_name="test", config_search_path=search_path)

    yield make
    GlobalHydra.instance().clear()


def _mode(hydra: Hydra, name: str, overrides: list[str]) -> RunMode | None:
    """hydra.mode as Hydra's get_mode composes it, but raising where get_mode would answer None
    for a config that does not compose."""
    cfg = hydra.compose_config(
        config_name=name,
        overrides=overrides,
        with_log_configuration=False,
        run_mode=RunMode.MULTIRUN,
        validate_sweep_overrides=False,
    )
    return cfg.hydra.mode


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_hpctrains_own_configs_leave_the_mode_unset(hydra_of, name: str) -> None:
    # What the skip relies on: composed as Hydra's get_mode does, nothing sets hydra.mode.
    assert _mode(hydra_of(), name, []) is None
    assert _mode(hydra_of(), name, ["hydra.run.dir=x", "hydra.sweep.dir=y"]) is None
    assert compose_once.HYDRAS_GET_MODE(hydra_of(), config_name=name, overrides=[]) is None


def test_what_the_skip_leaves_to_hydra_does_set_the_mode(hydra_of, tmp_path: Path) -> None:
    # An override of hydra.mode and another primary config are real ways to set it: the table
    # below hands both to Hydra's own get_mode.
    assert _mode(hydra_of(), "config", ["hydra.mode=MULTIRUN"]) == RunMode.MULTIRUN
    assert compose_once.HYDRAS_GET_MODE(hydra_of(), "config", ["hydra.mode=MULTIRUN"]) == RunMode.MULTIRUN
    (tmp_path / "config.yaml").write_text("hydra:\n  mode: MULTIRUN\nx: 1\n")
    assert _mode(hydra_of(tmp_path), "config", []) == RunMode.MULTIRUN


@pytest.mark.parametrize(
    ("argv", "unset"),
    [
        ([], True),
        (["slurm.nodes=2", "optim.lr=3e-4"], True),
        (["-m", "optim.lr=1e-4,3e-4", "model=convnet,mlp"], True),
        (["hydra.run.dir=runs/x", "hydra.sweep.dir=s", "hydra.job.chdir=false"], True),
        (["+trainer.extra=1", "~data.augment"], True),
        (["hydra.mode=MULTIRUN"], False),
        (["+hydra.mode=RUN"], False),
        (["++hydra.mode=RUN"], False),
        (["hydra/launcher=basic"], False),
        (["hydra=custom"], False),
        (["--config-dir", "conf"], False),
        (["--config-dir=conf"], False),
        (["-cd", "conf"], False),
        (["-cn", "other"], False),
        (["--config-name=other"], False),
        (["-cp", "pkg://other"], False),
        (["--config-path", "conf"], False),
    ],
)
def test_the_skip_applies_only_to_command_lines_that_cannot_set_the_mode(argv: list[str], unset: bool) -> None:
    assert compose_once.mode_is_unset(argv) is unset
