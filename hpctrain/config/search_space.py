"""The search space: `tune.params` from config or the command line, parsed and checked.

Each config key names one dimension, in a short string form or a dict:

    optim.lr: float(1e-5, 1e-1, log)          # log-uniform between the bounds
    optim.weight_decay: float(0, 0.1)         # uniform
    trainer.grad_clip: float(0.5, 2, step=0.5)
    data.batch_size: int(16, 128, log)        # also int(1, 9, step=2)
    model._target_: choice(hpctrain.models.ConvNet, hpctrain.models.MLP)
    optim.lr: {type: float, low: 1e-5, high: 1e-1, log: true}

Pure: no Optuna here (the config check runs on every entry point). It is part of the config's
schema (`tune.params` is checked with the other keys); the study turns each Param into Optuna's
distribution (hpctrain.tune.study.distribution).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

KINDS = ("float", "int", "choice")
_CALL = re.compile(r"^\s*(float|int|choice)\s*\((.*)\)\s*$", re.S)
_FORMS = (
    "float(LOW, HIGH), float(LOW, HIGH, log), float(LOW, HIGH, step=S), "
    "int(LOW, HIGH[, log | step=S]) or choice(A, B, ...)"
)


@dataclass(frozen=True)
class Param:
    key: str  # the config key the trial sets (optim.lr)
    kind: str  # float, int or choice
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def edges(self) -> list[Any]:
        """Values at the edges of the space: checked against the config before anything runs."""
        if self.kind == "choice":
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [float(self.low), float(self.high)]


def is_spec(text: str) -> bool:
    """Does a command-line value read as a search dimension (`float(...)`, `int(...)`, `choice(...)`)?"""
    return bool(_CALL.match(text))


def parse_space(params: dict[str, Any]) -> list[Param]:
    """Every dimension of tune.params, in order; ValueError naming the key and the forms."""
    return [parse_param(str(key), spec) for key, spec in params.items()]


def parse_param(key: str, spec: Any) -> Param:
    where = f"tune.params.{key}"
    if not re.fullmatch(r"[A-Za-z_][\w.]*", key) or key.startswith("tune.") or ".." in key or key.endswith("."):
        raise ValueError(
            f"{where}: {key!r} is not a config key to tune (like optim.lr); the tune section itself cannot be tuned"
        )
    if isinstance(spec, str):
        return _from_string(key, spec, where)
    if isinstance(spec, dict):
        return _from_dict(key, spec, where)
    raise ValueError(f"{where}: {spec!r} is not a search dimension; write one of {_FORMS}")


def _from_string(key: str, spec: str, where: str) -> Param:
    match = _CALL.match(spec)
    if not match:
        raise ValueError(f"{where}: {spec!r} is not a search dimension; write one of {_FORMS}")
    kind, inside = match.group(1), match.group(2)
    words = [w.strip() for w in inside.split(",")] if inside.strip() else []
    if kind == "choice":
        return _checked(Param(key, "choice", choices=tuple(_scalar(w) for w in words)), where)
    if len(words) < 2:
        raise ValueError(f"{where}: {spec!r} needs a low and a high bound: {kind}(LOW, HIGH)")
    low, high = _number(words[0], where, "LOW"), _number(words[1], where, "HIGH")
    log, step = False, None
    for word in words[2:]:
        if word == "log":
            log = True
        elif word.startswith("step="):
            step = _number(word[len("step=") :], where, "step")
        else:
            raise ValueError(f"{where}: {word!r} in {spec!r} is neither `log` nor `step=S`")
    return _checked(Param(key, kind, low, high, log, step), where)


def _from_dict(key: str, spec: dict[str, Any], where: str) -> Param:
    unknown = set(spec) - {"type", "low", "high", "log", "step", "choices"}
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; use type, low, high, log, step, choices"
        )
    kind = spec.get("type")
    if kind not in KINDS:
        raise ValueError(f"{where}.type: must be one of {', '.join(KINDS)} (got {kind!r})")
    if kind == "choice":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)):
            raise ValueError(f"{where}.choices: a list of values is needed for type choice")
        return _checked(Param(key, "choice", choices=tuple(choices)), where)
    if "low" not in spec or "high" not in spec:
        raise ValueError(f"{where}: type {kind} needs low and high")
    low = _number(str(spec["low"]), where, "low")
    high = _number(str(spec["high"]), where, "high")
    step = None if spec.get("step") is None else _number(str(spec["step"]), where, "step")
    return _checked(Param(key, kind, low, high, bool(spec.get("log", False)), step), where)


def _checked(param: Param, where: str) -> Param:
    if param.kind == "choice":
        if not param.choices:
            raise ValueError(f"{where}: choice() needs at least one value")
        if len(set(map(repr, param.choices))) != len(param.choices):
            raise ValueError(f"{where}: choice{param.choices} repeats a value")
        bad = [c for c in param.choices if not (c is None or isinstance(c, (bool, int, float, str)))]
        if bad:
            raise ValueError(f"{where}: choices must be numbers, strings, booleans or null (got {bad[0]!r})")
        return param
    low, high = param.low, param.high
    assert low is not None and high is not None
    if param.kind == "int" and not all(float(v).is_integer() for v in (low, high, param.step or 1)):
        raise ValueError(f"{where}: int() bounds and step must be whole numbers (got {low:g}, {high:g})")
    if not low < high:
        raise ValueError(f"{where}: LOW must be below HIGH (got {low:g}, {high:g})")
    if param.log and param.step is not None:
        raise ValueError(f"{where}: log and step=... cannot be combined (Optuna samples one or the other)")
    if param.log and low <= 0:
        raise ValueError(f"{where}: a log scale needs LOW > 0 (got {low:g})")
    if param.step is not None and param.step <= 0:
        raise ValueError(f"{where}: step must be > 0 (got {param.step:g})")
    return param


def _number(word: str, where: str, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise ValueError(f"{where}: {what} must be a number (got {word!r})") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {what} must be finite (got {word!r})")
    return value


def _scalar(word: str) -> Any:
    """A choice as YAML reads it: 32 is an int, 1e-3 a float, true a bool, adamw a string."""
    try:
        value = yaml.safe_load(word) if word else ""
    except yaml.YAMLError:
        return word
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)  # YAML 1.1 reads 1e-3 as a string
    return value if value is None or isinstance(value, (bool, int, float, str)) else word
