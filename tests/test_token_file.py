"""data=token_file: a user's token ids from a file (nanoGPT's train.bin / val.bin, or .npy).

Windows are a pure function of their index, so a run over a token file is exact the way the
built-in datasets are: a 2-process run stopped mid-epoch and resumed ends bit-identical.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import assert_refused, describe, run_cli

from hpctrain.data import token_file as module
from hpctrain.data.token_file import preflight, token_file
from hpctrain.errors import ArgumentError

VOCAB = 64


def write_tokens(folder: Path, count: int = 4000) -> tuple[Path, Path]:
    """train.bin (raw uint16, nanoGPT's format) and val.npy (int32): a learnable sequence."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = (np.arange(count) * 7 + np.arange(count) // 5) % VOCAB
    ids.astype(np.uint16).tofile(folder / "train.bin")
    np.save(folder / "val.npy", ids[: count // 8].astype(np.int32))
    return folder / "train.bin", folder / "val.npy"


def test_windows_are_shifted_pairs_at_fixed_offsets(tmp_path: Path) -> None:
    train_bin, _ = write_tokens(tmp_path, count=1000)
    ids = np.fromfile(train_bin, dtype=np.uint16).astype(np.int64)

    splits = token_file(str(train_bin), seq_len=16, vocab_size=VOCAB, eval_fraction=0.1)

    # 100 eval tokens at the end; the train part is the 900 before them: 899 // 16 windows.
    assert len(splits.train) == 56 and len(splits.eval) == 6
    x, y = splits.train[3]
    assert x.dtype == torch.int64 and x.shape == (16,)
    assert torch.equal(x, torch.from_numpy(ids[48:64])) and torch.equal(y, torch.from_numpy(ids[49:65]))
    ex, ey = splits.eval[0]
    assert torch.equal(ex, torch.from_numpy(ids[900:916])) and torch.equal(ey, torch.from_numpy(ids[901:917]))
    last_train_target = 55 * 16 + 16  # the last token a train window touches
    assert last_train_target < 900, "train and eval share no token"


def test_an_eval_file_and_a_npy_file(tmp_path: Path) -> None:
    train_bin, val_npy = write_tokens(tmp_path)
    splits = token_file(str(train_bin), seq_len=16, vocab_size=VOCAB, eval_path=str(val_npy))
    assert len(splits.train) == 3999 // 16 and len(splits.eval) == 499 // 16
    assert torch.equal(splits.eval[1][0], torch.from_numpy(np.load(val_npy)[16:32].astype(np.int64)))


def test_items_are_the_same_in_any_process_and_pickle_without_the_data(tmp_path: Path) -> None:
    train_bin, _ = write_tokens(tmp_path)
    dataset = token_file(str(train_bin), seq_len=16, vocab_size=VOCAB).train
    first = [dataset[i] for i in (0, 7, 100)]
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(pickle.dumps(dataset)) < 2000  # the memmap is reopened in a worker, not shipped
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, (copy[i] for i in (0, 7, 100)))
    )


@pytest.mark.parametrize(
    "kwargs, argument, words",
    [
        ({"path": "nope.bin"}, "path", "no such file"),
        ({"eval_path": "nope.bin"}, "eval_path", "no such file"),
        ({"dtype": "float32"}, "dtype", "not an integer type"),
        ({"dtype": "int64"}, "path", "not a whole number of int64 token ids"),  # 8006 bytes
        ({"seq_len": 3000}, "path", "too few tokens for a train and an eval window"),
        ({"eval_fraction": 0.0}, "eval_fraction", r"must be in \(0, 1\)"),
        ({"vocab_size": 1}, "vocab_size", "must be >= 2"),
    ],
)
def test_preflight_names_the_argument(tmp_path: Path, monkeypatch, kwargs: dict, argument: str, words: str) -> None:
    write_tokens(tmp_path, count=4003)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError, match=words) as raised:
        preflight(**{"path": "train.bin", "seq_len": 16, "vocab_size": VOCAB, **kwargs})
    assert raised.value.argument == argument


def test_an_unreadable_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Root reads any file; a refused open() stands in for a file of another user."""
    train_bin, _ = write_tokens(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(module, "open", refuse, raising=False)
    with pytest.raises(ArgumentError, match="cannot read .*train.bin: Permission denied"):
        preflight(str(train_bin), seq_len=16, vocab_size=VOCAB)


def test_a_token_beyond_the_vocabulary_is_named(tmp_path: Path) -> None:
    train_bin, _ = write_tokens(tmp_path)
    dataset = token_file(str(train_bin), seq_len=16, vocab_size=32).train
    with pytest.raises(ValueError, match="outside the vocabulary of data.dataset.vocab_size=32"):
        [dataset[i] for i in range(len(dataset))]


# ---- training on it ---------------------------------------------------------------------------

RUN = (
    "model=gpt",
    "data=token_file",
    "data.dataset.path=data/train.bin",
    "data.dataset.eval_path=data/val.npy",
    "data.dataset.seq_len=16",
    f"data.dataset.vocab_size={VOCAB}",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "data.batch_size=4",
    "trainer.nprocs=2",
    "trainer.max_steps=40",
    "trainer.ckpt_every=15",
    "trainer.keep_checkpoints=5",
    "trainer.eval_every=0",
    "trainer.log_every=10",
)  # 249 windows / (2 x 4) = 31 steps an epoch: the resume at step 15 is mid-epoch, the run crosses one


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding data/train.bin and data/val.npy, and one uninterrupted run in it."""
    root = tmp_path_factory.mktemp("tokens")
    write_tokens(root / "data")
    done = run_cli("train", "hydra.run.dir=straight", *RUN, cwd=root)
    assert done.returncode == 0, describe(done)
    return root


def test_a_run_stopped_mid_epoch_resumes_bit_identically(project: Path) -> None:
    straight = project / "straight"
    resumed = project / "resumed"
    shutil.copytree(straight, resumed)
    for later in ("step_00000030", "step_00000040"):  # as if it had stopped after step 15
        for suffix in (".json", ".pt"):
            (resumed / "checkpoints" / f"{later}{suffix}").unlink()
    (resumed / "model.pt").unlink()

    done = run_cli("train", "hydra.run.dir=resumed", *RUN, cwd=project)

    assert done.returncode == 0, describe(done)
    assert "resumed from step 15 (epoch 0)" in done.stdout, describe(done)
    a = torch.load(straight / "model.pt", weights_only=True)
    b = torch.load(resumed / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "eval_loss" in (straight / "events.jsonl").read_text()


def test_a_token_file_missing_where_the_job_runs_is_one_error_line(project: Path, tmp_path: Path) -> None:
    """The path was there when submitted, not on the node: every rank fails alike, no traceback."""
    run_dir = tmp_path / "run"
    shutil.copytree(project / "straight", run_dir)
    shutil.rmtree(run_dir / "checkpoints")

    done = run_cli("hpctrain.worker", str(run_dir), cwd=tmp_path)  # data/train.bin is not here

    assert_refused(done, 78, "error: hpctrain.data.token_file.token_file: path: no such file:", "data/train.bin")
