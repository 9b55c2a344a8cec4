"""Mistakes only the first batch shows, said in one line naming what to change.

A model giving 5 class scores for 10-class data, or token ids at or above the model's vocabulary,
ended the first step with a 44-line IndexError (on a GPU, a device-side assert that poisons the
process) and no record. During a life's first micro-batch (and no other: each check syncs with
the host once) hpctrain looks before torch indexes:
- every nn.Embedding's input, by a forward pre-hook: an id outside its rows names the module
  and the key that sizes it (the token embedding: `model.vocab_size`; a position embedding
  given a longer sequence: `model.block_size`);
- the scores against integer targets: a target at or above the number of scores names the
  model's width (`model.num_classes`).
Each is a UserError: one `error:` line, a `failure` event (`user_error`), status FAILED.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from hpctrain.errors import UserError

# CrossEntropyLoss's default ignore_index, and nanoGPT's: targets below 0 are not classes.
_IGNORED_BELOW = 0


@contextmanager
def embeddings_checked(model: nn.Module) -> Iterator[None]:
    """Within: every embedding of `model` refuses an id outside its rows, saying which."""
    handles = [
        module.register_forward_pre_hook(_check_ids(name))
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _check_ids(name: str):  # type: ignore[no-untyped-def]
    def hook(module: nn.Embedding, args: tuple) -> None:
        if not args or not isinstance(args[0], torch.Tensor) or args[0].numel() == 0:
            return
        ids = args[0]
        highest, lowest = int(ids.max()), int(ids.min())
        if highest < module.num_embeddings and lowest >= 0:
            return
        wrong = highest if highest >= module.num_embeddings else lowest
        raise UserError(
            f"model: its embedding {name or 'model'} has {module.num_embeddings} rows but was given id {wrong}: "
            f"{_fix(name, module.num_embeddings, wrong)}"
        )

    return hook


def _fix(name: str, rows: int, wrong: int) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("wpe", "position_embeddings", "pos_emb", "pos_embedding"):
        return (
            f"the sequences are longer than the model's positions; set model.block_size to at least {wrong + 1} "
            "(or data.dataset.seq_len to at most the model's)"
        )
    if wrong < 0:
        return "token ids must not be negative; check the data's tokenizer"
    return (
        f"the data's token ids reach {wrong}; set model.vocab_size to at least {wrong + 1} "
        "(it must cover data.dataset.vocab_size)"
    )


def check_scores(scores: torch.Tensor, target: torch.Tensor) -> None:
    """Class scores [N, C] against integer targets [N]: every class a target names has a score."""
    if scores.dim() != 2 or target.is_floating_point() or target.dim() != 1 or target.numel() == 0:
        return
    width, highest = scores.shape[1], int(target.max())
    if highest >= width and highest >= _IGNORED_BELOW:
        raise UserError(
            f"model: its output has {width} scores a sample but the targets go up to {highest}: give one score "
            f"per class (set model.num_classes={highest + 1}, or your model's own width key)"
        )
