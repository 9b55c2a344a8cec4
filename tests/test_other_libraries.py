"""Models nobody on the project wrote, trained as they are, with the commands of
docs/own-model.md: a Hugging Face Llama built from its config, timm's ResNet and ViT through
`timm.create_model`, and nanoGPT's `model.py` copied unchanged (fixtures/nanogpt). Each with DDP
and with FSDP on two processes: stopped by a real SIGTERM right after a step (the fault point
`trainer.step=term@3`, in every rank, as a preemption reaches every task), resumed by the same
command, and bit-identical to a run that went through, buffers included (timm's BatchNorm).
Skipped where transformers or timm is not installed (the test extra installs both)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, describe, events, library_env, load_weights, train_command

from hpctrain import faults

pytestmark = pytest.mark.slow

NANOGPT = Path(__file__).parent / "fixtures" / "nanogpt" / "model.py"
PAGE = Path(__file__).parent.parent / "docs" / "own-model.md"

# name (its `<!-- trained-by: NAME -->` block on the page): the library it needs, the FSDP units
# the start must name, and the steps of its runs.
# The SIGTERM lands right after each rank's third step; the ranks agree on it at their next stop
# vote, within about two vote intervals (0.25 s of training each, hpctrain.trainer.stop_vote), and
# save that step: some 0.5 s / step time + 3 steps. Each model's steps leave that room at least
# twice over on a quiet machine (its steps take 3 ms for nanoGPT to 40 ms for the ResNet); on a
# loaded one its steps are slower and the stop comes in fewer of them.
LIBRARIES = {
    "llama": ("transformers", "2 x LlamaDecoderLayer", 150),  # its _no_split_modules
    "resnet": ("timm", "4 x BasicBlock", 40),  # one block in each of four nn.Sequential stages
    "vit": ("timm", "2 x Block", 100),  # timm keeps them in an nn.Sequential
    "nanogpt": (None, "2 x Block", 300),  # its transformer.h ModuleList
}


def documented(name: str) -> list[str]:
    """The overrides of the page's `hpctrain-train` command marked `trained-by: NAME`."""
    text = PAGE.read_text()
    found = re.search(rf"<!-- trained-by: {name} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"{PAGE.name} has no command marked trained-by: {name}"
    words = shlex.split(found[1].replace("\\\n", " "))
    assert words[0] == "hpctrain-train" and words.count("hpctrain-train") == 1, words
    return words[1:]


def test_every_documented_command_is_trained_here() -> None:
    assert set(re.findall(r"<!-- trained-by: (\w+) -->", PAGE.read_text())) == set(LIBRARIES)


SIGNALLED_AT = 3


def run(run_dir: Path, overrides: list[str], arming: str = "") -> subprocess.CompletedProcess[str]:
    """`hpctrain-train OVERRIDES` from the folder holding model.py (nanoGPT's), as a user runs it."""
    env = library_env()
    if arming:
        env[faults.ENV] = arming
    return subprocess.run(
        train_command(run_dir, overrides),
        cwd=run_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("name", list(LIBRARIES))
def test_a_model_of_another_library_stops_and_resumes_bit_identical(name: str, strategy: str, tmp_path: Path) -> None:
    library, fsdp_units, steps = LIBRARIES[name]
    if library and importlib.util.find_spec(library) is None:
        pytest.skip(f"needs {library} (pip install -e '.[models]', with torch pinned as scripts/install.sh does)")
    shutil.copy(NANOGPT, tmp_path / "model.py")
    overrides = [
        *documented(name),
        f"trainer.strategy={strategy}",
        f"trainer.max_steps={steps}",
        "trainer.log_every=10",
        "trainer.eval_every=20",
        "trainer.ckpt_every=0",  # the only checkpoint is the stop's own
        "data.batch_size=8",
    ]

    through = run(tmp_path / "through", overrides)
    assert through.returncode == 0, describe(through)
    if strategy == "fsdp":
        assert f"fsdp units: {fsdp_units}, and the root" in through.stdout + through.stderr, describe(through)

    stopped_dir = tmp_path / "stopped"
    stopped = run(stopped_dir, overrides, f"trainer.step=term@{SIGNALLED_AT}")
    assert stopped.returncode == 128 + signal.SIGTERM, describe(stopped)
    stops = [(e["step"], e["reason"]) for e in events(stopped_dir, "stop")]
    assert len(stops) == 1 and stops[0][1] == "preempt", stops
    step = stops[0][0]
    assert SIGNALLED_AT <= step < steps, f"the stop came at step {step}, the run has {steps}"
    assert [e["step"] for e in events(stopped_dir, "checkpoint")] == [step]
    assert not (stopped_dir / "model.pt").exists()

    resumed = run(stopped_dir, overrides)  # the same command
    assert resumed.returncode == 0, describe(resumed)
    assert [e["resumed_from_step"] for e in events(stopped_dir, "start")] == [0, step]

    ours, theirs = load_weights(stopped_dir), load_weights(tmp_path / "through")
    assert ours.keys() == theirs.keys()
    differ = [key for key in theirs if not torch.equal(ours[key], theirs[key])]
    assert differ == [], f"the resumed run differs from the one that went through in {differ}"
