"""The model contract: what hpctrain hands a model, and what it takes from the model's output.

Models nobody on the project wrote are used as they are, with no adapter:
- **inputs**: a tensor is passed as `model(inputs)`; a dict (Hugging Face's `input_ids`,
  `attention_mask`) as `model(**inputs)`, moved to the device as a dict.
- **output**: a tensor of scores; a tuple or list (its first element: nanoGPT returns
  `(logits, loss)`); an object or dict with `logits` (Hugging Face's ModelOutput).
- **a model that computes its own loss**: a forward taking `targets` (nanoGPT) is given the
  batch's targets and its loss is used (`loss` of the output, or a tuple's second element).
  `trainer.model_takes_targets` says so explicitly (true: also a forward taking `labels`, as
  Hugging Face's; false: never). Hugging Face's causal LMs shift `labels` themselves, while
  hpctrain's token data hands targets already shifted by one: to such a model on next-token
  data the inputs are given as `labels`, never the targets, so nothing is shifted twice.

An output that cannot be used is a UserError naming the fix, at the first step.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.errors import UserError

# The forward's keyword for targets, in the order looked for (nanoGPT, Hugging Face).
TARGET_NAMES = ("targets", "labels")


@dataclass(frozen=True)
class Contract:
    """How one model is called: the keyword its targets go to (None: hpctrain's loss), and
    whether that keyword gets the inputs instead (a model that shifts them itself)."""

    targets_name: str | None = None
    labels_are_inputs: bool = False

    @classmethod
    def of(cls, model: nn.Module, takes_targets: bool | None, next_token_data: bool = False) -> Contract:
        """`takes_targets`: trainer.model_takes_targets (None: `targets` in the forward's signature)."""
        if takes_targets is False:
            return cls()
        try:
            parameters = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # a forward without a signature to read
            return cls()
        names = [name for name in TARGET_NAMES if name in parameters]
        if takes_targets is None:
            names = [name for name in names if name == "targets"]
        if not names:
            if takes_targets:
                raise UserError(
                    f"trainer.model_takes_targets=true: {type(model).__name__}.forward takes no "
                    f"{' or '.join(TARGET_NAMES)} argument; set trainer.model_takes_targets=false"
                )
            return cls()
        name = names[0]
        return cls(name, labels_are_inputs=name == "labels" and next_token_data)


# hpctrain's own loss on the scores: what a model without a contract of its own gets.
PLAIN = Contract()


def call(model: nn.Module, inputs: Any, target: torch.Tensor | None, contract: Contract) -> Any:
    """The model's forward on a batch (targets passed where the contract says so)."""
    extra: dict[str, Any] = {}
    if contract.targets_name is not None and target is not None:
        given = inputs["input_ids"] if contract.labels_are_inputs and isinstance(inputs, Mapping) else inputs
        extra[contract.targets_name] = given if contract.labels_are_inputs else target
    if isinstance(inputs, Mapping):
        return model(**inputs, **extra)
    return model(inputs, **extra)


def logits(output: Any) -> torch.Tensor:
    """The scores in a model's output; UserError naming the fix when there are none."""
    if isinstance(output, torch.Tensor):
        return output
    found = _field(output, "logits")
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise UserError(
        f"model: its forward returned {_kind(output)}, which holds no scores to train on; return a "
        "tensor, a tuple whose first element is one, or an object with `logits` (a Hugging Face output)"
    )


def own_loss(output: Any) -> torch.Tensor:
    """The loss a model computed itself from the targets it was given."""
    found = _field(output, "loss")
    if isinstance(found, torch.Tensor):
        return found
    pair = isinstance(output, (tuple, list)) and len(output) > 1
    if pair and isinstance(output[1], torch.Tensor) and output[1].dim() == 0:
        return output[1]
    raise UserError(
        f"model: it was given targets (trainer.model_takes_targets) but its forward returned {_kind(output)} "
        "with no loss; return `loss` (a Hugging Face output) or `(logits, loss)`, or set "
        "trainer.model_takes_targets=false for hpctrain's loss (`loss._target_`) on its scores"
    )


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors moved to `device`, in the same dicts, tuples and lists."""
    if isinstance(batch, torch.Tensor):
        # non_blocking only helps from pinned memory; on CPU it is a no-op.
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(item, device) for item in batch)
    return batch


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):  # a ModelOutput is a Mapping too
        return output.get(name)
    return getattr(output, name, None)


def _kind(output: Any) -> str:
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {', '.join(type(item).__name__ for item in output) or 'nothing'}"
    return f"a {type(output).__name__}"
