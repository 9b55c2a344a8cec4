"""The hang watchdog's wait for the next step, learned from the life's steps
(hpctrain/process/step_timeout.py): a table over beats, then a real process whose steps stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hpctrain.config.schema import TrainerConfig
from hpctrain.process.step_timeout import (
    FACTOR,
    MIN_SAMPLES,
    WARMUP_STEPS,
    StepTimeout,
    phase_timeouts,
)
from hpctrain.run.exitcodes import WORKER_HUNG
from hpctrain.trainer.hooks import EVALUATION, FIRST_STEP

CAP, FLOOR = 900.0, 60.0
ENOUGH = WARMUP_STEPS + MIN_SAMPLES + 1  # steps (beats) before a timeout is learned


def stepped(timeout: StepTimeout, count: int, every_s: float, start: float = 0.0) -> float:
    now = start
    for _ in range(count):
        now += every_s
        timeout.stepped(now)
    return now


@pytest.mark.parametrize(
    ("beats", "expected"),
    [
        pytest.param([("steps", ENOUGH - 1, 1.0)], CAP, id="too few steps yet: the whole hang timeout"),
        pytest.param([("steps", ENOUGH, 1.0)], FLOOR, id="1 s steps: the floor (60 s)"),
        pytest.param([("steps", ENOUGH, 12.0)], FACTOR * 12.0, id="12 s steps: 10 x their p90"),
        pytest.param([("steps", ENOUGH, 200.0)], CAP, id="never above trainer.hang_timeout_s"),
        pytest.param([("steps", ENOUGH, 1.0), ("other", 1, 0.0)], CAP, id="after an evaluation or a save: the cap"),
        pytest.param(
            [("steps", ENOUGH, 1.0), ("follow", 1, 0.5)],
            FLOOR,
            id="a periodic save or an evaluation over, steps follow: the learned timeout",
        ),
        pytest.param(
            [("steps", ENOUGH - 1, 1.0), ("follow", 1, 0.5)], CAP, id="steps follow, nothing learned yet: the cap"
        ),
        pytest.param(
            [("steps", 2, 1.0), ("follow", 1, 300.0), ("steps", ENOUGH - 2, 1.0)],
            CAP,
            id="the time to the step after a save is not a step's: one sample short",
        ),
        pytest.param(
            [("steps", ENOUGH, 1.0), ("other", 1, 0.0), ("steps", 1, 1.0)], FLOOR, id="the next step: learned again"
        ),
        pytest.param(
            [("steps", 2, 1.0), ("other", 1, 300.0), ("steps", ENOUGH - 2, 1.0)],
            CAP,
            id="an evaluation between steps is not a step: one sample short",
        ),
        pytest.param(
            [("steps", WARMUP_STEPS + 1, 50.0), ("steps", MIN_SAMPLES, 1.0)],
            FLOOR,
            id="a life's first steps (a compile) are not counted",
        ),
    ],
)
def test_the_wait_for_the_next_step(beats: list[tuple[str, int, float]], expected: float) -> None:
    timeout, now = StepTimeout(cap_s=CAP, floor_s=FLOOR), 0.0
    timeout.other(now)  # ready to train
    for kind, count, every_s in beats:
        if kind == "steps":
            now = stepped(timeout, count, every_s, now)
        else:
            now += every_s
            timeout.other(now, steps_follow=kind == "follow")
    assert timeout.timeout_s() == pytest.approx(expected)


def test_off_is_always_the_hang_timeout() -> None:
    timeout = StepTimeout(cap_s=CAP, floor_s=0.0)
    stepped(timeout, 100, 1.0)
    assert timeout.timeout_s() == CAP and timeout.learned_s() is None


def test_an_occasional_slow_step_raises_the_learned_timeout() -> None:
    """The 90th percentile: one slow step in ten (a loader refilling) sets the bar."""
    timeout = StepTimeout(cap_s=CAP, floor_s=FLOOR)
    now = stepped(timeout, WARMUP_STEPS + 1, 1.0)
    for i in range(40):
        now = stepped(timeout, 1, 9.0 if i % 5 == 0 else 1.0, now)
    assert timeout.timeout_s() == pytest.approx(FACTOR * 9.0)


# A process whose steps stop after 40 of 20 ms: its watchdog (trainer.hang_timeout_s 60) ends it
# after the learned 1 s floor, not after the 60 s.
STOPS_STEPPING = """
import sys, time
from hpctrain.process.watchdog import Watchdog
dog = Watchdog(60.0, on_hang=lambda idle: print(f"hang after {idle:.1f} s", flush=True), step_floor_s=1.0).start()
for _ in range(40):
    time.sleep(0.02)
    dog.stepped()
time.sleep(30)
"""


# The same after a periodic save between steps (the trainer's beats: SAVE, then STEPS_FOLLOW once
# it is written): the step after it is waited for as any step. It once waited the whole
# trainer.hang_timeout_s: a rank stopped 14 ms after its save at step 80 went unnoticed for 12
# minutes in a loaded CI run.
STOPS_AFTER_A_SAVE = STOPS_STEPPING.replace(
    "time.sleep(30)", "dog.beat('save')\ntime.sleep(0.2)\ndog.beat('steps_follow')\ntime.sleep(30)"
)


@pytest.mark.slow
@pytest.mark.parametrize("script", [STOPS_STEPPING, STOPS_AFTER_A_SAVE], ids=["after a step", "after a periodic save"])
def test_a_process_whose_steps_stop_is_a_hang_after_the_learned_timeout(script: str) -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    took = time.monotonic() - began
    assert done.returncode == WORKER_HUNG, done.stderr
    assert "learned from this life's steps, trainer.step_hang_timeout_s=1" in done.stderr
    # The learned 1 s, read by a watch that looks once a second: 1 to 2 s, never the 60 s cap.
    idle = float(done.stdout.removeprefix("hang after ").split()[0])
    assert 1.0 <= idle < 3.0 and took < 20, (took, done.stdout)


@pytest.mark.parametrize(
    "phase_s, then_steps, expected",
    [
        pytest.param(1500.0, 0, 1500.0, id="a life's first step (a compile) has its own timeout"),
        pytest.param(1200.0, 0, 1200.0, id="an evaluation has its own timeout"),
        pytest.param(None, 0, CAP, id="a phase without its own: trainer.hang_timeout_s"),
        pytest.param(1500.0, ENOUGH, FLOOR, id="once steps follow, the learned timeout again"),
    ],
)
def test_a_phase_has_its_own_timeout_until_the_next_step(
    phase_s: float | None, then_steps: int, expected: float
) -> None:
    timeout, now = StepTimeout(cap_s=CAP, floor_s=FLOOR), 0.0
    now = stepped(timeout, ENOUGH, 1.0, now)
    assert timeout.timeout_s() == pytest.approx(FLOOR)
    timeout.other(now, phase_s)  # an evaluation, a save, or a life's start begins
    assert timeout.timeout_s() == pytest.approx(phase_s or CAP)
    if then_steps:
        stepped(timeout, then_steps, 1.0, now)
    assert timeout.timeout_s() == pytest.approx(expected)


@pytest.mark.parametrize(
    "keys, expected",
    [
        pytest.param({}, {}, id="defaults: every phase hang_timeout_s"),
        pytest.param({"compile": True}, {FIRST_STEP: 1500.0}, id="a compiled model's first step"),
        pytest.param({"eval_timeout_s": 1200}, {EVALUATION: 1200.0}, id="an evaluation's own"),
        pytest.param(
            {"compile": True, "collective_timeout_s": 600, "hang_timeout_s": 20},
            {FIRST_STEP: 540.0},
            id="kept below the collectives",
        ),
        pytest.param(
            {"compile": True, "collective_timeout_s": 4000, "hang_timeout_s": 2000},
            {FIRST_STEP: 2000.0},
            id="never below hang_timeout_s",
        ),
        pytest.param({"first_step_timeout_s": 100}, {FIRST_STEP: 100.0}, id="set: as set"),
    ],
)
def test_the_trainer_keys_set_each_phase(keys: dict[str, int], expected: dict[str, float]) -> None:
    trainer = TrainerConfig(**keys)
    assert phase_timeouts(trainer) == expected


def test_a_phase_timeout_above_the_collective_timeout_is_refused_by_key() -> None:
    with pytest.raises(ValueError, match="trainer.save_timeout_s"):
        TrainerConfig(save_timeout_s=3600)


@pytest.mark.parametrize(
    "kind, phase_s, key, said",
    [
        ("steps", None, "", "learned from this life's steps, trainer.step_hang_timeout_s=60"),
        ("other", 1200.0, "save_timeout_s", "trainer.save_timeout_s=1200"),
        ("other", None, "", "trainer.hang_timeout_s=900"),
    ],
)
def test_a_hang_names_the_key_that_set_its_timeout(kind: str, phase_s: float | None, key: str, said: str) -> None:
    """The hang's one line points at the key to change: the learned step timeout's floor, the
    phase's own key, or trainer.hang_timeout_s."""
    timeout, now = StepTimeout(cap_s=CAP, floor_s=FLOOR), 0.0
    now = stepped(timeout, ENOUGH, 1.0, now)
    if kind == "other":
        timeout.other(now, phase_s, key)
    assert said in timeout.source()
