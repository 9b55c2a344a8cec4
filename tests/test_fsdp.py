"""trainer.strategy=fsdp with real local runs on CPU (gloo): a GPT sharded with FSDP2, its
checkpoints sharded through torch.distributed.checkpoint (DCP).

- At 2 processes FSDP trains the same weights as DDP (its reduce-scatter averages two numbers,
  as the all-reduce does), and model.pt is a plain state_dict of the unwrapped model.
- Every rank writes its own shards; the .json lists each file with its sha256.
- A run resumed at its own size is bit-identical to an uninterrupted one; at another size
  (trainer.elastic) the model and optimizer are resharded and the weights equal within
  floating-point reduction order.
- A torn newest checkpoint (a shard changed, or its .json missing) is never loaded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, assert_ok, describe, events, load_weights, train_command, train_env

from hpctrain.models.gpt import GPT

pytestmark = pytest.mark.slow


def tiny(batch_size: int = 6) -> tuple[str, ...]:
    """A GPT of two blocks on short token sequences; the global batch is 12 at 2 processes."""
    return (*TINY_MODEL, f"data.batch_size={batch_size}", *TINY_RUN)


TINY_MODEL = (
    "model=gpt",
    "data=tokens",
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=2",
    "data.dataset.vocab_size=64",
    "data.dataset.seq_len=16",
    "data.dataset.num_train=512",
    "data.dataset.num_eval=40",
)
TINY_RUN = (
    "sched=constant",
    "trainer.log_every=5",
    "trainer.eval_every=10",
    "trainer.ckpt_every=5",
)
TINY = tiny()
FSDP = (*TINY, "trainer.strategy=fsdp")
STEPS = 20


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        train_command(run_dir, list(overrides)),
        cwd=run_dir.parent,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert_ok(done)
    return done


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    train(run_dir, *FSDP, "trainer.nprocs=2", f"trainer.max_steps={STEPS}")
    return run_dir


def test_fsdp_trains_what_ddp_trains_and_writes_a_plain_model_pt(uninterrupted: Path, tmp_path: Path) -> None:
    ddp = tmp_path / "ddp"
    train(ddp, *TINY, "trainer.nprocs=2", f"trainer.max_steps={STEPS}")
    sharded, whole = load_weights(uninterrupted), load_weights(ddp)
    difference = max_difference(sharded, whole)
    print(f"fsdp vs ddp at 2 processes, {STEPS} steps: max |dw| {difference:.3g}")
    assert difference < 1e-5
    # model.pt loads into the plain model, strictly, without hpctrain's wrappers.
    plain = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    plain.load_state_dict(sharded, strict=True)


def test_every_rank_writes_its_own_shards_and_the_json_lists_them(uninterrupted: Path) -> None:
    checkpoints = uninterrupted / "checkpoints"
    published = sorted(checkpoints.glob("step_*.json"))
    assert [p.name for p in published] == ["step_00000015.json", "step_00000020.json"]  # keep 2
    meta = json.loads(published[-1].read_text())
    assert meta["sharded"] is True and meta["world_size"] == 2 and meta["format_version"] == 3
    assert set(meta["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    folder = checkpoints / "step_00000020.dcp"
    for name, (size, _) in meta["files"].items():
        assert (folder / name).stat().st_size == size
    # No rank wrote the whole model: each file holds about half of the state.
    sizes = [meta["files"][f"__{rank}_0.distcp"][0] for rank in (0, 1)]
    assert max(sizes) < 0.7 * sum(sizes), sizes
    assert [e["step"] for e in events(uninterrupted, "checkpoint")] == [5, 10, 15, 20]


def test_a_resume_at_the_same_size_is_bit_identical(uninterrupted: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "resumed"
    train(run_dir, *FSDP, "trainer.nprocs=2", "trainer.max_steps=8")
    train(run_dir, *FSDP, "trainer.nprocs=2", f"trainer.max_steps={STEPS}")
    assert [s["resumed_from_step"] for s in events(run_dir, "start")] == [0, 8]
    mine, theirs = load_weights(run_dir), load_weights(uninterrupted)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


# (processes, steps trained to) per life: 2 -> 3, 3 -> 2, 4 -> 1 and back, and 2 -> 5, where the
# 12 samples of a step are shared unequally (3, 3, 2, 2, 2), each micro-batch's loss weighted.
CHAINS = {
    "2-3": [(2, 10), (3, STEPS)],
    "2-5": [(2, 10), (5, STEPS)],
    "3-2": [(3, 10), (2, STEPS)],
    "4-1-4": [(4, 6), (1, 12), (4, STEPS)],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_resume_at_another_size_reshards_model_and_optimizer(chain: str, uninterrupted: Path, tmp_path: Path) -> None:
    lives = CHAINS[chain]
    run_dir = tmp_path / "elastic"
    common = (*tiny(12 // lives[0][0]), "trainer.strategy=fsdp", "trainer.elastic=true")
    for nprocs, steps in lives:
        train(run_dir, *common, f"trainer.nprocs={nprocs}", f"trainer.max_steps={steps}")
    starts = events(run_dir, "start")
    assert [s["world_size"] for s in starts] == [n for n, _ in lives]
    assert [s["resumed_from_step"] for s in starts] == [0, *(steps for _, steps in lives[:-1])]
    assert {s["layout"]["global_batch"] for s in starts} == {12}
    difference = max_difference(load_weights(run_dir), load_weights(uninterrupted))
    print(f"fsdp {chain} processes vs 2 uninterrupted: max |dw| {difference:.3g}")
    assert difference < 1e-4


def test_a_torn_newest_checkpoint_is_never_loaded(uninterrupted: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "torn"
    train(run_dir, *FSDP, "trainer.nprocs=2", "trainer.max_steps=10")
    checkpoints = run_dir / "checkpoints"
    shard = checkpoints / "step_00000010.dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in rank 1's shards
    shard.write_bytes(bytes(data))
    resumed = train(run_dir, *FSDP, "trainer.nprocs=2", f"trainer.max_steps={STEPS}")
    assert "__1_0.distcp: checksum mismatch (corrupted)); trying the one before" in resumed.stdout, describe(resumed)
    assert [s["resumed_from_step"] for s in events(run_dir, "start")] == [0, 5]
    mine, theirs = load_weights(run_dir), load_weights(uninterrupted)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_hpctrain_export_writes_the_weights_of_any_checkpoint(uninterrupted: Path, tmp_path: Path) -> None:
    """A sharded checkpoint, read in one process without a process group: the final one equals
    model.pt; an earlier one is the model at its step; a corrupt shard is refused by name."""
    export = [sys.executable, "-m", "hpctrain.cli.export", str(uninterrupted)]
    done = subprocess.run([*export, "--out", str(tmp_path / "final.pt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    final, model_pt = torch.load(tmp_path / "final.pt", weights_only=True), load_weights(uninterrupted)
    assert final.keys() == model_pt.keys() and all(torch.equal(final[k], model_pt[k]) for k in final)
    done = subprocess.run([*export, "--step", "15", "--out", str(tmp_path / "at15.pt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not torch.equal(torch.load(tmp_path / "at15.pt")["wte.weight"], final["wte.weight"])
    missing = subprocess.run([*export, "--step", "3"], capture_output=True, text=True)
    assert missing.returncode == 2 and "it has: 20, 15" in missing.stderr, missing.stderr
    corrupt = tmp_path / "corrupt"
    shutil.copytree(uninterrupted, corrupt)
    shard = corrupt / "checkpoints" / "step_00000020.dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1])
    refused = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli.export", str(corrupt)], capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr
    assert "__0_0.distcp:" in refused.stderr and "expected" in refused.stderr and "(torn write?)" in refused.stderr
