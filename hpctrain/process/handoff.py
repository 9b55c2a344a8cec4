"""A relaunched task handed to its node's warm standby: `python -m hpctrain.process.handoff MODULE ARGS...`.

Runs MODULE (hpctrain.worker) as `python -m MODULE ARGS...` would, in a process the node's
standby (hpctrain.process.standby) forks with torch and the trainer already imported. This process stays
the step's task for Slurm: it gives the standby its standard streams, environment, working
directory and CPU affinity, passes on every signal srun gives it, and ends as the worker ended.
With no standby to hand to (none started, not ready yet, refused), it becomes the worker itself:
`exec python -m MODULE ARGS...`, same pid, as if it had been started so.

Standard library only, and little of it: every millisecond here is a millisecond of the relaunch.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from hpctrain.process import standby
from hpctrain.process.early_signals import HELD

# How long a standby may take to answer before the task starts cold: it answers in a moment
# unless it is still importing (a relaunch right after the life began) or gone.
CONNECT_TIMEOUT_S = 2.0
# What srun may pass on to a task; SIGKILL and SIGSTOP cannot be caught: a task SIGKILLed takes
# its worker with it (the standby sees it go), a SIGSTOPped one stops alone.
FORWARDED = (*HELD, signal.SIGCONT, signal.SIGQUIT)


def cold(module: str, args: list[str]) -> None:
    """Become `python -m MODULE ARGS` (never returns). The stop signals go blocked across the
    exec and stay pending: the worker lets them in once it holds them (hpctrain.worker)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(HELD))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def hand_over(module: str, args: list[str], env: dict[str, str]) -> tuple[str, int] | None:
    """How the worker ended in the standby, ("exit", code) or ("signal", N), or None when no
    standby could take the task (start cold)."""
    began = time.time()
    token = env.get(standby.STANDBY_ENV)
    if not token:
        return None
    pending: list[int] = []
    worker: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if worker:
            os.kill(worker[0], signum)
        else:
            pending.append(signum)

    # Held from the start: a stop that comes while the worker forks is passed on once it exists.
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(standby.address(token, standby.node_name(env)))
        hello, _ = standby.receive_message(sock)
        if not hello or not hello.get("ready"):
            raise ConnectionError("the standby did not say it was ready")
        task = {
            "module": module,
            "argv": args,
            "env": env,
            "cwd": os.getcwd(),
            "umask": _umask(),
            "cpus": sorted(os.sched_getaffinity(0)),
            "began": began,
        }
        standby.send_message(sock, task, standby.STREAMS)
        answer, _ = standby.receive_message(sock)
        if answer is None or "pid" not in answer:
            reason = answer["cold"] if answer else "it closed before forking"
            raise ConnectionError(f"the standby cannot take the task: {reason}")
        sock.settimeout(None)
    except OSError as error:
        if not isinstance(error, (FileNotFoundError, ConnectionRefusedError)):  # no standby: no news
            print(f"hpctrain handoff: starting cold ({error})", file=sys.stderr, flush=True)
        sock.close()
        # Blocked before the handlers go, they stay pending across the exec (cold()).
        signal.pthread_sigmask(signal.SIG_BLOCK, set(HELD))
        for held, handler in previous.items():
            signal.signal(held, handler)
        for early in pending:
            os.kill(os.getpid(), early)
        return None
    worker.append(int(answer["pid"]))
    for early in pending:
        os.kill(worker[0], early)
    pending.clear()
    while True:
        try:
            ended, _ = standby.receive_message(sock)
            break
        except InterruptedError:
            continue
    sock.close()
    if ended is None:  # the standby itself died: the worker's end is unknown
        print("hpctrain handoff: the standby ended before its worker", file=sys.stderr, flush=True)
        return ("exit", 1)
    if "signal" in ended:
        return ("signal", int(ended["signal"]))
    return ("exit", int(ended["exit"]))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: python -m hpctrain.process.handoff MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    module, args = argv[0], argv[1:]
    ended = hand_over(module, args, dict(os.environ))
    if ended is None:
        cold(module, args)
        return
    how, value = ended
    if how == "signal":  # killed by a signal: so is this task, for srun to say so
        if value not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(value, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {value})
        os.kill(os.getpid(), value)
        value = 128 + value  # a signal that does not kill (ignored where it was sent)
    sys.exit(value)


if __name__ == "__main__":
    main(sys.argv[1:])
