"""Values a `_target_` node's signature cannot check, checked on the login node: the ranges the
optimizers and schedules refuse themselves (only once built, inside every training process), and
whether the model fits the data (classes, vocabulary, sequence length, input shape).

Pure functions of the resolved config (plain dicts): nothing is imported or built. The values
are checked by argument name wherever they appear (`lr` of any optimizer: torch.optim refuses a
negative one in every class), and the fit for hpctrain's own models and datasets (a user's
`_target_` model is theirs to check: hpctrain.config.targets' `preflight` hook). Each error
names the key and what to set; none is a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    return _number(value) and value >= 0


def _unit(value: Any) -> bool:
    return _number(value) and 0 <= value < 1


def _count(value: Any) -> bool:
    return _integer(value) and value >= 1


NON_NEGATIVE, UNIT, COUNT = ("a number >= 0", _non_negative), ("a number in [0, 1)", _unit), ("an integer >= 1", _count)
# argument name -> (what it must be, the test): torch.optim's own checks (Invalid learning rate,
# epsilon, beta, weight_decay, momentum), the schedules', and the models' and datasets' sizes.
_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "lr": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "eps": NON_NEGATIVE,
    "momentum": NON_NEGATIVE,
    "betas": ("two numbers in [0, 1)", lambda v: isinstance(v, list) and len(v) == 2 and all(_unit(b) for b in v)),
    "warmup_steps": ("an integer >= 0", lambda v: _integer(v) and v >= 0),
    "min_lr_ratio": ("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1),
    "dropout": UNIT,
    "dropout1": UNIT,
    "dropout2": UNIT,
    "num_classes": COUNT,
    "n_layer": COUNT,
    "n_head": COUNT,
    "n_embd": COUNT,
    "vocab_size": COUNT,
    "seq_len": COUNT,
    "block_size": COUNT,
}


def check_values(config: Mapping[str, Any]) -> str | None:
    """The first argument of the model, dataset, optimizer or schedule outside its range, as an
    error line naming the key; None when all are in range."""
    data = config.get("data")
    # The data first: a model's size may be interpolated from it (GPT's block_size from seq_len).
    nodes = {"data.dataset": data.get("dataset") if isinstance(data, Mapping) else None}
    nodes.update(model=config.get("model"), optim=config.get("optim"), sched=config.get("sched"))
    for key, node in nodes.items():
        if not isinstance(node, Mapping):
            continue
        for name, value in node.items():
            rule = _RULES.get(str(name))
            if rule is not None and not rule[1](value):
                return f"{key}.{name}={_shown(value)}: must be {rule[0]}"
    return None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


# ---- does the model fit the data? -----------------------------------------------------------------


@dataclass(frozen=True)
class DataShape:
    kind: str  # "images" (a class per image) or "tokens" (a next token per token)
    option: str  # how the user chose it (data=digits)
    classes: int = 0
    channels: int = 0
    size: int = 0
    vocab: int = 0
    seq_len: int = 0


_DATA: dict[str, Callable[[Mapping[str, Any]], DataShape]] = {
    "hpctrain.data.digits.digits": lambda a: DataShape("images", "data=digits", classes=10, channels=1, size=8),
    "hpctrain.data.tokens.synthetic_tokens": lambda a: DataShape(
        "tokens", "data=tokens", vocab=a.get("vocab_size", 0), seq_len=a.get("seq_len", 0)
    ),
    "hpctrain.data.token_file.token_file": lambda a: DataShape(
        "tokens", "data=token_file", vocab=a.get("vocab_size", 0), seq_len=a.get("seq_len", 0)
    ),
}

_MODEL_KIND = {
    "hpctrain.models.convnet.ConvNet": ("images", "model=convnet"),
    "hpctrain.models.mlp.MLP": ("images", "model=mlp"),
    "hpctrain.models.gpt.GPT": ("tokens", "model=gpt"),
}


def check_fit(config: Mapping[str, Any]) -> str | None:
    """Why hpctrain's own model cannot train on hpctrain's own data as configured (an error line
    naming the key to set), or None (it fits, or either is a user's own)."""
    model, data = config.get("model"), config.get("data")
    dataset = data.get("dataset") if isinstance(data, Mapping) else None
    if not isinstance(model, Mapping) or not isinstance(dataset, Mapping):
        return None
    shape_of, kind = _DATA.get(str(dataset.get("_target_"))), _MODEL_KIND.get(str(model.get("_target_")))
    if shape_of is None or kind is None:
        return None
    shape = shape_of(dataset)
    wanted, chosen = kind
    if wanted != shape.kind:
        better = "model=gpt" if shape.kind == "tokens" else "model=convnet or model=mlp"
        return (
            f"model: {chosen} takes {wanted}, and {shape.option} gives "
            f"{'token sequences' if shape.kind == 'tokens' else 'images'}: set {better}"
        )
    if shape.kind == "images":
        return _images(model, shape)
    return _tokens(model, shape)


def _images(model: Mapping[str, Any], shape: DataShape) -> str | None:
    classes: Any = model.get("num_classes")
    if _integer(classes) and classes < shape.classes:
        return (
            f"model.num_classes={classes}: {shape.option} has {shape.classes} classes (targets 0 to "
            f"{shape.classes - 1}); set model.num_classes={shape.classes}"
        )
    if "in_channels" in model and model["in_channels"] != shape.channels:
        channels = model["in_channels"]
        return f"model.in_channels={channels}: {shape.option} images have {shape.channels}; set it to {shape.channels}"
    if "image_size" in model and model["image_size"] != shape.size:
        size = model["image_size"]
        return f"model.image_size={size}: {shape.option} images are {shape.size}x{shape.size}; set it to {shape.size}"
    pixels = shape.channels * shape.size * shape.size
    if "in_features" in model and model["in_features"] != pixels:
        return (
            f"model.in_features={model['in_features']}: {shape.option} images have {pixels} values "
            f"({shape.channels}x{shape.size}x{shape.size}); set model.in_features={pixels}"
        )
    return None


def _tokens(model: Mapping[str, Any], shape: DataShape) -> str | None:
    vocab: Any = model.get("vocab_size")
    block: Any = model.get("block_size")
    if _integer(vocab) and vocab < shape.vocab:
        return (
            f"model.vocab_size={vocab}: {shape.option} has token ids up to {shape.vocab - 1} "
            f"(data.dataset.vocab_size={shape.vocab}); set model.vocab_size={shape.vocab}"
        )
    if _integer(block) and block < shape.seq_len:
        return (
            f"model.block_size={block}: {shape.option} samples are {shape.seq_len} tokens "
            f"(data.dataset.seq_len); set model.block_size={shape.seq_len}"
        )
    return None
