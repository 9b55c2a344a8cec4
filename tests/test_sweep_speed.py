"""A sweep's points checked cheaply (hpctrain.config.points) give what the full check gives:
the same typed Config, the same config.yaml, the same refusal for a bad value."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from clitools import cli_env, run_cli
from conftest import describe
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from hpctrain import config as hconfig
from hpctrain.config import resolved_plain, resolved_yaml, to_typed
from hpctrain.config.points import PointChecker, changed_paths
from hydra_plugins.hpctrain_launcher.compose import sweep_configs
from hydra_plugins.hpctrain_launcher.launcher import _resolved

TESTS = Path(__file__).parent

# Each row: a point and whether the cheap check may serve it (the first point of a structure,
# and a swapped `_target_`, get the full check).
SWEEP = [
    (["optim.lr=0.1"], False),
    (["optim.lr=0.2", "trainer.seed=3"], True),
    (["model.channels=[8,16]", "data.batch_size=8"], True),
    (["slurm.nodes=3", "slurm.time=10", "slurm.restart_budget.crash=4"], True),  # time: int -> str
    (["metrics.wandb=true", "metrics.wandb_tags=[a,b]", "trainer.max_steps=5"], True),
    (["optim._target_=torch.optim.SGD", "optim.lr=0.1"], False),  # drops AdamW's arguments
    (["model=gpt", "data=tokens", "data.dataset.seq_len=16"], False),
    (["model=gpt", "data=tokens", "data.dataset.seq_len=8"], True),  # model.block_size follows
    (["model=gpt", "data=tokens", "model.n_layer=1", "slurm.setup=[module load x]"], True),
    (["optim.lr=0.3"], True),  # the first structure again
    (["cluster=devcluster", "slurm.nodes=2"], False),  # a group choice in every point
    (["cluster=devcluster", "slurm.nodes=3", "slurm.extra=[--hold]"], True),
]

# A bad value in a point after a good one of the same structure: the cheap check refuses it
# with the full check's words.
BAD = [
    ("slurm.nodes=0", "slurm.nodes: must be a count of nodes >= 1 (4) or a range min-max (2-4), min <= max (got 0)"),
    ("slurm.time=1:xx", "slurm.time: '1:xx' is not a Slurm time limit"),
    ("slurm.restart_budget.crash=-1", "slurm.restart_budget.crash: must be >= 0 (got -1)"),
    ("metrics.wandb_mode=cloud", "metrics.wandb_mode: must be offline or online (got 'cloud')"),
    ("trainer.nprocs=0", "trainer.nprocs: must be >= 1 (got 0)"),
    ("trainer.straggler_action=move", "trainer.straggler_action: must be report or relaunch (got 'move')"),
]


@pytest.fixture(scope="module")
def loader_and_master():
    hconfig.register()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("submit", overrides=[], run_mode=RunMode.MULTIRUN)
        yield loader, master


def test_cheap_checks_give_what_the_full_check_gives(loader_and_master) -> None:
    loader, master = loader_and_master
    checker = PointChecker()
    points = [point for point, _ in SWEEP]
    references = {}  # each structure's first point as checked, to see no later point changed it
    for (point, cheap), cfg in zip(SWEEP, sweep_configs(loader, master, points)):
        full_checks = checker.full_checks
        typed, plain = checker.check(cfg, point, structure=id(cfg))
        references.setdefault(id(cfg), copy.deepcopy(plain))
        assert (checker.full_checks == full_checks) == cheap, point
        expected_typed, expected_resolved = to_typed(cfg, point)
        assert typed == expected_typed, point
        assert plain == resolved_plain(expected_resolved), point
        assert resolved_yaml(plain) == OmegaConf.to_yaml(expected_resolved), point
    assert checker.full_checks == 4
    # Later points share the unchanged sections of their structure's first one: never written.
    for structure, plain in references.items():
        assert checker._references[structure].plain == plain


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_a_bad_value_is_refused_with_the_full_checks_words(loader_and_master, bad: str, message: str) -> None:
    loader, master = loader_and_master
    checker = PointChecker()
    points = [["trainer.seed=1"], [bad]]
    configs = sweep_configs(loader, master, points)
    first = next(configs)
    checker.check(first, points[0], structure=id(first))
    second = next(configs)
    with pytest.raises(ValueError) as full:
        to_typed(second, points[1])
    with pytest.raises(ValueError) as cheap:
        checker.check(second, points[1], structure=id(second))
    assert str(cheap.value) == str(full.value)
    assert str(cheap.value).startswith(message), str(cheap.value)
    assert checker.full_checks == 1  # the bad point was refused by the cheap check


@pytest.mark.parametrize(
    ("old", "new", "paths"),
    [
        ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}, []),
        ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}}, ["b.c"]),
        ({"a": 1}, {"a": 1.0}, ["a"]),  # the type is part of the value
        ({"a": [1, 2]}, {"a": [1, 3]}, ["a"]),  # lists are leaves
        ({"a": {"x": 1}}, {"a": None}, ["a"]),
        ({"a": 1}, {"a": 1, "b": 2}, ["b"]),
    ],
)
def test_changed_paths(old: dict, new: dict, paths: list[str]) -> None:
    assert sorted(changed_paths(old, new)) == paths


def test_a_dry_run_sweep_writes_each_points_own_config(tmp_path: Path) -> None:
    """End to end, as a user runs it: every point's run dir holds its own values, and a value
    that follows the point by interpolation (`${hydra:job.num}`) is resolved for that point."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "submit",
        "-m",
        "optim.lr=0.1,0.2,0.3",
        "trainer.seed=1,2",
        "metrics.wandb_group=g${hydra:job.num}",
        "dry_run=true",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, describe(done)
    assert "checked 6 points, 1 of them in full" in done.stdout + done.stderr, describe(done)
    seen = set()
    for num in range(6):
        run_dir = sweep_dir / str(num)
        config = OmegaConf.load(run_dir / "config.yaml")
        overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        assert f"optim.lr={config.optim.lr}" in overrides and f"trainer.seed={config.trainer.seed}" in overrides
        assert config.metrics.wandb_group == f"g{num}"
        assert str(run_dir) in (run_dir / "job.sbatch").read_text()
        seen.add((config.optim.lr, config.trainer.seed))
    assert seen == {(lr, seed) for lr in (0.1, 0.2, 0.3) for seed in (1, 2)}


def counted_sweep(tmp_path: Path, points: int, cache: Path) -> dict[str, int]:
    """The counts of tests/helpers/counted_submit.py for a dry-run sweep of `points` values."""
    counts = tmp_path / f"counts-{points}.json"
    env = cli_env()
    env.update(HPCTRAIN_TEST_COUNTS=str(counts), HPCTRAIN_TARGET_CACHE=str(cache))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))
    lrs = ",".join(f"{1e-5 * (i + 1):.6g}" for i in range(points))
    done = run_cli(
        "helpers.counted_submit",
        "-m",
        f"optim.lr={lrs}",
        "dry_run=true",
        f"hydra.sweep.dir={tmp_path / f'sweep-{points}'}",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, describe(done)
    assert f"checked {points} points, 1 of them in full" in done.stdout + done.stderr, describe(done)
    return json.loads(counts.read_text())


def test_a_sweeps_costly_steps_do_not_grow_with_its_points(tmp_path: Path) -> None:
    """Counts, not seconds (a busy machine stretches seconds): 10 and 40 points of one structure
    compose, check in full, publish HydraConfig, compile the template and read YAML back the same
    number of times; each further point dumps only its changed section and its overrides; and once
    the target cache knows the targets, nothing imports torch."""
    cache = tmp_path / "cache"
    small, large = counted_sweep(tmp_path, 10, cache), counted_sweep(tmp_path, 40, cache)
    for once in ("composed", "OmegaConf.to_object", "HydraConfig.set_config", "Jinja environments", "OmegaConf.load"):
        assert large.get(once, 0) == small.get(once, 0), (once, small, large)
    assert small["composed"] == 1 and small["Jinja environments"] == 1, small
    assert large["renders"] - small["renders"] == 60  # one job.sbatch and one guardian.sbatch a point
    per_point = (large["YAML characters dumped"] - small["YAML characters dumped"]) / 30
    config_yaml = len((tmp_path / "sweep-40" / "0" / "config.yaml").read_text())
    assert per_point < config_yaml / 5, (per_point, config_yaml)  # not the whole config.yaml a point
    assert large.get("imported targets", 0) == 0 and large["torch imported"] == 0, large


def test_a_sweeps_points_write_what_single_submissions_write(tmp_path: Path) -> None:
    """Byte for byte: each point's config.yaml and job.sbatch (its own paths aside) are what
    `hpctrain-submit` of the same overrides alone writes through the full check and a whole dump."""
    # Hydra numbers the points with the last key varying fastest.
    points = {
        0: ["optim.lr=0.1", "trainer.seed=1"],
        1: ["optim.lr=0.1", "trainer.seed=2"],
        2: ["optim.lr=0.2", "trainer.seed=1"],
    }
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "submit",
        "-m",
        "optim.lr=0.1,0.2",
        "trainer.seed=1,2",
        "dry_run=true",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, describe(done)
    for num, overrides in points.items():
        alone = tmp_path / f"alone-{num}"
        done = run_cli("submit", *overrides, "dry_run=true", f"hydra.run.dir={alone}", cwd=tmp_path)
        assert done.returncode == 0, describe(done)
        point = sweep_dir / str(num)
        assert (point / "config.yaml").read_text() == (alone / "config.yaml").read_text(), overrides
        script = (point / "job.sbatch").read_text().replace(str(sweep_dir / "code"), str(alone / "code"))
        assert script.replace(str(point), str(alone)) == (alone / "job.sbatch").read_text(), overrides


@pytest.mark.parametrize("subdir", ["3", "a/b", "..", "linked", "x"])
def test_a_points_output_dir_is_what_path_resolve_gives(tmp_path: Path, subdir: str) -> None:
    """The launcher resolves the sweep dir once; its points' run dirs must still come out as
    Path.resolve() says, through symbolic links too."""
    (tmp_path / "real" / "elsewhere").mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")  # the sweep dir is reached through a link
    (tmp_path / "real" / "linked").symlink_to(tmp_path / "real" / "elsewhere")
    sweep_dir = tmp_path / "via"
    run_dir = sweep_dir / subdir
    assert _resolved(run_dir, sweep_dir, sweep_dir.resolve()) == run_dir.resolve()
