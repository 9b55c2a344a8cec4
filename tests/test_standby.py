"""The warm standby and the handoff of a task to it (hpctrain.process.standby, hpctrain.process.handoff), with
real processes, a real abstract socket, real signals: the worker gets the task's streams,
environment, directory, affinity and signals; the task ends as the worker did; a task killed
takes its worker with it; no standby (or another user) means a cold start in the same pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.process import standby

TESTS = Path(__file__).resolve().parent
READY_TIMEOUT_S = 120  # the standby imports torch: seconds, more on a loaded machine


def _env(token: str, node: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {
        **env,
        standby.STANDBY_ENV: token,
        "SLURMD_NODENAME": node,
        "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        **extra,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    token, node = uuid.uuid4().hex[:12], "probe-node"
    run_dir = tmp_path_factory.mktemp("run")
    # The standby imports only once its life trains: this life (no Slurm job) has begun to.
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "start", "job_id": None, "restart": 0}) + "\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.process.standby", str(run_dir)],
        env=_env(token, node),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert process.stderr is not None
        for line in process.stderr:
            if "ready" in line:
                break
            assert time.monotonic() < deadline, "the standby was not ready in time"
        else:
            pytest.fail(f"the standby ended: {process.wait()}")
        yield token, node
    finally:
        process.kill()
        process.wait()


def handoff(token: str, node: str, *args: str, cwd: Path | None = None, **env: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "hpctrain.process.handoff", "helpers.handoff_probe", *args]
    return subprocess.Popen(
        command, env=_env(token, node, **env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def report_of(task: subprocess.Popen) -> dict:
    assert task.stdout is not None
    line = task.stdout.readline()
    assert line, task.stderr.read() if task.stderr else ""
    return json.loads(line)


def started_at(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None if gone:
    with it, a pid the kernel handed to a new process is not taken for the old one (pid_max is
    32768 here, and the suite starts tens of thousands of processes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def gone(pid: int, within_s: float, started: str | None = None) -> bool:
    """The process `pid` (started at `started`, if given) ended or is a zombie within_s."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z"):
                return True
        except OSError:
            return True
        if started is not None and started_at(pid) != started:
            return True  # the pid now belongs to another process
        time.sleep(0.02)
    return False


def test_a_task_handed_over_runs_warm_with_its_own_streams_environment_directory_and_cpus(server, tmp_path) -> None:
    token, node = server
    cpu = sorted(os.sched_getaffinity(0))[-1]
    command = ["taskset", "-c", str(cpu), sys.executable, "-m", "hpctrain.process.handoff", "helpers.handoff_probe"]
    task = subprocess.run(
        [*command, "exit", "3"],
        env=_env(token, node, SLURM_PROCID="5", HPCTRAIN_PROBE="a value"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert task.returncode == 3, task.stderr
    report = json.loads(task.stdout.splitlines()[0])
    assert report["torch_imported"], "the worker imported nothing itself: the standby's imports"
    assert report["cwd"] == str(tmp_path)
    assert report["env"]["HPCTRAIN_PROBE"] == "a value" and report["env"]["SLURM_PROCID"] == "5"
    assert report["cpus"] == [cpu]
    assert report["argv"] == ["exit", "3"]
    assert report["comm"] == "hpctrain-r5"
    assert "probe on stderr" in task.stderr


def test_a_signal_to_the_task_reaches_the_worker_and_its_exit_code_comes_back(server) -> None:
    task = handoff(*server, "wait")
    worker = report_of(task)["pid"]
    assert worker != task.pid
    task.send_signal(signal.SIGTERM)
    out, _ = task.communicate(timeout=30)
    assert task.returncode == 75 and "probe got SIGTERM" in out


def test_a_task_killed_takes_its_worker_with_it(server) -> None:
    task = handoff(*server, "sleep")
    worker = report_of(task)["pid"]
    started = started_at(worker)
    task.kill()  # as Slurm ends a step, or the heartbeat watcher kills it
    task.wait()
    # The monitor sees the task's end within 50 ms of being scheduled; on a loaded machine (the
    # suite beside it) that can take seconds. What counts is that the worker goes, not the delay.
    assert gone(worker, 15.0, started), f"worker {worker} outlived its task"


def test_a_task_killed_before_it_read_its_workers_pid_still_takes_the_worker_with_it(server, tmp_path) -> None:
    """Slurm can end a step the moment its task handed itself over: the standby's message with the
    worker's pid is then still unread, and the kernel resets the connection instead of closing it.
    A task of our own here, on the standby's socket, that never reads that message."""
    token, node = server
    report_r, report_w = os.pipe()
    with open(os.devnull, "rb") as stdin, open(tmp_path / "stderr", "wb") as stderr:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(standby.address(token, node))
            hello, _ = standby.receive_message(sock)
            assert hello == {"ready": True}
            task = {
                "module": "helpers.handoff_probe",
                "argv": ["sleep"],
                "env": _env(token, node),
                "cwd": str(tmp_path),
                "umask": 0o022,
                "cpus": sorted(os.sched_getaffinity(0)),
                "began": time.time(),
            }
            standby.send_message(sock, task, (stdin.fileno(), report_w, stderr.fileno()))
            os.close(report_w)
            with os.fdopen(report_r) as reports:
                worker = json.loads(reports.readline())["pid"]  # the worker runs: the pid message is sent
            started = started_at(worker)
            deadline = time.monotonic() + 30
            while not _unread(sock):
                assert time.monotonic() < deadline, "the standby never sent the worker's pid"
                time.sleep(0.01)
        # closed with the pid message unread, as a task SIGKILLed at that moment
    assert gone(worker, 15.0, started), f"worker {worker} outlived its task"


def test_a_worker_whose_monitor_dies_dies_with_it(server) -> None:
    """The monitor is what kills the worker when its task goes: if the monitor itself is killed
    (the OOM killer, a bug), the worker goes too (its parent-death signal), never left training."""
    task = handoff(*server, "sleep")
    worker = report_of(task)["pid"]
    started = started_at(worker)
    monitor = int(Path(f"/proc/{worker}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    os.kill(monitor, signal.SIGKILL)
    assert gone(worker, 15.0, started), f"worker {worker} outlived its monitor {monitor}"
    _, err = task.communicate(timeout=30)
    assert task.returncode == 1 and "the standby ended before its worker" in err


def _unread(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive queue (FIONREAD)."""
    import fcntl
    import struct
    import termios

    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def test_a_worker_killed_by_a_signal_ends_its_task_by_the_same_signal(server) -> None:
    task = handoff(*server, "sleep")
    os.kill(report_of(task)["pid"], signal.SIGKILL)  # the OOM killer, say
    _, err = task.communicate(timeout=30)
    assert task.returncode == -signal.SIGKILL, err


def test_without_a_standby_the_task_becomes_the_worker_itself_cold() -> None:
    task = handoff("no-such-life", "probe-node", "exit", "4")
    report = report_of(task)
    assert task.wait(timeout=120) == 4
    assert report["pid"] == task.pid, "the cold worker is the task itself (exec)"
    assert not report["torch_imported"]


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for signum (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_stop_that_comes_while_the_task_waits_for_a_standby_reaches_the_cold_worker() -> None:
    """A standby that never answers (still importing, stuck): the task waits its time, then
    starts cold; a SIGTERM that came meanwhile is held across the exec, not fatal and not lost."""
    token, node = uuid.uuid4().hex[:12], "mute-node"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(standby.address(token, node))
        mute.listen(1)  # connections wait in the backlog: never accepted, never answered
        task = handoff(token, node, "wait")
        deadline = time.monotonic() + 60
        while not catches(task.pid, signal.SIGTERM):
            assert time.monotonic() < deadline and task.poll() is None, "the task never held SIGTERM"
            time.sleep(0.01)
        task.send_signal(signal.SIGTERM)
        out, err = task.communicate(timeout=120)  # its streams were never sent: they end with it
    assert task.returncode == 75, (out, err)
    assert json.loads(out.splitlines()[0])["pid"] == task.pid and "probe got SIGTERM" in out


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_users_process_gets_nothing_from_the_standby(server) -> None:
    token, node = server
    child = os.fork()
    if child == 0:  # as nobody: connect, send a task, read the answer
        try:
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(standby.address(token, node))
                standby.send_message(sock, {"module": "x", "argv": [], "env": {}}, standby.STREAMS)
                answer, _ = standby.receive_message(sock)
            os._exit(0 if answer is None else 1)
        except ConnectionError:
            os._exit(0)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the standby answered another user"
