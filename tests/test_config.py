"""Config checks: Hydra's compose API, then `to_typed`, exactly as the entry points call them.

Every bad value must be refused with a ValueError naming the key to change, before anything
runs; a user's own `_target_` class must plug in without inheriting the default model's
arguments; the saved config.yaml must come back as the same typed Config.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

import hpctrain.config as hconfig
from hpctrain.config import Config, TrainerConfig, load_run_config, save_resolved, targets, to_typed

Compose = Callable[..., DictConfig]


@pytest.fixture(scope="module")
def compose_config() -> Iterator[Compose]:
    hconfig.register()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        yield lambda *overrides: compose("config", overrides=list(overrides))


def typed(compose_config: Compose, *overrides: str) -> tuple[Config, DictConfig]:
    return to_typed(compose_config(*overrides), overrides)


@pytest.fixture
def user_module(user_module_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`mymod` importable for this test only (targets caches imports by name: fine, the
    module's content is the same in every test)."""
    monkeypatch.syspath_prepend(str(user_module_dir))
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    return user_module_dir


def _trainer_keys(config: Config) -> tuple[int, ...]:
    cfg = config.trainer
    return (cfg.max_steps, cfg.epochs, cfg.log_every, cfg.eval_every, cfg.seed, cfg.nprocs, cfg.threads)


# the defaults --------------------------------------------------------------------------------


def test_defaults_give_a_typed_config(compose_config: Compose) -> None:
    config, resolved = typed(compose_config)
    assert isinstance(config, Config)
    assert isinstance(config.trainer, TrainerConfig)
    assert config.model["_target_"] == "hpctrain.models.convnet.ConvNet"
    assert config.data.dataset["_target_"] == "hpctrain.data.digits.digits"
    assert config.optim["_target_"] == "torch.optim.AdamW"
    assert config.sched is not None and config.sched["_target_"] == "hpctrain.trainer.schedules.warmup_cosine"
    assert config.data.batch_size == 32
    assert config.optim["lr"] == pytest.approx(1e-3)
    assert _trainer_keys(config) == (0, 10, 10, 100, 0, 1, 1)
    # The resolved DictConfig is what config.yaml holds: no hydra node, no interpolation.
    assert "hydra" not in resolved
    assert "${" not in OmegaConf.to_yaml(resolved)


def test_overrides_reach_the_typed_config(compose_config: Compose) -> None:
    trainer = ("max_steps=7", "epochs=2", "log_every=3", "eval_every=5", "seed=11", "nprocs=4", "threads=2")
    overrides = [f"trainer.{o}" for o in trainer] + ["data.batch_size=16", "optim=sgd", "optim.lr=0.5"]
    config, _ = typed(compose_config, *overrides, "model=mlp", "sched=constant")
    assert _trainer_keys(config) == (7, 2, 3, 5, 11, 4, 2)
    assert config.data.batch_size == 16
    assert config.optim == {"_target_": "torch.optim.SGD", "lr": 0.5, "momentum": 0.9, "weight_decay": 0.0}
    assert config.model["_target_"] == "hpctrain.models.mlp.MLP"
    assert config.sched is None


# bad values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.nprocs=0", "trainer.nprocs"),
        ("data.batch_size=-1", "data.batch_size"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("trainer.log_every=0", "trainer.log_every"),
        ("trainer.max_steps=-3", "trainer.max_steps"),
        ("trainer.backend=mpi", "trainer.backend"),
        ("trainer.threads=0", "trainer.threads"),
        ("trainer.grad_accum=0", "trainer.grad_accum"),
        ("data.num_workers=-2", "data.num_workers"),
    ],
)
def test_a_bad_value_raises_valueerror_naming_the_key(compose_config: Compose, override: str, key: str) -> None:
    cfg = compose_config(override)  # Hydra accepts it: the type is right, the value is not
    with pytest.raises(ValueError) as error:
        to_typed(cfg, [override])
    assert key in str(error.value)
    # The offending value is shown too, so the message says what to change from.
    assert override.split("=", 1)[1] in str(error.value)


@pytest.mark.parametrize(
    "hang_s, collective_s, refused",
    [
        (None, None, False),  # the defaults: a hang is seen before any collective fails
        (0, 60, False),  # no watchdog: nothing to order
        (59, 60, False),
        (60, 60, True),
        (1800, 600, True),  # the old defaults: every hang was charged as a crash
    ],
)
def test_a_hang_is_seen_before_a_collective_times_out(
    compose_config: Compose, hang_s: int | None, collective_s: int | None, refused: bool
) -> None:
    overrides = tuple(
        f"trainer.{key}={value}"
        for key, value in (("hang_timeout_s", hang_s), ("collective_timeout_s", collective_s))
        if value is not None
    )
    if not refused:
        typed, _ = to_typed(compose_config(*overrides), list(overrides))
        assert typed.trainer.hang_timeout_s < typed.trainer.collective_timeout_s or typed.trainer.hang_timeout_s == 0
        return
    with pytest.raises(ValueError) as error:
        to_typed(compose_config(*overrides), list(overrides))
    message = str(error.value)
    assert "trainer.hang_timeout_s" in message and "trainer.collective_timeout_s" in message
    assert f"got {hang_s} and {collective_s}" in message


def test_neither_steps_nor_epochs_is_refused(compose_config: Compose) -> None:
    overrides = ("trainer.max_steps=0", "trainer.epochs=0")
    with pytest.raises(ValueError, match="trainer.max_steps"):
        to_typed(compose_config(*overrides), overrides)


def test_a_value_of_the_wrong_type_is_refused_by_hydra_naming_the_key(compose_config: Compose) -> None:
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("data.batch_size=abc")
    assert "data.batch_size" in str(error.value)


def test_an_unknown_key_is_hydras_error(compose_config: Compose) -> None:
    with pytest.raises(ConfigCompositionException) as error:
        compose_config("model.foo=1")
    assert "model.foo" in str(error.value)


def test_an_added_unknown_model_argument_is_refused_naming_it(compose_config: Compose) -> None:
    cfg = compose_config("+model.foo=1")  # `+` gets past Hydra: the model node is free-form
    with pytest.raises(ValueError) as error:
        to_typed(cfg, ["+model.foo=1"])
    assert "model.foo" in str(error.value)


def test_an_unknown_target_is_refused_naming_model_target(compose_config: Compose) -> None:
    overrides = ("model._target_=no.such.Thing",)
    with pytest.raises(ValueError) as error:
        to_typed(compose_config(*overrides), overrides)
    assert "model._target_" in str(error.value)
    assert "no.such.Thing" in str(error.value)


def test_gpt_without_token_data_names_the_unresolvable_key(compose_config: Compose) -> None:
    # model=gpt takes vocab_size from data.dataset.vocab_size, which digits does not have.
    with pytest.raises(ValueError) as error:
        typed(compose_config, "model=gpt")
    assert "vocab_size" in str(error.value)


# a user's own class ----------------------------------------------------------------------------


def test_a_user_target_without_arguments_drops_the_default_models_arguments(
    compose_config: Compose, user_module: Path
) -> None:
    config, resolved = typed(compose_config, "model._target_=mymod.Net")
    assert config.model == {"_target_": "mymod.Net"}
    assert OmegaConf.to_container(resolved.model) == {"_target_": "mymod.Net"}
    model = targets.build(config.model)
    assert type(model).__name__ == "Net" and type(model).__module__ == "mymod"
    # Without the override the ConvNet keeps all of its arguments.
    default, _ = typed(compose_config)
    assert {"channels", "hidden", "dropout1", "dropout2"} <= set(default.model)


def test_a_target_taking_any_keyword_gets_only_what_it_names(compose_config: Compose, user_module: Path) -> None:
    # timm.create_model(model_name, ..., **kwargs): the ConvNet's channels, hidden, dropouts and
    # in_channels are not its names; num_classes is (here), and a key set on the command line is kept.
    config, _ = typed(compose_config, "model._target_=mymod.create", "+model.name=wide")
    assert config.model == {"_target_": "mymod.create", "num_classes": 10, "name": "wide"}
    assert targets.build(config.model).width == 10
    kept, _ = typed(compose_config, "model._target_=mymod.create", "model.hidden=64")
    assert kept.model["hidden"] == 64  # the user asked for it: passed, and the factory says what it thinks


def test_a_user_target_keeps_and_checks_arguments_set_on_the_command_line(
    compose_config: Compose, user_module: Path
) -> None:
    config, _ = typed(compose_config, "model._target_=mymod.WideNet", "+model.width=3")
    assert config.model == {"_target_": "mymod.WideNet", "width": 3}
    assert targets.build(config.model).width == 3

    # An argument the user set that the class does not take is an error, not silently dropped:
    # whether added (+model.width) or an override of one of the default model's (model.hidden).
    for extra in ("+model.width=3", "model.hidden=64"):
        overrides = ("model._target_=mymod.Net", extra)
        with pytest.raises(ValueError) as error:
            to_typed(compose_config(*overrides), overrides)
        name = extra.lstrip("+").split("=")[0]
        assert name in str(error.value)


# interpolation and the saved config ------------------------------------------------------------


def test_gpt_with_tokens_resolves_its_interpolations(compose_config: Compose) -> None:
    config, resolved = typed(compose_config, "model=gpt", "data=tokens", "data.dataset.vocab_size=300")
    assert config.model["vocab_size"] == 300
    assert config.model["block_size"] == config.data.dataset["seq_len"] == 128
    assert "${" not in OmegaConf.to_yaml(resolved)


def test_load_run_config_round_trips_a_saved_config(compose_config: Compose, tmp_path: Path) -> None:
    overrides = ("model=gpt", "data=tokens", "trainer.max_steps=5", "optim.lr=0.25", "sched=constant")
    config, resolved = typed(compose_config, *overrides)
    save_resolved(resolved, tmp_path / "config.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no .tmp left behind
    text = (tmp_path / "config.yaml").read_text()
    assert "${" not in text
    loaded = load_run_config(tmp_path)
    assert loaded == config
    assert loaded.model["vocab_size"] == 512 and loaded.optim["lr"] == 0.25 and loaded.sched is None


def test_load_run_config_of_a_bad_saved_value_names_the_key(compose_config: Compose, tmp_path: Path) -> None:
    _, resolved = typed(compose_config)
    resolved.trainer.nprocs = 0  # an edited config.yaml is checked again on load
    save_resolved(resolved, tmp_path / "config.yaml")
    with pytest.raises(ValueError, match="trainer.nprocs"):
        load_run_config(tmp_path)


def test_load_run_config_of_a_list_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("- trainer\n- model\n")
    with pytest.raises(ValueError, match="config.yaml: holds a list, not the config's keys"):
        load_run_config(tmp_path)


def test_load_run_config_without_config_yaml_is_a_valueerror(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as error:
        load_run_config(tmp_path)
    assert "config.yaml" in str(error.value)
