"""The programs a run dir names to be told when its run has ended (hpctrain/run/listeners.py): each
gets the run dir and the action; one that hangs, fails or cannot be found, and a listeners.json
that cannot be read, are said on stderr and never break the job's own ending. The control step
and the guardian both tell them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpctrain.recovery.control import Controller
from hpctrain.recovery.guardian import Guardian
from hpctrain.run.listeners import Listener, read_listeners, tell_listeners, write_listeners
from hpctrain.run.paths import RunDir

# Listener modules written into a folder on PYTHONPATH (the listeners inherit the environment).
MODULES = {
    "told_listener": (
        "import sys\n"
        "from pathlib import Path\n"
        "run_dir, action = sys.argv[1:]\n"
        "with open(Path(run_dir) / 'told.txt', 'a') as file:\n"
        "    file.write(f'{action}\\n')\n"
        "print(f'told {action} on stdout')\n"
    ),
    "hanging_listener": "import time\ntime.sleep(600)\n",
    "failing_listener": "raise RuntimeError('the study is gone')\n",
}


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunDir:
    modules = tmp_path / "modules"
    modules.mkdir()
    for name, text in MODULES.items():
        (modules / f"{name}.py").write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")])))
    root = tmp_path / "run"
    root.mkdir()
    (root / "config.yaml").write_text("slurm:\n  nodes: 1\n")
    return RunDir(root)


def told(run: RunDir) -> list[str]:
    path = run.root / "told.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_listener_gets_the_run_dir_and_the_action_its_stdout_on_stderr(
    run: RunDir, capfd: pytest.CaptureFixture[str]
) -> None:
    write_listeners(run, [Listener("told_listener", 60)])
    assert read_listeners(run) == [Listener("told_listener", 60)]
    tell_listeners(run, "finish")
    assert told(run) == ["finish"]
    out, err = capfd.readouterr()
    assert out == ""  # the control step's stdout is the action line the batch shell reads
    assert "told finish on stdout" in err


def test_a_listener_that_hangs_fails_or_is_missing_does_not_break_the_ending(
    run: RunDir, capfd: pytest.CaptureFixture[str]
) -> None:
    write_listeners(
        run,
        [
            Listener("hanging_listener", 1),
            Listener("failing_listener", 60),
            Listener("no_such_listener_module", 60),
            Listener("told_listener", 60),
        ],
    )
    started = time.monotonic()
    tell_listeners(run, "fail")
    assert time.monotonic() - started < 30  # the hanging one was killed at its timeout_s
    assert told(run) == ["fail"]  # the ones after them were told all the same
    err = capfd.readouterr().err
    assert "listener hanging_listener did not end within 1 s: killed" in err
    assert "the study is gone" in err and "listener failing_listener exited 1" in err
    assert "listener no_such_listener_module exited 1" in err


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"module": "told_listener", "timeout_s": 60}',  # not a list
        '[{"module": "told_listener"}]',  # no timeout_s
        '[{"module": "told_listener", "timeout_s": 60, "shell": true}]',  # an unknown field
        '[{"module": "-c", "timeout_s": 60}]',  # not a module name
        '[{"module": "told_listener", "timeout_s": 0}]',
        '[{"module": "told_listener", "timeout_s": "60"}]',
    ],
)
def test_a_listeners_file_that_cannot_be_read_is_said_and_nothing_runs(
    run: RunDir, capfd: pytest.CaptureFixture[str], text: str
) -> None:
    run.listeners.write_text(text)
    tell_listeners(run, "finish")
    assert told(run) == []
    assert f"the run's listeners ({run.listeners}) cannot be read" in capfd.readouterr().err


def test_a_run_without_listeners_tells_nobody_and_says_nothing(run: RunDir, capfd: pytest.CaptureFixture[str]) -> None:
    tell_listeners(run, "finish")
    assert capfd.readouterr() == ("", "")


def test_the_control_step_and_the_guardian_tell_the_listeners_when_the_run_ends(run: RunDir) -> None:
    run.listeners.write_text(json.dumps([{"module": "told_listener", "timeout_s": 60}]))
    Controller(run.root, env={"SLURM_JOB_ID": "1"})._run_ended("finish")
    Guardian(run.root, "1")._run_ended("fail")
    assert told(run) == ["finish", "fail"]
