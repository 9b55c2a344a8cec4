"""A warm standby per node: a relaunched task starts training without importing torch again.

A relaunch onto a spare (a node lost, hpctrain.recovery.decide) starts a new srun step, and every task
of it used to start Python, import torch and the trainer (2 s and more of CPU here; tens of
seconds from a loaded shared filesystem at scale) before it could meet its peers. So a job with
spare nodes starts, once per life and after its first training step is launched, one standby per
node of the job (its training nodes and its spares):

    HPCTRAIN_STANDBY_ROLE=server srun --overlap --ntasks-per-node=1 ... python -m hpctrain.process.standby

Each imports what every training process imports (torch, torch._dynamo, the trainer), then waits
on a Unix socket in the abstract namespace named by HPCTRAIN_STANDBY (a token the batch shell
draws for the life) and the node's name. A relaunched task runs `python -m hpctrain.process.handoff
hpctrain.worker RUN_DIR` (standard library only, tens of milliseconds): it hands the standby its
standard streams, environment, working directory and CPU affinity, and the standby forks a
process that takes them on and runs the worker, already warm. The task stays the step's
process for Slurm: it passes on every signal srun gives it, and ends as the worker ended (its
exit code, or the signal that killed it). When the task itself is killed (Slurm ends the step,
the heartbeat watcher SIGKILLs it), the worker is SIGKILLed at once: it never trains on past
its step. Whatever goes wrong on the way (no standby yet, another user's socket, a standby
that cannot take the task on), the task starts the worker itself, cold, as before.

The worker runs under the standby's step (its cgroup, its memory accounting), not the relaunched
step's: Slurm's per-step figures (sacct MaxRSS) of a relaunched step show the task alone. Each
forked worker names itself `hpctrain-rN` (rank N) for ps and top, and for the node check before a
relaunch (hpctrain.run.rank_processes), which ends a worker of a step Slurm could not end.

The standby forks while it has only its main thread and before any CUDA call: that is what
makes fork safe with torch. The stop signals stay blocked in it (a preemption reaches every
step of the job: the standby must outlive it, as hpctrain.process.rank_server does) and in each fork
until the worker holds them (hpctrain.worker), so none is lost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpctrain.process.early_signals import HELD
from hpctrain.run import rank_processes
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir

STANDBY_ENV = "HPCTRAIN_STANDBY"  # the life's token: no token, no standby
ROLE_ENV = "HPCTRAIN_STANDBY_ROLE"  # "server" in the standby's own step
STREAMS = (0, 1, 2)
# A life whose first step never trains in this long gets no standby.
FIRST_START_WAIT_S = 3600.0
_HEADER = struct.Struct("!I")


def address(token: str, node: str) -> str:
    """The abstract socket of NODE's standby in the life TOKEN. A node's name is part of it:
    nodes may share a network namespace (the dev cluster's nodes are processes of one machine)."""
    return f"\0hpctrain-standby.{token}.{node}"


def node_name(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def send_message(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def receive_message(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None when the other end closed first) and the descriptors sent with it."""
    fds: list[int] = []
    if with_fds:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, with_fds)
    else:
        header = sock.recv(_HEADER.size)
    if not header:
        return None, fds
    header += _receive_exactly(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return json.loads(_receive_exactly(sock, size)), fds


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            raise ConnectionError("the other end closed mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# ---- the standby ----------------------------------------------------------------------------------


def serve(token: str, node: str) -> None:
    """Accept tasks for ever (Slurm ends this step with the job's life)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(address(token, node))
        server.listen(64)
        # Forked monitors are reaped by the kernel: this process never waits for them.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        print(f"hpctrain standby on {node}: ready", file=sys.stderr, flush=True)
        while True:
            conn, _ = server.accept()
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]  # pid, uid, gid
            if uid != os.getuid():  # another user's process: it gets nothing from this one
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                server.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    _monitor(conn)
                finally:
                    os._exit(0)
            conn.close()


def _monitor(conn: socket.socket) -> None:
    """One task's side in the standby: take on the task (streams, environment, directory, CPUs),
    fork its worker, tell the task the worker's pid, SIGKILL the worker when the task goes, and
    tell the task how the worker ended. A task it cannot take on is told to start cold."""
    # First a word: the task sends its streams only to a standby that answers (descriptors sent
    # to one that never reads would hold the task's pipes open, and Slurm waits for their end).
    send_message(conn, {"ready": True})
    task, fds = receive_message(conn, with_fds=len(STREAMS))
    if task is None:
        return
    try:
        _take_on(task, fds)
    except (OSError, KeyError, TypeError, ValueError) as error:
        send_message(conn, {"cold": f"{type(error).__name__}: {error}"})
        return
    monitor = os.getpid()
    worker = os.fork()
    if worker == 0:
        conn.close()
        _die_with_parent(monitor)
        os._exit(_run_worker(task))
    send_message(conn, {"pid": worker})
    status = _wait(worker, conn)
    ended = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)}
    try:
        send_message(conn, ended)
    except OSError:  # the task is gone
        pass


def _take_on(task: dict, fds: list[int]) -> None:
    """This process (and so the worker it forks) gets the task's streams, environment, working
    directory, umask and CPU affinity."""
    if len(fds) != len(STREAMS):
        raise ValueError(f"{len(fds)} descriptors sent, {len(STREAMS)} expected")
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, stream in zip(fds, STREAMS, strict=True):
        os.dup2(fd, stream)
        os.close(fd)
    os.chdir(task["cwd"])
    os.environ.clear()
    os.environ.update(task["env"])
    os.umask(task["umask"])
    os.sched_setaffinity(0, task["cpus"])


def _wait(worker: int, conn: socket.socket) -> int:
    """The worker's wait status; SIGKILL to it first if the task ends (Slurm killed the step).
    Polled, not a pidfd: kernels before 5.3 (RHEL 8's) have none."""
    import select

    while True:
        done, status = os.waitpid(worker, os.WNOHANG)
        if done == worker:
            return status
        ready, _, _ = select.select([conn], [], [], 0.05)
        if ready and _task_ended(conn):
            os.kill(worker, signal.SIGKILL)
            return os.waitpid(worker, 0)[1]


def _task_ended(conn: socket.socket) -> bool:
    """The task's socket is readable: the task sends nothing more, so that means it ended. A task
    killed before it read the worker's pid ends with that message unread, and the kernel then
    resets the connection (ECONNRESET) instead of closing it: an end as well, not an error that
    would take this monitor down and leave the worker training on without its step."""
    try:
        return not conn.recv(1)
    except OSError:
        return True


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker if its monitor ends first, however it ends (a bug, the OOM killer): the
    monitor is what kills the worker when its task goes, and a worker nobody watches would train
    on past its step. Linux's PR_SET_PDEATHSIG; elsewhere nothing (the monitor alone)."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the monitor was already gone before the prctl took hold
        os._exit(128 + signal.SIGKILL)


def _run_worker(task: dict) -> int:
    """In the forked worker: run the task's module as `python -m` would; its exit code."""
    _name_process(rank_processes.worker_name(task["env"].get("SLURM_PROCID", "")))
    from hpctrain.process import startup_clock

    startup_clock.mark("began", task["began"])  # the task's own start: launch_s stays Slurm's part
    import runpy

    sys.argv = [task["module"], *task["argv"]]
    code: object = 0
    try:
        runpy.run_module(task["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    except BaseException:  # as Python itself would: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr, flush=True)
    return 1


def _name_process(name: str) -> None:
    """The process's name (`comm`, 15 characters) as ps and top show it."""
    try:
        Path("/proc/self/comm").write_text(name[:15])
    except OSError:
        pass


def warm_up() -> None:
    """What every training process imports: each forked worker finds it done."""
    import torch._dynamo  # noqa: F401  (every optimizer imports it: a second of CPU per process)

    from hpctrain.process import life as train_process  # noqa: F401


def wait_for_training(run_dir: Path, timeout_s: float = FIRST_START_WAIT_S) -> bool:
    """Until this life's first step has journaled `start` (its tasks have imported and met): the
    standby's imports then take no CPU from theirs. False when none came in timeout_s."""
    life = LifeStamp.from_env()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = _records(RunDir(run_dir).events)
        starts = [(e.get("job_id"), e.get("restart")) for e in events if e.get("event") == "start"]
        if (life.job_id, life.restart) in starts:
            return True
        time.sleep(0.5)
    return False


def _records(path: Path) -> list[dict]:
    """The journal's `start` events (and any line that names "start"), parsed."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if '"start"' in line:  # only `start` events are wanted: the others are not parsed
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                continue
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m hpctrain.process.standby RUN_DIR (a step of the job, HPCTRAIN_STANDBY set)",
            file=sys.stderr,
        )
        return 2
    # Blocked, not ignored: a fork inherits the mask, and its worker lets them in once it holds
    # them (hpctrain.worker), so a stop sent to a task in its first moments is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, set(HELD))
    token = os.environ.get(STANDBY_ENV)
    if not token:
        print(f"hpctrain standby: {STANDBY_ENV} is not set: nothing to serve", file=sys.stderr)
        return 2
    if not wait_for_training(Path(argv[0])):
        print("hpctrain standby: the life's training never started: no standby", file=sys.stderr, flush=True)
        return 0
    began = time.monotonic()
    warm_up()
    print(f"hpctrain standby: imports done in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    serve(token, node_name(os.environ))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
