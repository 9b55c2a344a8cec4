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
        python -m hpctrain.recovery.keeper RUN_DIR WATCHER_ADDR BATCH_HOST BATCH_SHELL_PID

Once a second it asks the batch script's heartbeat watcher (hpctrain.recovery.watch, a process of
the batch step) for an answer over UDP. Once it has had a first answer (never before: a site that
blocks UDP between nodes leaves the keeper unarmed, and it says so after a minute), when none has
come for `slurm.silent_node_timeout_s`,
the control step's `batch_host_lost` looks at Slurm's record: a life still RUNNING (not ended,
not requeued) is requeued without the batch host (hpctrain.recovery.decide.decide_keeper: a
`failure` with by=keeper, detected_by=heartbeat, and a `requeue`), or cancelled when its
node_failure budget is spent. Before it acts, it looks twice: Slurm must answer about the job (a
look without an answer is tried again later, never taken as a verdict), and a one-task step on
the batch host asks whether the batch shell's own process still lives there (`kill -0` of its
pid, which the batch shell passes as BATCH_SHELL_PID): alive, it is the watcher that stalled
(a process starved, or stuck on a filesystem), and the keeper listens again, probing less and
less often. A lost host never runs the step (20 s at most). Never taken for a lost batch host
either: the keeper paused itself (a suspended job), or a life that Slurm has already ended or
requeued (the batch script finished, requeued, or the guardian will act).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpctrain.recovery.watch import TICK_S, paused
from hpctrain.run.heartbeats import BEAT_S, PING, PONG, parse_addr
from hpctrain.run.protocol import Keeper

# A keeper that has had no answer at all this long says so once (and stays unarmed).
UNARMED_NOTE_S = 60.0
# After a silence it did not act on (a stalled watcher, Slurm without an answer), the keeper
# listens again after a pause that doubles each time up to this: a watcher gone for good (its
# batch script alive) costs one probe step every few minutes, not one every timeout.
LONGEST_PAUSE_S = 300.0
# Once it acts, every this long without an end: its stacks, in its output.
ACT_STACKS_S = 30.0


@dataclass
class Ear:
    """What the keeper has heard from the watcher, as a decision over times (tested as a table).

    Armed only by a first answer: a keeper that never heard one (UDP blocked between the nodes, a
    firewall, a watcher that never started) cannot tell a lost batch host from a closed port, and a
    site that blocks UDP would otherwise have every job of 2 nodes or more cancel itself a few
    seconds in. Its own pause (a suspended job) restarts the count, as the watcher's does."""

    timeout_s: float
    tick: float  # when it last looked
    last: float | None = None  # the newest answer; None: none yet (unarmed)

    def answered(self, now: float) -> None:
        self.last = now

    def silent_for(self, now: float) -> float | None:
        """How long the watcher has not answered, once that passes the timeout; else None."""
        if self.last is not None and paused(self.tick, now, self.timeout_s):
            self.last = now
        self.tick = now
        if self.last is None or now - self.last <= self.timeout_s:
            return None
        return now - self.last


def listen_for_silence(
    addr: tuple[str, int], timeout_s: float, clock: Callable[[], float] = time.monotonic, armed: bool = False
) -> float:
    """Ask the watcher at ADDR once every BEAT_S; return how long it has not answered once that
    passes timeout_s, counted from its first answer (Ear), or from now when already `armed` (a
    watcher heard before and found stalled, not gone)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TICK_S)
        began = clock()
        ear = Ear(timeout_s, tick=began, last=began if armed else None)
        next_ask, noted = 0.0, False
        while True:
            now = clock()
            if now >= next_ask:
                with contextlib.suppress(OSError):  # no route for a moment: the silence counts on
                    sock.sendto(PING, addr)
                next_ask = now + BEAT_S
            with contextlib.suppress(TimeoutError, OSError):
                if sock.recv(64) == PONG:
                    ear.answered(clock())
            now = clock()
            silent_s = ear.silent_for(now)
            if silent_s is not None:
                return silent_s
            if ear.last is None and not noted and now - began > UNARMED_NOTE_S:
                noted = True
                print(
                    f"hpctrain keeper: no answer from the batch host's watcher at {addr[0]}:{addr[1]} in "
                    f"{now - began:.0f} s (UDP between the nodes blocked?): the batch host is not watched",
                    file=sys.stderr,
                    flush=True,
                )


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
    from hpctrain.config.slurm_file import slurm_settings
    from hpctrain.recovery.control import Controller
    from hpctrain.run import fencing
    from hpctrain.run.protocol import Exit

    timeout_s = float(slurm_settings(run_dir / "config.yaml").silent_node_timeout_s)
    armed, pause_s = False, timeout_s
    while True:
        silent_s = listen_for_silence(addr, timeout_s, armed=armed)
        print(
            f"hpctrain keeper: no answer from the batch host {host} for {silent_s:.0f} s "
            f"(slurm.silent_node_timeout_s={timeout_s:g})",
            file=sys.stderr,
            flush=True,
        )
        verdict = look_before_acting(host, call.batch_shell_pid)
        if verdict is not None:  # the batch script lives, or Slurm said nothing: listen again
            print(f"hpctrain keeper: {verdict}; not acted on, listening again", file=sys.stderr, flush=True)
            time.sleep(pause_s)  # a watcher gone for good is probed less and less often
            armed, pause_s = True, min(pause_s * 2, LONGEST_PAUSE_S)
            continue
        print(f"hpctrain keeper: acting on the silence of {host}", file=sys.stderr, flush=True)
        # An act that takes long (Slurm slow to answer while it gives up on the lost node) says
        # where it is, every ACT_STACKS_S: a keeper killed mid-act leaves that much behind.
        faulthandler.dump_traceback_later(ACT_STACKS_S, repeat=True, file=sys.stderr)
        try:
            fencing.check(run_dir)  # the run went on elsewhere meanwhile (a --retry, the guardian)
            return Controller(run_dir, dict(os.environ)).batch_host_lost(host, silent_s)
        except fencing.Fenced as fenced:
            fencing.say(fenced, "hpctrain keeper")
            return Exit.FENCED
        finally:
            faulthandler.cancel_dump_traceback_later()


def look_before_acting(host: str, batch_shell_pid: int | None, env: Mapping[str, str] | None = None) -> str | None:
    """Why the silence is not acted on (None: act). A silent watcher is not yet a lost batch host:
    Slurm must answer about the job (a look that got no answer is tried again later, not taken as
    a verdict), and the batch script's own process is asked after on its node by a one-task step
    (client.probe_process): alive there, it is the watcher that stalled (a process starved or
    stuck on a filesystem), and cancelling the job would end a healthy run."""
    from hpctrain.run.life import LifeStamp
    from hpctrain.slurm import client
    from hpctrain.slurm.client import Purpose

    life = LifeStamp.from_env(os.environ if env is None else env)
    if life.job_id is None:
        return None
    looked = client.show_job(life.job_id, Purpose.KEEPER_LOOK)
    if looked.value is None and not looked.answered:
        return f"Slurm gave no answer about job {life.job_id} ({looked.why()})"
    if batch_shell_pid is None or looked.value is None or looked.value.state != "RUNNING":
        return None  # nothing to probe, or the life moved on: batch_host_lost says so
    probed = client.probe_process(life.number or life.job_id, host, batch_shell_pid, Purpose.KEEPER_PROBE)
    if probed.ok:
        return f"the batch script (pid {batch_shell_pid}) still runs on {host}: its watcher stalled"
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
