"""Fault points (hpctrain.faults): armed by HPCTRAIN_FAULT_POINTS, inert and free without it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain import faults
from hpctrain.faults import Armed
from hpctrain.submit.outside_job import outside_job_env

PACKAGE = Path(faults.__file__).parent


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("checkpoint.between_renames=kill", {"checkpoint.between_renames": Armed("kill")}),
        ("checkpoint.between_renames=sleep:2.5", {"checkpoint.between_renames": Armed("sleep", 2.5)}),
        ("checkpoint.between_renames=exit:3@2", {"checkpoint.between_renames": Armed("exit", 3.0, 2)}),
        (" checkpoint.between_renames=stop , ", {"checkpoint.between_renames": Armed("stop")}),
        ("worker.before_imports=signal:USR2", {"worker.before_imports": Armed("signal", float(signal.SIGUSR2))}),
        ("trainer.step=kill@40/2", {"trainer.step": Armed("kill", 0.0, 40, 2)}),
        ("batch.before_begin=term/3", {"batch.before_begin": Armed("term", 0.0, 1, 3)}),
        ("worker.before_rendezvous=stop#1", {"worker.before_rendezvous": Armed("stop", rank=1)}),
        ("trainer.step=kill@40/2#3", {"trainer.step": Armed("kill", 0.0, 40, 2, 3)}),
    ],
)
def test_armed_points_are_read_from_their_words(text: str, expected: dict[str, Armed]) -> None:
    assert faults.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nowhere=kill", "a known point (batch.after_requeue, batch.before_begin, batch.before_launch"),
        ("checkpoint.between_renames", "not NAME=ACTION"),
        ("checkpoint.between_renames=explode", "the action is kill, stop, term"),
        ("checkpoint.between_renames=sleep", "the action is kill, stop, term"),
        ("checkpoint.between_renames=kill:3", "the action is kill, stop, term"),
        ("checkpoint.between_renames=sleep:soon", "are numbers"),
        ("checkpoint.between_renames=kill@x", "are numbers"),
        ("checkpoint.between_renames=kill/two", "@K, /L and #R are numbers"),
        ("batch.before_begin=term@2", "reaches its points once per life; name the life with /L"),
        ("checkpoint.between_renames=signal:NOPE", "'NOPE' is not a signal name"),
        ("checkpoint.between_renames=signal", "the action is kill, stop, term, signal:NAME"),
        ("batch.setup=term#1", "#R names a training process; the batch script has no rank"),
        ("control.after_step=kill#0", "#R names a training process"),
        ("trainer.step=kill#one", "#R are numbers"),
    ],
)
def test_a_wrong_arming_is_refused_naming_it(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        faults.parse(text)


def test_every_listed_point_is_in_the_code_and_every_point_in_the_code_is_listed() -> None:
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used.update(re.findall(r"faults\.point\(\"([a-z_.]+)\"\)", path.read_text()))
    template = (PACKAGE.parent / "sbatch_templates" / "ddp.sbatch.j2").read_text()
    used.update(re.findall(r"^\s*fault_point ([a-z_.]+)$", template, re.MULTILINE))
    assert used == set(faults.POINTS)


@pytest.mark.parametrize(
    ("arming", "restart", "fires"),
    [
        ("batch.before_begin=exit:9", "0", False),  # exit: the helper process, not the shell
        ("batch.before_begin=term", "0", True),
        ("batch.before_begin=term", "1", False),  # a requeued life runs the script again: not armed there
        ("batch.before_begin=term/2", "1", True),
        ("batch.before_begin=term/2", "0", False),
        ("", "0", False),
    ],
)
def test_a_batch_point_signals_the_shell_in_the_life_it_names(arming: str, restart: str, fires: bool) -> None:
    """`python -m hpctrain.faults NAME PID`, as the batch script runs it, on a stand-in shell."""
    shell = subprocess.Popen(["sleep", "60"])
    try:
        env = {"PATH": "/usr/bin:/bin", faults.ENV: arming, "SLURM_RESTART_COUNT": restart}
        command = [sys.executable, "-m", "hpctrain.faults", "batch.before_begin", str(shell.pid)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == (9 if "exit" in arming else 0), done.stderr
        try:
            ended = shell.wait(timeout=2 if fires else 0.5)
        except subprocess.TimeoutExpired:
            ended = None
        assert ended == (-signal.SIGTERM if fires else None)
    finally:
        shell.kill()


def _hit(point: str, arming: str, times: int = 1, restart: str | None = None) -> subprocess.CompletedProcess[str]:
    code = f"from hpctrain import faults\nfor _ in range({times}): faults.point({point!r})\nprint('after')"
    env = {"PATH": "/usr/bin:/bin", faults.ENV: arming}
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = restart
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("arming", "times", "returncode", "printed"),
    [
        ("", 1, 0, "after\n"),  # unarmed: nothing happens
        ("checkpoint.between_renames=kill", 1, -signal.SIGKILL, ""),
        ("checkpoint.between_renames=term", 1, -signal.SIGTERM, ""),
        ("checkpoint.between_renames=exit:7", 1, 7, ""),
        ("checkpoint.between_renames=signal:USR2", 1, -signal.SIGUSR2, ""),
        ("checkpoint.between_renames=kill@3", 2, 0, "after\n"),  # reached twice: not yet
        ("checkpoint.between_renames=kill@3", 3, -signal.SIGKILL, ""),
    ],
)
def test_an_armed_point_acts_in_its_process(arming: str, times: int, returncode: int, printed: str) -> None:
    done = _hit("checkpoint.between_renames", arming, times)
    assert (done.returncode, done.stdout) == (returncode, printed), done.stderr


@pytest.mark.parametrize(
    ("environ", "told", "rank"),
    [
        ({"SLURM_PROCID": "3"}, None, 3),  # a task of srun
        ({"RANK": "2"}, None, 2),  # torchrun's
        ({"SLURM_PROCID": "3"}, 5, 5),  # the process said where it is (the local launcher's ranks)
        ({}, None, None),  # not a training process: a point armed with #R never fires here
    ],
)
def test_the_rank_a_point_compares(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], told: int | None, rank: int | None
) -> None:
    monkeypatch.setattr(faults, "_rank", told)
    assert faults.rank_of(environ) == rank


def test_a_point_armed_for_one_rank_fires_in_that_rank_alone() -> None:
    for procid, returncode in (("0", 0), ("1", -signal.SIGKILL)):
        code = "from hpctrain import faults\nfaults.point('trainer.step')\nprint('after')"
        env = {"PATH": "/usr/bin:/bin", faults.ENV: "trainer.step=kill#1", "SLURM_PROCID": procid}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == returncode, (procid, done.stderr)


@pytest.mark.parametrize(
    ("arming", "restart", "fires"),
    [
        ("checkpoint.between_renames=kill", None, True),  # outside Slurm: the first life
        ("checkpoint.between_renames=kill", "0", True),
        ("checkpoint.between_renames=kill", "1", False),  # a requeued life is not armed again
        ("checkpoint.between_renames=kill/2", "1", True),
        ("checkpoint.between_renames=kill/2", "2", False),
    ],
)
def test_a_point_fires_in_the_life_of_the_job_it_names(arming: str, restart: str | None, fires: bool) -> None:
    done = _hit("checkpoint.between_renames", arming, restart=restart)
    assert (done.returncode, done.stdout) == ((-signal.SIGKILL, "") if fires else (0, "after\n")), done.stderr


def test_a_job_submitted_again_from_inside_a_job_carries_no_armed_point() -> None:
    inside = {"PATH": "/usr/bin", "SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", faults.ENV: "trainer.step=kill"}
    assert outside_job_env(inside) == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf"}


def test_a_wrong_arming_stops_the_process_at_import_saying_why() -> None:
    done = _hit("checkpoint.between_renames", "checkpoint.between_rename=kill")
    assert done.returncode == 1 and "HPCTRAIN_FAULT_POINTS" in done.stderr and "after" not in done.stdout


def test_stop_leaves_the_process_alive_and_silent() -> None:
    code = "from hpctrain import faults\nfaults.point('checkpoint.between_renames')\nprint('after', flush=True)"
    env = {"PATH": "/usr/bin:/bin", faults.ENV: "checkpoint.between_renames=stop"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _state(proc.pid) != "T":
            time.sleep(0.05)
        assert _state(proc.pid) == "T"  # stopped, not exited
        proc.send_signal(signal.SIGCONT)
        assert proc.communicate(timeout=30)[0] == "after\n"
    finally:
        proc.kill()


# A writer thread reaches the point while the main thread computes, all on one CPU: the main
# thread is not running when the signal is sent, so a process-directed SIGSTOP would wait for it
# and the writer would go on (19 of 30 on a loaded machine, 20 of 20 pinned to one CPU).
_THREAD_HITS_POINT = """
import os, sys, threading, time
os.sched_setaffinity(0, {0})
from hpctrain import faults
def writer():
    time.sleep(0.1)  # the main thread computing by then, not waiting in Thread.start
    faults.point('checkpoint.between_renames')
    open(sys.argv[1], 'w').write('written after the point')
threading.Thread(target=writer).start()
while True:
    pass
"""


@pytest.mark.parametrize("action", ["stop", "kill"])
def test_a_thread_that_reaches_a_stop_or_kill_goes_no_further(action: str, tmp_path: Path) -> None:
    after = tmp_path / "after"
    env = {"PATH": "/usr/bin:/bin", faults.ENV: f"checkpoint.between_renames={action}"}
    proc = subprocess.Popen([sys.executable, "-c", _THREAD_HITS_POINT, str(after)], env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and _state(proc.pid) != "T":
            time.sleep(0.05)
        time.sleep(0.3)  # the writer's chance to go on, had the signal not stopped it
        assert (proc.poll() == -signal.SIGKILL) if action == "kill" else (_state(proc.pid) == "T")
        assert not after.exists(), f"the thread went on after `{action}`"
    finally:
        proc.kill()
        proc.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_unarmed_point_costs_a_lookup() -> None:
    started = time.perf_counter()
    for _ in range(100_000):
        faults.point("checkpoint.between_renames")
    assert (time.perf_counter() - started) / 100_000 < 5e-6  # well under a microsecond here


def test_a_gate_holds_its_process_exactly_there_until_the_test_opens_it(tmp_path: Path) -> None:
    """gate:S: the test acts while the process is held at the point, however slow the machine."""
    code = "from hpctrain import faults\nfaults.point('batch.before_requeue')\nprint('after', flush=True)"
    env = {"PATH": "/usr/bin:/bin", faults.ENV: "batch.before_requeue=gate:60", faults.GATES_ENV: str(tmp_path)}
    held = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    reached, opened = faults.gate_files(tmp_path, "batch.before_requeue")
    try:
        deadline = time.monotonic() + 30
        while not reached.exists():
            assert time.monotonic() < deadline and held.poll() is None, "the gate was never reached"
            time.sleep(0.02)
        assert reached.read_text() == f"{held.pid}\n"
        time.sleep(0.3)
        assert held.poll() is None  # still held
        opened.touch()
        output, _ = held.communicate(timeout=30)
        assert (held.returncode, output) == (0, "after\n")
    finally:
        held.kill()


def test_a_gate_is_armed_only_with_its_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(faults.GATES_ENV, raising=False)
    with pytest.raises(ValueError, match=f"a gate needs {faults.GATES_ENV}"):
        faults.parse("batch.setup=gate:30")
    monkeypatch.setenv(faults.GATES_ENV, str(tmp_path))
    assert faults.parse("batch.setup=gate:30") == {"batch.setup": Armed("gate", 30.0)}
