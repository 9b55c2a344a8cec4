"""A researcher's own package, beside the command line, through the console scripts users type
(`hpctrain-train`, not `python -m`, which puts the current folder on sys.path by itself): the
package is found for `model._target_`, checked at submit and copied into the code snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

BIN = Path(sys.executable).parent

NETS = '''
import torch.nn as nn


class Net(nn.Module):
    """A small MLP for the default 8x8 digits; the group's ConvNet keys are taken and left."""

    def __init__(self, num_classes=10, in_channels=1, image_size=8, **unused):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size * image_size, 32), nn.ReLU(), nn.Linear(32, num_classes)
        )

    def forward(self, x):
        return self.layers(x)
'''


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "mypkg").mkdir(parents=True)
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "nets.py").write_text(textwrap.dedent(NETS))
    return folder


def env_without_pythonpath() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "PYTHONPATH"}
    env["HPCTRAIN_TARGET_CACHE"] = "off"  # no cached signature may hide a failed import
    return env


def run(command: str, here: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / command), *args], cwd=here, env=env_without_pythonpath(), capture_output=True, text=True, timeout=300
    )


def test_train_finds_the_users_package_in_the_current_folder(tmp_path: Path) -> None:
    here = project(tmp_path)
    done = run(
        "hpctrain-train",
        here,
        "model._target_=mypkg.nets.Net",
        "trainer.max_steps=3",
        "trainer.eval_every=0",
        "trainer.log_every=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No module named" not in done.stderr
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 3 in steps


def test_submit_checks_the_users_package_and_snapshots_it(tmp_path: Path) -> None:
    here = project(tmp_path)
    run_dir = tmp_path / "run"
    done = run("hpctrain-submit", here, "model._target_=mypkg.nets.Net", "dry_run=true", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "code" / "mypkg" / "nets.py").read_text() == (here / "mypkg" / "nets.py").read_text()
    # A target that is not there is still refused, naming the key.
    missing = run(
        "hpctrain-submit", here, "model._target_=mypkg.nets.Nope", "dry_run=true", f"hydra.run.dir={run_dir}2"
    )
    assert missing.returncode == 2 and "model._target_" in missing.stderr, missing.stderr


MYNET = """
_target_: mypkg.nets.Net
num_classes: 10
in_channels: 1
image_size: 8
hidden: 32
"""

MYSITE = """
# @package _global_
slurm:
  partition: gpu-a100
  time: "02:00:00"
"""


def config_folder(here: Path) -> Path:
    conf = here / "myconf"
    (conf / "model").mkdir(parents=True)
    (conf / "cluster").mkdir()
    (conf / "model" / "mynet.yaml").write_text(MYNET)
    (conf / "cluster" / "mysite.yaml").write_text(MYSITE)
    return conf


def test_a_config_folder_of_ones_own_gives_groups_checked_like_built_in_ones(tmp_path: Path) -> None:
    here = project(tmp_path)
    config_folder(here)
    # Its model, with a key of its own overridden plainly (no + or ++), trains.
    trained = run(
        "hpctrain-train",
        here,
        "--config-dir",
        "myconf",
        "model=mynet",
        "model.hidden=64",
        "trainer.max_steps=2",
        "trainer.eval_every=0",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "hidden: 64" in (tmp_path / "run" / "config.yaml").read_text()
    # Its site profile, through hydra.searchpath too.
    submitted = run(
        "hpctrain-submit",
        here,
        f"hydra.searchpath=[file://{here / 'myconf'}]",
        "cluster=mysite",
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'sub'}",
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    script = (tmp_path / "sub" / "job.sbatch").read_text()
    assert "--partition=gpu-a100" in script and "--time=02:00:00" in script, script[:1500]
    # Mistakes in them are still caught before Hydra, naming the closest key or option.
    typo = run("hpctrain-train", here, "--config-dir", "myconf", "model=mynet", "model.hiden=64")
    assert typo.returncode == 2, typo.stderr
    assert "model.hiden: no such key in model=mynet; did you mean model.hidden?" in typo.stderr, typo.stderr
    option = run("hpctrain-submit", here, "--config-dir", "myconf", "cluster=mysit", "dry_run=true")
    assert option.returncode == 2 and "cluster=mysit: no such option; did you mean cluster=mysite?" in option.stderr
    # Without the folder, the option is unknown, and the error says where own options go.
    alone = run("hpctrain-submit", here, "cluster=mysite", "dry_run=true")
    assert alone.returncode == 2 and "--config-dir DIR with DIR/cluster/" in alone.stderr, alone.stderr
