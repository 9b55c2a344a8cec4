"""A sharded (FSDP) run whose first checkpoint write was cut before its .json: nothing was ever
published, so the run starts from step 0 (it used to refuse every start, `--retry` too, as a
user's mistake); shards without a .json beside a published checkpoint are still never loaded.
And a load that fails for the job's reasons (a peer lost mid-load, the filesystem for a moment) is
a crash, tried again, not the user's mistake it was taken for."""

from __future__ import annotations

import errno
import json
import logging
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from hpctrain.checkpoint import sharded_load
from hpctrain.checkpoint.format import FORMAT_VERSION
from hpctrain.checkpoint.sharded_load import load_newest
from hpctrain.checkpoint.store import NoUsableCheckpoint
from hpctrain.dist.context import DistContext


def _caused_by(cause: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("dcp.load failed") from cause
    except RuntimeError as error:
        return error


def cut_write(folder: Path, step: int) -> None:
    """What a write cut before its publication leaves: a rank's shard, no metadata, no .json."""
    shards = folder / f"step_{step:08d}.dcp"
    shards.mkdir(parents=True)
    (shards / "__0_0.distcp").write_bytes(b"half of rank 0's shards")


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_first_write_cut_before_its_json_is_a_fresh_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "checkpoints"
    cut_write(folder, 5)
    model, optimizer = model_and_optimizer()
    with caplog.at_level(logging.WARNING):
        assert load_newest(folder, DistContext.single(), "fp", {}, model, optimizer) is None
    assert "step_00000005.dcp has no step_00000005.json" in caplog.text


def test_published_checkpoints_none_usable_are_still_refused(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    cut_write(folder, 10)
    # A published one whose shards are gone: checkpoints were saved, none can be loaded.
    meta = {"step": 5, "format_version": FORMAT_VERSION, "fingerprint": "fp", "files": {"__0_0.distcp": {"size": 9}}}
    (folder / "step_00000005.json").write_text(json.dumps(meta))
    model, optimizer = model_and_optimizer()
    with pytest.raises(NoUsableCheckpoint, match="none is usable"):
        load_newest(folder, DistContext.single(), "fp", {}, model, optimizer)


@pytest.mark.parametrize(
    ("error", "not_the_checkpoint"),
    [
        pytest.param(dist.DistBackendError("Connection closed by peer"), True, id="a peer lost mid-load"),
        pytest.param(dist.DistNetworkError("timed out"), True, id="the network"),
        pytest.param(OSError(errno.ESTALE, "Stale file handle"), True, id="NFS for a moment"),
        pytest.param(
            CheckpointException("load failed", {1: (dist.DistBackendError("peer gone"), traceback.StackSummary())}),
            True,
            id="a peer's failure on another rank, through DCP",
        ),
        pytest.param(_caused_by(dist.DistStoreError("store down")), True, id="raised from a store error"),
        pytest.param(RuntimeError("size mismatch for weight: [2, 4] vs [3, 4]"), False, id="the model changed"),
        pytest.param(KeyError("model.head.weight"), False, id="a key the model lacks"),
        pytest.param(OSError(errno.ENOENT, "No such file"), False, id="a file missing: the checkpoint's"),
        pytest.param(
            CheckpointException("load failed", {0: (ValueError("shape"), traceback.StackSummary())}),
            False,
            id="DCP's own refusal",
        ),
    ],
)
def test_which_load_errors_are_the_jobs_not_the_checkpoints(error: BaseException, not_the_checkpoint: bool) -> None:
    assert sharded_load.not_the_checkpoint(error) is not_the_checkpoint
