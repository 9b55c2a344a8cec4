"""A training process's start-up phases (hpctrain.process.startup_clock): from the marks it made and the
batch shell's launch time, the seconds each phase took; a phase is left out when one of its ends
was not marked (no batch script: no launch time)."""

from __future__ import annotations

from hpctrain.process.startup_clock import phases
from hpctrain.run.launch_marks import LAUNCHED_AT_ENV, RELAUNCHED_ENV
from hpctrain.run.life import ALLOCATED_AT_ENV

MARKS = {"began": 100.5, "imported": 103.0, "joined": 104.25, "ready": 104.75}


def test_every_phase_from_the_launch_to_ready() -> None:
    assert phases({LAUNCHED_AT_ENV: "100.0"}, MARKS) == {
        "launch_s": 0.5,
        "imports_s": 2.5,
        "rendezvous_s": 1.25,
        "resume_s": 0.5,
    }


def test_no_launch_time_outside_a_batch_script() -> None:
    assert phases({}, MARKS) == {"imports_s": 2.5, "rendezvous_s": 1.25, "resume_s": 0.5}
    assert phases({LAUNCHED_AT_ENV: "not a time"}, MARKS) == {"imports_s": 2.5, "rendezvous_s": 1.25, "resume_s": 0.5}


def test_a_phase_needs_both_ends() -> None:
    # Started by the local launcher: no worker.main, so no `began`.
    assert phases({LAUNCHED_AT_ENV: "100.0"}, {"joined": 104.25, "ready": 104.75}) == {"resume_s": 0.5}


def test_the_batch_script_s_set_up_on_the_life_s_first_launch() -> None:
    first = {ALLOCATED_AT_ENV: "97.0", LAUNCHED_AT_ENV: "100.0", RELAUNCHED_ENV: ""}
    assert phases(first, MARKS) == {
        "setup_s": 3.0,
        "launch_s": 0.5,
        "imports_s": 2.5,
        "rendezvous_s": 1.25,
        "resume_s": 0.5,
    }


def test_a_relaunch_has_no_set_up_of_its_own() -> None:
    # The life began long before (it trained, lost a node): its set-up is the first step's.
    relaunch = {ALLOCATED_AT_ENV: "10.0", LAUNCHED_AT_ENV: "100.0", RELAUNCHED_ENV: "1"}
    assert phases(relaunch, MARKS) == {"launch_s": 0.5, "imports_s": 2.5, "rendezvous_s": 1.25, "resume_s": 0.5}
