"""Who is a submitit task, and which signal is its time-limit warning: read from the environment
submitit's job script sets (SUBMITIT_EXECUTOR, SUBMITIT_PREEMPT_SIGNAL), and the handler
submitit installed before the task function runs."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from hpctrain.process.submitit_task import SubmititTask


def submitits_handler(signum: int, frame: object) -> None:  # stands in for submitit's SignalHandler method
    raise AssertionError("not called here")


@pytest.fixture
def usr_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    for s in saved:
        signal.signal(s, submitits_handler)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),  # hpctrain-train, hpctrain-submit's own jobs, torchrun: not submitit
        ({"SUBMITIT_EXECUTOR": "local"}, None),  # submitit_local: no Slurm, plain local processes
        ({"SUBMITIT_EXECUTOR": "slurm"}, "USR2"),  # submitit's default signal
        ({"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "USR1"}, "USR1"),
        ({"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "SIGUSR1"}, "USR1"),
    ],
)
def test_a_submitit_task_and_its_signal(env: dict[str, str], expected: str | None, usr_handlers: None) -> None:
    task = SubmititTask.here(env)
    if expected is None:
        assert task is None
    else:
        assert task is not None and task.signal_name == expected and task.handler is submitits_handler


def test_an_unknown_submitit_signal_is_named() -> None:
    with pytest.raises(ValueError, match="SUBMITIT_PREEMPT_SIGNAL=WHAT"):
        SubmititTask.here({"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "WHAT"})


@pytest.mark.parametrize(
    ("slurm_signal", "submitit_signal", "error"),
    [
        ("USR2", "USR2", None),
        ("SIGUSR2", "USR2", None),
        ("USR1", "USR2", "slurm.signal=USR1: under hydra-submitit-launcher the time-limit warning is SIGUSR2"),
        ("USR2", "USR1", "set slurm.signal=USR1"),
    ],
)
def test_the_time_limit_signal_must_be_submitits(slurm_signal: str, submitit_signal: str, error: str | None) -> None:
    message = SubmititTask(submitit_signal, None).config_error(slurm_signal)
    assert message == error if error is None else error in (message or "")
