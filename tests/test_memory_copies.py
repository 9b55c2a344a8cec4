"""The trainer's use of the in-memory tier (hpctrain.trainer.memory_copies): a life resumes from
its memory holders' copies only when it is the world that made them; an elastic relaunch on fewer
ranks goes to the disk. Real holder processes, a real model's state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import memory_holders
from hydra import compose, initialize_config_module
from test_memory_tier import SINGLE, assert_same_tensors, clients, trained

from hpctrain import config as hconfig
from hpctrain.checkpoint.memory_tier import MemoryTier
from hpctrain.checkpoint.restore_point import RestorePoint
from hpctrain.config import Config, fingerprint
from hpctrain.run.events import Journal, Start
from hpctrain.run.memory_wire import TOKEN_ENV
from hpctrain.run.paths import RunDir
from hpctrain.trainer import memory_copies


def ddp_config() -> Config:
    hconfig.register()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        cfg = compose("config", overrides=[])
    config, _ = hconfig.to_typed(cfg, [])
    assert config.trainer.memory_ckpt_every == 1 and config.trainer.strategy == "ddp"  # on by default
    return config


@pytest.mark.parametrize(("saved_world", "from_memory"), [(1, True), (2, False)])
def test_memory_copies_resume_only_the_world_that_made_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_world: int, from_memory: bool
) -> None:
    run_dir = tmp_path / "run"
    config = ddp_config()
    monkeypatch.setenv(TOKEN_ENV, memory_holders.TOKEN)
    with memory_holders.holders(run_dir, nodes=("n1",)):
        model, optimizer = trained(3)
        tier = MemoryTier(SINGLE, 1, clients(run_dir).values(), model, optimizer, fingerprint=fingerprint(config))
        tier.stepped(3, lambda: {"step": 3})
        tier.close()
        # The life that made the copies, as its `start` said it (rank 0's journal).
        Journal(RunDir(run_dir).events).write_event(Start(job_id="7", restart=0, world_size=saved_world))
        fresh, fresh_optimizer = trained(0)
        point, state = memory_copies.restored(config, SINGLE, RunDir(run_dir), fresh, fresh_optimizer)
    if from_memory:
        assert point is not None and point.source == "memory" and point.step == 3 and state is not None
        assert_same_tensors(fresh.state_dict(), model.state_dict())
    else:  # a world of 1 now, the copies of a world of 2: the disk decides (none here), the holders unasked
        assert (point, state) == (RestorePoint("none", 0), None)
        assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
