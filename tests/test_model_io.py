"""The model contract (hpctrain.trainer.model_io): outputs a tensor, a tuple or an object with
`logits`/`loss`; dict batches; a model that computes its own loss from the targets it is given.
As tables, then trained end to end with models written the way nanoGPT and Hugging Face write
them (no adapter), through the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpctrain.errors import UserError
from hpctrain.trainer import model_io
from hpctrain.trainer.model_io import Contract

SCORES = torch.arange(6.0).reshape(2, 3)
LOSS = torch.tensor(0.5)


class Output(OrderedDict):
    """As transformers' ModelOutput: a Mapping whose fields are attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Plain:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


@pytest.mark.parametrize(
    "output",
    [SCORES, (SCORES, LOSS), [SCORES], Output(loss=LOSS, logits=SCORES), Plain(logits=SCORES), {"logits": SCORES}],
    ids=["tensor", "tuple", "list", "model-output", "object", "dict"],
)
def test_the_scores_are_found_in_every_usual_output(output: Any) -> None:
    assert model_io.logits(output) is SCORES


@pytest.mark.parametrize("output", [{"hidden": SCORES}, "text", (), (None, SCORES)], ids=str)
def test_an_output_without_scores_names_the_fix(output: Any) -> None:
    with pytest.raises(UserError, match="return a tensor, a tuple whose first element is one, or an object with"):
        model_io.logits(output)


@pytest.mark.parametrize("output", [Output(loss=LOSS, logits=SCORES), (SCORES, LOSS), Plain(loss=LOSS)])
def test_a_models_own_loss_is_found(output: Any) -> None:
    assert model_io.own_loss(output) is LOSS


def test_a_model_given_targets_that_returns_no_loss_names_the_fix() -> None:
    with pytest.raises(UserError, match="trainer.model_takes_targets=false"):
        model_io.own_loss((SCORES, None))


class NanoGPTLike(nn.Module):
    def forward(self, idx, targets=None):  # type: ignore[no-untyped-def]
        return idx


class HuggingFaceLike(nn.Module):
    def forward(self, input_ids=None, attention_mask=None, labels=None):  # type: ignore[no-untyped-def]
        return input_ids


CONTRACTS = {
    "nanoGPT's targets, found": (NanoGPTLike(), None, False, Contract("targets")),
    "HF's labels: hpctrain's loss unless asked": (HuggingFaceLike(), None, True, Contract()),
    "HF's labels, asked, class labels": (HuggingFaceLike(), True, False, Contract("labels")),
    "HF's labels, asked, next-token data: the inputs": (HuggingFaceLike(), True, True, Contract("labels", True)),
    "told never": (NanoGPTLike(), False, False, Contract()),
    "a plain model": (nn.Linear(2, 2), None, False, Contract()),
}


@pytest.mark.parametrize("row", CONTRACTS.values(), ids=CONTRACTS.keys())
def test_contract_of(row: tuple) -> None:
    model, setting, next_token, expected = row
    assert Contract.of(model, setting, next_token) == expected


def test_a_model_told_to_take_targets_that_cannot_is_refused() -> None:
    with pytest.raises(UserError, match="takes no targets or labels argument; set trainer.model_takes_targets=false"):
        Contract.of(nn.Linear(2, 2), True)


def test_labels_given_the_inputs_of_next_token_data() -> None:
    seen: dict[str, Any] = {}

    class Model(nn.Module):
        def forward(self, input_ids, attention_mask=None, labels=None):  # type: ignore[no-untyped-def]
            seen.update(input_ids=input_ids, labels=labels, mask=attention_mask)
            return input_ids

    ids, mask, shifted = torch.tensor([[1, 2, 3]]), torch.ones(1, 3), torch.tensor([[2, 3, 4]])
    model_io.call(Model(), {"input_ids": ids, "attention_mask": mask}, shifted, Contract("labels", True))
    assert seen["labels"] is ids and seen["mask"] is mask  # never the shifted targets: no double shift
    model_io.call(Model(), {"input_ids": ids}, shifted, Contract("labels"))
    assert seen["labels"] is shifted


def test_batches_move_to_the_device_in_their_own_shape() -> None:
    batch = ({"input_ids": torch.ones(2, 3), "mask": [torch.zeros(1)]}, torch.zeros(2))
    moved = model_io.to_device(batch, torch.device("cpu"))
    assert isinstance(moved, tuple) and isinstance(moved[0], dict) and isinstance(moved[0]["mask"], list)
    assert torch.equal(moved[0]["input_ids"], batch[0]["input_ids"])


# ---- trained end to end ----------------------------------------------------------------------

MODELS = '''
import torch
from torch import nn
from torch.nn import functional as F

from hpctrain.data.splits import Splits


class TinyGPT(nn.Module):
    """As nanoGPT's model.py: forward(idx, targets=None) -> (logits, loss)."""

    def __init__(self, vocab_size=64, n_embd=16):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(torch.tanh(self.wte(idx)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class Output(dict):
    def __getattr__(self, name):
        return self[name]


class DictNet(nn.Module):
    """As a Hugging Face classifier: keyword inputs, an output object with `logits`."""

    def __init__(self, num_classes=10, image_size=8, **unused):
        super().__init__()
        self.fc = nn.Linear(image_size * image_size, num_classes)

    def forward(self, pixels, scale=None):
        return Output(logits=self.fc(pixels.flatten(1) * scale.view(-1, 1)))


class Pairs(torch.utils.data.Dataset):
    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        image, label = self.base[index]
        return {"pixels": image, "scale": torch.tensor(1.0)}, label


def dict_digits(**kwargs):
    from hpctrain.data.digits import digits

    splits = digits(**kwargs)
    return Splits(train=Pairs(splits.train), eval=Pairs(splits.eval))
'''

BIN = Path(sys.executable).parent
QUICK = ["trainer.eval_every=4", "trainer.log_every=2", "trainer.ckpt_every=0"]


def train(tmp_path: Path, name: str, *overrides: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "usermodels.py").write_text(textwrap.dedent(MODELS))
    run_dir = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "PYTHONPATH"}
    done = subprocess.run(
        [str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", *QUICK, *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, run_dir


def losses(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_a_nanogpt_style_model_trains_on_its_own_loss_as_hpctrains_loss_would(tmp_path: Path) -> None:
    tokens = ["data=tokens", "data.dataset.vocab_size=64", "data.dataset.seq_len=16", "trainer.max_steps=8"]
    model = ["model._target_=usermodels.TinyGPT", "+model.vocab_size=64"]
    own, own_dir = train(tmp_path, "own", *tokens, *model)
    assert own.returncode == 0, own.stderr[-3000:]
    # The same model with hpctrain's cross-entropy on its scores: the same loss, step by step
    # (its own loss is the same cross-entropy over the same shifted targets: no double shift).
    ours, ours_dir = train(tmp_path, "ours", *tokens, *model, "trainer.model_takes_targets=false")
    assert ours.returncode == 0, ours.stderr[-3000:]
    a, b = losses(own_dir), losses(ours_dir)
    assert a.keys() == b.keys() and 8 in a
    for step in a:
        assert a[step]["loss"] == pytest.approx(b[step]["loss"], rel=1e-5), step
        if "eval_loss" in a[step]:
            assert a[step]["eval_loss"] == pytest.approx(b[step]["eval_loss"], rel=1e-5)


def test_dict_batches_and_an_output_object_train(tmp_path: Path) -> None:
    done, run_dir = train(
        tmp_path,
        "dict",
        "model._target_=usermodels.DictNet",
        "data.dataset._target_=usermodels.dict_digits",
        "trainer.max_steps=8",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = losses(run_dir)[8]
    assert "eval_accuracy" in last and last["loss"] > 0


# hpctrain's own models are checked against the data before anything starts (config/fits.py);
# a user's model is not known until it runs.
MISTAKES = {
    # Their classifier gives 5 scores for the 10 digits: a 44-line IndexError before.
    "classes": (
        [
            "model._target_=usermodels.DictNet",
            "model.num_classes=5",
            "data.dataset._target_=usermodels.dict_digits",
            "trainer.max_steps=4",
        ],
        "error: model: its output has 5 scores a sample but the targets go up to 9: give one score per class "
        "(set model.num_classes=10, or your model's own width key)",
    ),
    # Token ids up to 299 into their GPT whose vocabulary holds 64: a 47-line IndexError before.
    "vocabulary": (
        [
            "model._target_=usermodels.TinyGPT",
            "+model.vocab_size=64",
            "data=tokens",
            "data.dataset.vocab_size=300",
            "data.dataset.seq_len=16",
            "trainer.max_steps=4",
        ],
        "error: model: its embedding wte has 64 rows but was given id",
    ),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_a_mistake_the_first_batch_shows_is_one_line_a_failure_and_failed(tmp_path: Path, name: str) -> None:
    overrides, said = MISTAKES[name]
    done, run_dir = train(tmp_path, name, *overrides)
    assert done.returncode != 0, done.stderr[-2000:]
    assert said in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    failures = [
        e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines()) if e["event"] == "failure"
    ]
    assert [f["cause"] for f in failures] == ["user_error"], failures
    status = subprocess.run(
        [str(BIN / "hpctrain-status"), str(run_dir)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert status.returncode == 1 and "FAILED (user_error)" in status.stdout, status.stdout
