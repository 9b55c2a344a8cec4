"""The sweep launcher's composition (once per group choice) equals Hydra's, point by point."""

from __future__ import annotations

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from hpctrain import config as hconfig
from hydra_plugins.hpctrain_launcher.compose import _parse, sweep_configs

POINTS = [
    ["optim.lr=0.1"],
    ["optim.lr=0.2", "trainer.seed=3"],
    ["model=mlp", "optim.lr=0.3"],
    ["model=mlp", "model.hidden=[8,8]"],
    ["model=gpt", "data=tokens", "model.n_layer=2", "data.dataset.vocab_size=64"],
    ["optim=sgd", "+optim.nesterov=true"],
    ["slurm.nodes=3", "cluster=devcluster"],
    # Back to the first structure: the values the points above set are undone.
    ["optim.lr=0.4", "data.batch_size=8", "slurm.setup=[module load x]"],
    ["trainer.max_steps=7"],
    ["model=gpt", "data=tokens", "data.dataset.seq_len=16"],  # model.block_size follows by interpolation
    # A scalar over the last point's scalar is set without putting the composed value back first;
    # the keys the point does not set still are put back.
    ["trainer.seed=5", "optim.lr=0.6", "model.channels=[2,2]"],
    ["optim.lr=0.7", "model.channels=[3]"],
    ["optim.lr=null"],
    ["model=gpt", "data=tokens", "data.dataset.seq_len=8"],
]


@pytest.fixture(scope="module")
def loader_and_master():
    hconfig.register()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("submit", overrides=[], run_mode=RunMode.MULTIRUN)
        yield loader, master


def job_part(cfg):
    return {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
        for k in cfg
        if k != "hydra"
    }


def test_same_configs_as_hydra(loader_and_master) -> None:
    loader, master = loader_and_master
    compared = 0
    # Points of one structure share one config object, set to each point in turn: compare each
    # before asking for the next.
    for point, mine in zip(POINTS, sweep_configs(loader, master, POINTS)):
        hydras = loader.load_sweep_config(master, point)
        assert job_part(mine) == job_part(hydras), point
        assert list(mine.hydra.overrides.task) == list(hydras.hydra.overrides.task)
        assert mine.hydra.job.override_dirname == hydras.hydra.job.override_dirname
        assert dict(mine.hydra.runtime.choices) == dict(hydras.hydra.runtime.choices)
        compared += 1
    assert compared == len(POINTS)


def test_points_do_not_leak_into_each_other(loader_and_master) -> None:
    """A value one point set is back to the composed one for the next point."""
    loader, master = loader_and_master
    points = [["optim.lr=0.5", "model.channels=[4,4]"], ["trainer.seed=9"], ["optim.lr=0.25"]]
    default = loader.load_sweep_config(master, [])
    seen = [(cfg.optim.lr, cfg.trainer.seed, list(cfg.model.channels)) for cfg in sweep_configs(loader, master, points)]
    channels = list(default.model.channels)
    assert seen == [
        (0.5, default.trainer.seed, [4, 4]),
        (default.optim.lr, 9, channels),
        (0.25, default.trainer.seed, channels),
    ]


@pytest.mark.parametrize(
    "value",
    ["1e-05", "10", "-3", "0", "-0", "0.5", "1.", ".5", "-.5", "1E5", "1.e3", "-1.5e+3", "1_000", "007", "00.5", "5e"],
)
def test_number_lines_are_read_as_hydra_reads_them(value: str) -> None:
    """`key=number` lines skip Hydra's parser; they must give exactly its Override."""
    line = f"optim.lr={value}"
    mine, hydras = _parse(line), OverridesParser.create().parse_overrides([line])[0]
    assert mine == hydras and type(mine.value()) is type(hydras.value())
