"""The batch host's keeper: a job whose batch script is gone is requeued, not left running.

Under --no-kill, when the node running the batch script is lost, Slurm removes it from the job
and kills the batch step (REQUEST_TERMINATE_TASKS to that node). The job ends only when that
node's slurmd reports the batch script's end. A node that died silently never reports it (and
neither does a downed node whose slurmd registers again before the kill arrives: slurmctld then
aborts the script "on wrong node" without ending the job). Measured on Slurm 22.05: the job stays
RUNNING on the other nodes, with no batch script and no step, until its time limit; the run's
guardian (`--dependency=afternotok`) waits all that time.

So a job of more than one node runs a keeper, a one-task step on another node than the batch
host, started by the batch shell with the first launch (and again when its node was lost):

    srun --overlap --nodes=1 --ntasks=1 --exclude=BATCH_HOST,... \\
        python -m hpctrain.recovery.keeper RUN_DIR WATCHER_ADDR BATCH_HOST

Once a second it asks the batch script's heartbeat watcher (hpctrain.recovery.watch, a process of
the batch step) for an answer over UDP. When none has come for `slurm.silent_node_timeout_s`,
the control step's `batch_host_lost` looks at Slurm's record: a life still RUNNING (not ended,
not requeued) is requeued without the batch host (hpctrain.recovery.decide.decide_keeper: a
`failure` with by=keeper, detected_by=heartbeat, and a `requeue`), or cancelled when its
node_failure budget is spent. Never taken for a lost batch host: a watcher merely slow (its own
process answers, whatever the training does), the keeper paused itself (a suspended job), or a
life that Slurm has already ended or requeued (the batch script finished, requeued, or the
guardian will act).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time

from hpctrain.recovery.watch import TICK_S, paused
from hpctrain.run.heartbeats import BEAT_S, PING, PONG, parse_addr
from hpctrain.run.protocol import Keeper


def listen_for_silence(addr: tuple[str, int], timeout_s: float, clock=time.monotonic) -> float:
    """Ask the watcher at ADDR once every BEAT_S; return how long it has not answered once that
    passes timeout_s. A pause of this process itself (the job suspended) restarts the count."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TICK_S)
        last = tick = clock()
        next_ask = 0.0
        while True:
            now = clock()
            if now >= next_ask:
                with contextlib.suppress(OSError):  # no route for a moment: the silence counts on
                    sock.sendto(PING, addr)
                next_ask = now + BEAT_S
            with contextlib.suppress(TimeoutError, OSError):
                if sock.recv(64) == PONG:
                    last = clock()
            now = clock()
            if paused(tick, now, timeout_s):
                last = now
            tick = now
            if now - last > timeout_s:
                return now - last


def main(argv: list[str]) -> int:
    call = Keeper.parse(argv)  # the batch shell's call (hpctrain.run.protocol)
    if call is None:
        print(Keeper.USAGE, file=sys.stderr)
        return 2
    run_dir, addr, host = call.run_dir, parse_addr(call.watcher), call.batch_host
    # Slurm's stop signals reach every step: the keeper keeps watching while a stop is saved
    # (a preemption's grace is when a batch host is most often lost); Slurm SIGKILLs it at the end.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    from hpctrain.recovery.control import Controller, slurm_settings

    timeout_s = float(slurm_settings(run_dir / "config.yaml").silent_node_timeout_s)
    silent_s = listen_for_silence(addr, timeout_s)
    print(
        f"hpctrain keeper: no answer from the batch host {host} for {silent_s:.0f} s "
        f"(slurm.silent_node_timeout_s={timeout_s:g})",
        file=sys.stderr,
        flush=True,
    )
    return Controller(run_dir, dict(os.environ)).batch_host_lost(host, silent_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
