"""FSDP with a model that has buffers and keeps its blocks in an nn.Sequential (as timm's ResNets
and ViTs do): the blocks found as units (and said), the BatchNorm running statistics the same on
every rank, and a run stopped and resumed bit-identical to one that went through, buffers too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from hpctrain.trainer.sharding import units

BIN = Path(sys.executable).parent

BNNET = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class BNNet(nn.Module):
    """A stem, two blocks in an nn.Sequential, a head: BatchNorm buffers in every block."""

    def __init__(self, num_classes=10, width=8, **unused):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))
'''


def test_blocks_in_a_sequential_are_units_and_single_layers_are_not(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bnnet.py").write_text(BNNET)
    monkeypatch.syspath_prepend(str(tmp_path))
    import bnnet

    model = bnnet.BNNet()
    assert [type(u).__name__ for u in units(model, [])] == ["Block", "Block"]
    # A ResNet's stages of one block each (timm's resnet10t): the block class repeats across them.
    stages = torch.nn.Sequential(*(torch.nn.Sequential(bnnet.Block(4)) for _ in range(4)), torch.nn.Linear(4, 2))
    assert [type(u).__name__ for u in units(stages, [])] == ["Block"] * 4
    assert units(torch.nn.Sequential(torch.nn.Sequential(bnnet.Block(4)), torch.nn.Linear(4, 2)), []) == []
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    assert units(mlp, []) == []  # an MLP is one unit, not one per Linear

    class HFLike(torch.nn.Module):  # Hugging Face names its blocks in _no_split_modules
        _no_split_modules = ["Block"]

        def __init__(self) -> None:
            super().__init__()
            self.inner = bnnet.Block(4)

    assert [type(u).__name__ for u in units(HFLike(), [])] == ["Block"]


def train(tmp_path: Path, run: str, steps: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "bnnet.py").write_text(BNNET)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [
            str(BIN / "hpctrain-train"),
            f"hydra.run.dir={tmp_path / run}",
            "model._target_=bnnet.BNNet",
            "trainer.strategy=fsdp",
            "trainer.nprocs=2",
            "trainer.eval_every=0",
            "trainer.log_every=4",
            "trainer.ckpt_every=4",
            "data.batch_size=8",
            f"trainer.max_steps={steps}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_fsdp_resumes_bit_identical_with_batchnorm_buffers(tmp_path: Path) -> None:
    through = train(tmp_path, "through", 12)
    assert "fsdp units: 2 x Block, and the root" in through.stderr + through.stdout
    train(tmp_path, "resumed", 8)
    train(tmp_path, "resumed", 12)
    a, b = (torch.load(tmp_path / run / "model.pt", weights_only=True) for run in ("through", "resumed"))
    assert a.keys() == b.keys()
    buffers = [k for k in a if "running_" in k or "num_batches" in k]
    assert len(buffers) == 6, sorted(a)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert differ == [], differ
