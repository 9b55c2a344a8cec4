"""The batch script's heartbeat watcher: a node that falls silent ends the training step in seconds.

The batch shell starts one watcher per life of the job, before `control begin`:

    python -m hpctrain.recovery.watch RUN_DIR FOLDER

It listens for the training processes' beats (hpctrain.run.heartbeats) on a UDP port of this node, and
writes `FOLDER/addr` ("host:port", the host as rank 0 would publish it, slurm.network) for the
shell to pass on in HPCTRAIN_HEARTBEAT_ADDR; the shell writes each srun's pid to `FOLDER/srun.pid`.
Each training step (the first, each relaunch) is heard on its own: beats carry SLURM_STEP_ID.
When every process of a node has been silent for `slurm.silent_node_timeout_s` while others beat
on, it records a `silent` event (the nodes, their ranks, how long), asks Slurm to kill the step
(`scancel --signal=KILL JOB.STEP`, in the background: slurmctld cannot reach the silent node and
the call would wait on it) and SIGKILLs srun, whose wait on that node would otherwise last until
Slurm marks it DOWN (SlurmdTimeout, 300 s by default). The control step's after-step then counts
the silent nodes as failed (`failure` with `detected_by: heartbeat`) and relaunches on a spare or
requeues without them; the relaunch is `srun --overlap`, since Slurm still holds the old step's
resources on the silent node's peers until it hears from that node.

What is never taken for a silent node: a rank that ended (it says `bye`, and so does its beater),
anything once the step's srun has returned, every rank silent at once (the step ending: Slurm
killed it, or this node is cut off itself), a training process that is merely slow or
SIGSTOPped (its beater beats on), and this watcher paused itself (a suspended job: the gap is its
own, so every rank is heard afresh).

With spare nodes it also watches for a training node an administrator drains
(hpctrain.recovery.drain_watch), and leaves it for a spare at the next step boundary.

It also answers the batch host's keeper (hpctrain.recovery.keeper), a step on another node that asks
once a second whether this node and its batch script are still there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hpctrain import faults
from hpctrain.config.slurm_file import slurm_settings, straggler_action
from hpctrain.recovery.drain_watch import DrainWatch
from hpctrain.recovery.hearing import StepHearing
from hpctrain.run import hang_reports
from hpctrain.run.events import Journal, Silent
from hpctrain.run.heartbeats import BEAT_S, PING, PONG, Beat, StacksAsked
from hpctrain.run.life import LifeStamp
from hpctrain.run.node_address import rank0_address
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose

# How long one wait for a datagram lasts: the watcher judges at least this often.
TICK_S = 0.25
# Beats are read in a batch (as many as wait, for at most a tick), then the step is judged once:
# the work of a beat is constant, that of a judgement proportional to the nodes (recovery/hearing.py).
# The socket's buffer holds a few seconds of beats of a large job (the kernel may cap it lower,
# net.core.rmem_max): a burst while the watcher is descheduled is read late, not dropped.
RECEIVE_BUFFER_BYTES = 8 << 20
ADDR_FILE, SRUN_PID_FILE = "addr", "srun.pid"
# The scancel's head start before srun is killed: the request leaves before the shell moves on.
SCANCEL_LEAD_S = 0.5
# How long the live ranks get to give their stacks before a silent node's step is ended: their
# beaters wait a second for the dump, then write it.
STACKS_WAIT_S = 2.5


def paused(previous_tick: float, now: float, timeout_s: float) -> bool:
    """The watcher itself did not run for half the timeout (the job suspended, the node
    overloaded): the silence it would see is its own."""
    return now - previous_tick > max(timeout_s / 2, 3 * BEAT_S)


class Watcher:
    def __init__(self, run_dir: Path, folder: Path, env: Mapping[str, str]) -> None:
        self.run_dir, self.folder, self.env = run_dir, folder, dict(env)
        settings = slurm_settings(run_dir / "config.yaml")
        self.timeout_s = float(settings.silent_node_timeout_s)
        self.network = settings.network
        self.journal = Journal(run_dir / "events.jsonl")
        life = LifeStamp.from_env(self.env)
        self.job_id, self.restart = life.job_id or "", life.restart
        self.heard = StepHearing()  # the current step's ranks
        self.step = ""  # the current step's SLURM_STEP_ID (each relaunch is a new step)
        # The srun running when the current step was first heard: a relaunch's srun replaces it
        # before the relaunched ranks' first beats (seconds under load), and the old step's
        # silence must not end the new step.
        self.step_srun: int | None = None
        self.ended: set[str] = set()  # steps this watcher ended
        self.senders: dict[int, tuple[str, int]] = {}  # the current step's ranks: where their beats come from
        self.sock: socket.socket | None = None
        self.life = life
        # With spares: a training node an administrator drains is left for one (drain_watch), and
        # with trainer.straggler_action=relaunch one whose rank is named slow (straggler_move).
        poll_s = float(settings.drain_poll_s) if settings.spare_nodes > 0 else 0.0
        leave = straggler_action(run_dir / "config.yaml") == "relaunch"
        self.drains = DrainWatch(self.journal, self.job_id, self.restart, poll_s, self._running_step, self.env, leave)

    def _running_step(self) -> tuple[str, list[str]] | None:
        """The step now training and its nodes (for the drain watch's thread)."""
        step, heard = self.step, self.heard
        if not step or self._step_srun() is None or step in self.ended:
            return None
        return step, heard.nodes()

    def listen(self) -> socket.socket:
        """The UDP socket, and FOLDER/addr naming it (written whole: the shell may read it at once)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        sock.bind(("0.0.0.0", 0))
        node = self.env.get("SLURMD_NODENAME", "")
        host = rank0_address(node, self.network.master_addr_suffix, self.network.master_addr_ifname)
        tmp = self.folder / f"{ADDR_FILE}.tmp"
        tmp.write_text(f"{host}:{sock.getsockname()[1]}\n")
        tmp.replace(self.folder / ADDR_FILE)
        return sock

    def run(self) -> int:
        shell = os.getppid()
        sock = self.sock = self.listen()
        self.drains.start()
        tick = time.monotonic()
        while os.getppid() == shell:  # the batch shell gone: nothing left to watch for
            self._receive(sock, until=time.monotonic() + TICK_S)
            now = time.monotonic()
            if paused(tick, now, self.timeout_s):
                self.heard.afresh(now)
            tick = now
            # Only while the step's srun runs: once it has returned (the shell removes its pid file),
            # ranks that left without a word are the step's end, not a dead node.
            running = self.timeout_s > 0 and len(self.heard) > 0 and self._step_srun() is not None
            silent = self.heard.silent(now, self.timeout_s) if running else {}
            if silent:
                self._end_step(silent, now)
                # This step is over: its beats are ignored from now on; the next step's are heard.
                self.ended.add(self.step)
                self.heard, self.step = StepHearing(), ""
        return 0

    def _receive(self, sock: socket.socket, until: float) -> None:
        """Every datagram that arrives before `until`: the first waited for, the rest read while
        they wait in the socket (a keeper's ping answered as it comes)."""
        sock.settimeout(max(until - time.monotonic(), 0.001))
        try:
            data, sender = sock.recvfrom(4096)
        except TimeoutError:
            return
        sock.setblocking(False)
        while True:
            self._take(sock, data, sender)
            if time.monotonic() >= until:
                return
            try:
                data, sender = sock.recvfrom(4096)
            except BlockingIOError:
                return

    def _take(self, sock: socket.socket, data: bytes, sender: tuple[str, int]) -> None:
        if data == PING:
            with contextlib.suppress(OSError):
                sock.sendto(PONG, sender)
            return
        beat = Beat.decode(data)
        if beat is None or beat.step in self.ended:
            return
        if beat.step != self.step:
            if self.step and _older(beat.step, self.step):
                return  # a late beat of the step before
            self.heard, self.step = StepHearing(), beat.step  # a new step (a relaunch): its ranks only
            self.step_srun = self._srun()
            self.senders = {}
        self.heard.hear(beat.rank, beat.node, time.monotonic(), bye=beat.bye)
        self.senders[beat.rank] = sender

    def _end_step(self, silent: dict[str, list[int]], now: float) -> None:
        longest = max(now - self.heard.ranks[rank].last for ranks in silent.values() for rank in ranks)
        nodes = sorted(silent)
        report = self._ask_stacks(silent, f"{','.join(nodes)} silent for {longest:.0f} s")
        self.journal.write_event(
            Silent(
                job_id=self.job_id,
                restart=self.restart,
                nodes=nodes,
                ranks=sorted(rank for ranks in silent.values() for rank in ranks),
                silent_s=round(longest, 1),
                timeout_s=self.timeout_s,
                step_id=self.step or None,
                report=report,
            )
        )
        print(
            f"hpctrain: no heartbeat from {','.join(nodes)} for {longest:.0f} s "
            f"(slurm.silent_node_timeout_s={self.timeout_s:g}): ending the step"
            + (f"; the live ranks' stacks are in {report}" if report else ""),
            file=sys.stderr,
            flush=True,
        )
        if self.step and self.job_id:
            step = f"{self.env.get('SLURM_JOB_ID', self.job_id)}.{self.step}"
            threading.Thread(target=self._kill_step, args=(step,), daemon=True).start()
            time.sleep(SCANCEL_LEAD_S)
        srun = self._step_srun()
        if srun is not None:
            try:
                os.kill(srun, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _ask_stacks(self, silent: dict[str, list[int]], why: str) -> str | None:
        """Each live rank's stacks as its hang report, before the step is ended: asked of its
        beater (hpctrain.run.heartbeats.StacksAsked), awaited STACKS_WAIT_S at most, never
        longer (a rank that gives none is said so in its report, or has none). The reports'
        folder, RUN_DIR-relative; None when none came."""
        gone = {rank for ranks in silent.values() for rank in ranks}
        live = {r: addr for r, addr in self.senders.items() if r not in gone and not self.heard.ranks[r].gone}
        if self.sock is None or not live:
            return None
        folder = hang_reports.folder_of(self.run_dir, self.life)
        asked = StacksAsked(str(folder), why).encode()
        for addr in live.values():
            with contextlib.suppress(OSError):
                self.sock.sendto(asked, addr)
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and not set(live) <= hang_reports.reported(folder):
            time.sleep(0.1)
        if not hang_reports.reported(folder):
            return None
        return str(folder.relative_to(self.run_dir)) if folder.is_relative_to(self.run_dir) else str(folder)

    def _srun(self) -> int | None:
        """The running step's srun (its pid file written by the shell at launch, removed when it
        returned), if it still runs."""
        srun = _pid_in(self.folder / SRUN_PID_FILE)
        return srun if srun is not None and _is_srun(srun) else None

    def _step_srun(self) -> int | None:
        """The running srun, if it is the current step's own (or the step was heard before the
        shell wrote its pid): None once a relaunch's srun has taken its place."""
        srun = self._srun()
        if srun is None or (self.step_srun is not None and srun != self.step_srun):
            return None
        return srun

    def _kill_step(self, step: str) -> None:
        # `sleep:S` here: Slurm's kill of the step reaches its nodes late (slurmctld busy with the
        # silent node), and the relaunch's node check ends the old ranks in its place.
        faults.point("watch.before_step_kill")
        client.signal(step, "KILL", Purpose.IN_JOB, env=self.env)


def _is_srun(pid: int) -> bool:
    """The pid is still an srun (not a pid reused since that srun ended)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "srun"
    except OSError:
        return False


def _older(step: str, than: str) -> bool:
    return step.isdigit() and than.isdigit() and int(step) < int(than)


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpctrain.recovery.watch RUN_DIR FOLDER", file=sys.stderr)
        return 2
    # Slurm's stop signals reach every process of the batch step: the watcher keeps watching while
    # the step saves (a SIGTERM'd watcher would only stop detecting); the shell ends it by SIGKILL.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    return Watcher(Path(argv[0]), Path(argv[1]), os.environ).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
