"""hpctrain-tune's pure parts as tables: the search space, the budget arithmetic, the verdict."""

from __future__ import annotations

import pytest

from hpctrain.cli.tune import split_space
from hpctrain.config.search_space import Param, parse_param
from hpctrain.config.tune import TuneConfig
from hpctrain.run.events import Failure, Finish, Pruned, Start
from hpctrain.tune.budget import Counts, finished, to_submit
from hpctrain.tune.report import Verdict, judge

GOOD = [
    ("optim.lr", "float(1e-4, 1e-1, log)", Param("optim.lr", "float", 1e-4, 1e-1, log=True)),
    ("optim.lr", "float(0,1)", Param("optim.lr", "float", 0.0, 1.0)),
    ("trainer.grad_clip", "float(0.5, 2, step=0.5)", Param("trainer.grad_clip", "float", 0.5, 2.0, step=0.5)),
    ("data.batch_size", "int(16,128,log)", Param("data.batch_size", "int", 16, 128, log=True)),
    ("data.batch_size", "int(1, 9, step=2)", Param("data.batch_size", "int", 1, 9, step=2)),
    ("data.batch_size", "choice(32, 64)", Param("data.batch_size", "choice", choices=(32, 64))),
    ("optim.lr", "choice(1e-3, 3e-4)", Param("optim.lr", "choice", choices=(1e-3, 3e-4))),
    ("model._target_", "choice(a.B, c.D)", Param("model._target_", "choice", choices=("a.B", "c.D"))),
    ("trainer.compile", "choice(true,false)", Param("trainer.compile", "choice", choices=(True, False))),
    ("optim.lr", {"type": "float", "low": 1e-5, "high": 0.1, "log": True}, Param("optim.lr", "float", 1e-5, 0.1, True)),
    ("data.batch_size", {"type": "choice", "choices": [8, 16]}, Param("data.batch_size", "choice", choices=(8, 16))),
]


@pytest.mark.parametrize("key,spec,expected", GOOD)
def test_space_forms(key: str, spec: object, expected: Param) -> None:
    assert parse_param(key, spec) == expected


BAD = [
    ("optim.lr", "float(1e-1, 1e-4)", "LOW must be below HIGH"),
    ("optim.lr", "float(0, 1, log)", "a log scale needs LOW > 0"),
    ("optim.lr", "float(1e-4, 1, log, step=0.1)", "cannot be combined"),
    ("optim.lr", "float(1e-4)", "needs a low and a high bound"),
    ("optim.lr", "float(a, 1)", "LOW must be a number"),
    ("optim.lr", "float(0, inf)", "must be finite"),
    ("optim.lr", "float(0, 1, logg)", "neither `log` nor `step=S`"),
    ("optim.lr", "uniform(0, 1)", "is not a search dimension"),
    ("data.batch_size", "int(1.5, 4)", "whole numbers"),
    ("data.batch_size", "int(1, 8, step=0)", "step must be > 0"),
    ("data.batch_size", "choice()", "at least one value"),
    ("data.batch_size", "choice(8, 8)", "repeats a value"),
    ("data.batch_size", 32, "is not a search dimension"),
    ("optim.lr", {"type": "normal", "low": 0, "high": 1}, "tune.params.optim.lr.type: must be one of"),
    ("optim.lr", {"type": "float", "low": 0}, "needs low and high"),
    ("optim.lr", {"type": "float", "low": 0, "high": 1, "scale": "log"}, "unknown field(s) scale"),
    ("tune.n_trials", "int(1, 4)", "the tune section itself cannot be tuned"),
    ("optim..lr", "float(0, 1)", "is not a config key"),
]


@pytest.mark.parametrize("key,spec,message", BAD)
def test_space_refusals_name_the_key(key: str, spec: object, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_param(key, spec)
    assert str(refused.value).startswith(f"tune.params.{key}") and message in str(refused.value)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("direction", "max", "tune.direction: must be minimize or maximize"),
        ("n_trials", 0, "tune.n_trials: must be >= 1"),
        ("parallel", 0, "tune.parallel: must be >= 1"),
        ("pruner", "hyperband", "tune.pruner: must be none or median"),
        ("sampler", "cmaes", "tune.sampler: must be tpe or random"),
        ("metric", "", "tune.metric: must name a metric"),
        ("params", {"optim.lr": "float(1, 0)"}, "tune.params.optim.lr: LOW must be below HIGH"),
    ],
)
def test_settings_refusals(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TuneConfig(**{field: value})  # type: ignore[arg-type]


def test_command_line_space_is_split_from_hydra_overrides() -> None:
    rest, space = split_space(
        ["optim.lr=float(1e-4,1e-1,log)", "tune.n_trials=12", "data.batch_size=choice(32,64)", "-c", "+x=int(1,2)"]
    )
    assert space == {"optim.lr": "float(1e-4,1e-1,log)", "data.batch_size": "choice(32,64)"}
    assert rest == ["tune.n_trials=12", "-c", "+x=int(1,2)"]


# (running, complete, pruned, failed), n_trials, parallel -> trials to submit now
BUDGET = [
    ((0, 0, 0, 0), 12, 3, 3),  # the first wave
    ((3, 0, 0, 0), 12, 3, 0),  # full
    ((2, 1, 0, 0), 12, 3, 1),  # one ended: one more
    ((0, 3, 0, 0), 12, 3, 3),  # three ended at once (each refill sees the others' tells)
    ((2, 8, 1, 0), 12, 3, 1),  # 11 asked: only one left in the budget
    ((2, 7, 1, 1), 12, 3, 1),  # a failure spends budget too
    ((3, 9, 0, 0), 12, 3, 0),  # budget spent, three still running
    ((0, 10, 1, 1), 12, 3, 0),  # over: nothing to submit
    ((5, 0, 0, 0), 12, 3, 0),  # more running than parallel (parallel lowered): never negative
    ((0, 0, 0, 0), 2, 3, 2),  # a budget below parallel
]


@pytest.mark.parametrize("counts,n_trials,parallel,expected", BUDGET)
def test_budget(counts: tuple[int, int, int, int], n_trials: int, parallel: int, expected: int) -> None:
    state = Counts(*counts)
    assert to_submit(state, n_trials, parallel) == expected
    assert state.total + to_submit(state, n_trials, parallel) <= max(n_trials, state.total)


def test_finished() -> None:
    assert finished(Counts(0, 10, 1, 1), 12) and not finished(Counts(1, 10, 1, 0), 12)
    assert not finished(Counts(0, 3, 0, 0), 12)


START = Start(job_id="7", world_size=1)
# (events, action) -> verdict
VERDICTS = [
    ((START, Finish(step=20, extra={"eval_loss": 0.5, "eval_accuracy": 0.9})), "finish", Verdict("COMPLETE", 0.5)),
    ((START, Pruned(step=10, metric="eval_loss", value=1.5)), "finish", Verdict("PRUNED", 1.5)),
    (
        (START, Finish(step=20, extra={"loss": 0.5})),
        "finish",
        Verdict("FAIL", reason="tune.metric 'eval_loss' is not among the final metrics (loss)"),
    ),
    (
        (START, Finish(step=20, extra={"eval_loss": float("nan")})),
        "finish",
        Verdict("FAIL", reason="eval_loss ended as nan, not a finite number"),
    ),
    ((START,), "stop", Verdict("FAIL", reason="cancelled (scancel)")),
    (
        (START, Failure(cause="user_error", message="data.path: no file")),
        "fail",
        Verdict("FAIL", reason="the run failed: user_error (data.path: no file)"),
    ),
    (
        (START, Failure(cause="budget", reason="restart budget for crash spent")),
        "fail",
        Verdict("FAIL", reason="the run failed: budget (restart budget for crash spent)"),
    ),
    ((), "fail", Verdict("FAIL", reason="the run ended (fail) without finishing")),
]


@pytest.mark.parametrize("events,action,expected", VERDICTS)
def test_verdict(events: tuple, action: str, expected: Verdict) -> None:
    assert judge(events, action, "eval_loss") == expected
