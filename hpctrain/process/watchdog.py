"""End a training process that stopped making progress, so recovery can take over.

A hung collective or a stuck filesystem would otherwise burn the allocation until the time
limit. The trainer calls `stepped()` after every step and `beat()` around evaluation and saving
and as each stage of a start ends (the rendezvous, the resume); if none comes for the timeout
(hpctrain.process.step_timeout: learned from the life's steps right after a step, else
`trainer.hang_timeout_s`), every thread's stack is dumped to stderr (the Slurm .out file) and
a `failure` event (cause `hang`, the rank) is written to the journal, and the process exits
with WORKER_HUNG. The batch script counts the event against the `hang` budget: srun passes a
task's exit code on as another when --kill-on-bad-exit ends the other tasks.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.dist.collective_records import last_collectives, report_lines
from hpctrain.process import heartbeat
from hpctrain.process.step_timeout import StepTimeout, phase_timeouts
from hpctrain.run import hang_reports
from hpctrain.run.causes import Cause
from hpctrain.run.events import Failure, Journal
from hpctrain.run.exitcodes import WORKER_HUNG
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir
from hpctrain.trainer.hooks import PHASE_KEYS, STEPS_FOLLOW

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.dist.context import DistContext

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        on_hang: Callable[[float], None] | None = None,
        step_floor_s: float = 0.0,
        phases_s: dict[str, float] | None = None,
    ) -> None:
        self.timeout_s = timeout_s  # trainer.hang_timeout_s: 0 turns the watchdog off
        self.phases_s = dict(phases_s or {})  # phase -> its timeout (PHASE_KEYS); absent: timeout_s
        self.on_hang = on_hang  # called with the idle seconds before the process ends
        self.report: HangReport | None = None  # where this rank writes its hang report, if anywhere
        self.steps_done = 0  # this life's steps, for the report
        self.phase = "the start (rendezvous, model, resume)"
        self.steps = StepTimeout(cap_s=timeout_s, floor_s=step_floor_s)
        self._last = time.monotonic()
        self.steps.other(self._last)
        self._lock = threading.Lock()  # a beat and the watcher's look see one state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpctrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def beat(self, phase: str | None = None) -> None:
        """Progress that is not a step (a stage of the start, an evaluation, a save done), and
        the phase that begins now (FIRST_STEP, EVALUATION, SAVE), which has its own timeout;
        STEPS_FOLLOW: a save or an evaluation between steps is done, steps follow."""
        with self._lock:
            self._last = time.monotonic()
            if phase == STEPS_FOLLOW:
                self.steps.other(self._last, steps_follow=True)
                self.phase = "a training step"
                return
            self.steps.other(self._last, self.phases_s.get(phase) if phase else None, PHASE_KEYS.get(phase or "", ""))
            if phase:
                self.phase = phase

    def stepped(self) -> None:
        """A training step done: its time teaches the steady-state timeout."""
        with self._lock:
            self._last = time.monotonic()
            self.steps.stepped(self._last)
            self.steps_done += 1
            self.phase = "a training step"

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            answer_asked_collectives()
            with self._lock:
                idle, limit, source = time.monotonic() - self._last, self.steps.timeout_s(), self.steps.source()
            if idle > limit:
                log.error(
                    "no training step finished for %.0f s (%s): ending this process so the job can recover; "
                    "stacks follow",
                    idle,
                    source,
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                if self.report is not None:
                    self.report.write(idle, self.steps_done, self.phase)
                self._report(idle)
                heartbeat.say_bye()  # leaving on purpose: not a dead node to the batch script's watcher
                os._exit(WORKER_HUNG)  # no cleanup: the threads that would run it are the stuck ones

    def _report(self, idle_s: float) -> None:
        if self.on_hang is None:
            return
        try:
            self.on_hang(idle_s)
        except Exception:  # a stuck or full filesystem must not keep a hung process alive
            log.exception("could not record the hang in the journal")


def answer_asked_collectives() -> None:
    """The batch script's watcher asked this process's beater for a hang report (a silent node
    ends the step): the collectives this process recorded, for the beater to put in it. From the
    watchdog's thread, which runs while the main thread waits in a collective."""
    files = heartbeat.stack_files
    if files is None or not os.path.exists(files.asked):
        return
    tmp = f"{files.collectives}.tmp"
    try:
        with open(tmp, "w") as out:
            out.write("\n".join(report_lines(last_collectives())) + "\n")
        os.replace(tmp, files.collectives)
        os.unlink(files.asked)
    except OSError as error:
        log.warning("could not answer the watcher's ask for collectives: %s", error)


class HangReport:
    """This rank's RUN_DIR/hangs/<life>/rank-N.txt (hpctrain.run.hang_reports)."""

    def __init__(self, run_root: Path, life: LifeStamp, rank: int, world_size: int, node: str) -> None:
        self.run_root = run_root
        self.folder = hang_reports.folder_of(run_root, life)
        self.rank, self.world_size, self.node = rank, world_size, node
        self.behind: list[int] = []  # ranks whose newest collective was below their peers'

    def write(self, idle_s: float, steps: int, phase: str) -> None:
        """Where this rank stood, then every thread's stack. A full disk or a stuck file system
        leaves no report: the hang is still recorded and the process still ends."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = hang_reports.report_path(self.folder, self.rank)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "w") as out:
                out.write("\n".join(hang_reports.header(self.rank, self.node, idle_s, steps, phase)) + "\n")
                out.write("\n".join(report_lines(last_collectives())) + "\n")
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
            tmp.replace(path)
        except OSError as error:
            log.error("could not write the hang report in %s: %s", self.folder, error)

    def not_reached(self) -> list[int]:
        """The ranks that wrote no report in time, and those whose newest collective is below
        their peers': the ones the others wait for."""
        if self.world_size < 2:
            return []
        absent = hang_reports.missing(self.folder, self.world_size)
        self.behind = hang_reports.behind(self.folder)
        return sorted(set(absent) | set(self.behind))


def hang_reporter(
    events: Path, rank: int, life: LifeStamp, report: HangReport | None = None
) -> Callable[[float], None]:
    """Writes the hang to events.jsonl from whichever rank's watchdog saw it: with the ranks that
    wrote no hang report (the ones the others wait for) and the reports' folder."""

    def write(idle_s: float) -> None:
        absent = report.not_reached() if report is not None else None
        said = ""
        if absent:
            late = (
                "did not reach the collective the others wait in"
                if report and report.behind
                else "wrote no hang report"
            )
            said = f"; rank {', '.join(map(str, absent))} {late}"
        Journal(events).write_event(
            Failure(
                job_id=life.job_id,
                restart=life.restart,
                cause=Cause.HANG,
                rank=rank,
                reason=f"no training step finished for {idle_s:.0f} s{said}",
                report=str(report.folder.relative_to(report.run_root)) if report is not None else None,
                not_reached=absent,
            )
        )

    return write


def start_watchdog(config: Config, ctx: DistContext, run_dir: Path) -> Watchdog:
    """This process's watchdog, started: no progress within its timeout ends it as a hang,
    written to the run dir's journal by this rank, with its hang report beside."""
    report = HangReport(Path(run_dir), ctx.life, ctx.rank, ctx.world_size, ctx.node or socket.gethostname())
    on_hang = hang_reporter(RunDir(run_dir).events, ctx.rank, ctx.life, report)
    trainer = config.trainer
    phases = phase_timeouts(trainer)
    watchdog = Watchdog(trainer.hang_timeout_s, on_hang, trainer.step_hang_timeout_s, phases)
    watchdog.report = report
    return watchdog.start()
