"""Training-loss bookkeeping between log lines, averaged over ranks only when a line is due, and
rank 0's view of it: the log line, and a progress bar on a terminal.

The step adds its loss to a device tensor (no host sync); at a log step one all-reduce gives
the mean over every rank and step since the last line.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
import torch.distributed as dist

from hpctrain import logs
from hpctrain.dist.context import DistContext
from hpctrain.trainer.progress_bar import ProgressBar, format_duration, wanted

log = logging.getLogger(__name__)


class Progress:
    def __init__(
        self, ctx: DistContext, samples_per_step: int, total_steps: int, start_step: int = 0, bar: str = "off"
    ) -> None:
        self.ctx = ctx
        self.samples_per_step = samples_per_step  # global: batch x grad_accum x world size
        self.total_steps = total_steps
        self.step = start_step
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self.steps = 0
        self.clock = time.perf_counter()
        self.seconds_per_step = 0.0  # of the last window, for the bar right after a log line
        self.bar: ProgressBar | None = None
        if ctx.is_main and wanted(bar, sys.stderr, ctx.life.in_slurm):
            self.bar = ProgressBar(sys.stderr, total_steps)
            logs.attach_overlay(self.bar)

    def add(self, step_loss: torch.Tensor) -> None:
        self.loss_sum += step_loss.detach()  # float64 += float32: one kernel, no copy
        self.steps += 1
        self.step += 1
        if self.bar is not None and self.bar.due():
            self._draw(self.bar)

    def pause(self, seconds: float) -> None:
        """Leave time spent outside training steps (evaluation, saving) out of the rate."""
        self.clock += seconds

    def collect(self, step: int, lr: float) -> dict[str, float | int]:
        """The metrics line for `step`; resets the window."""
        loss = self.loss_sum.clone()
        if self.ctx.distributed:
            dist.all_reduce(loss)
        elapsed = max(time.perf_counter() - self.clock, 1e-9)
        record: dict[str, float | int] = {
            "step": step,
            "loss": loss.item() / max(self.steps, 1) / self.ctx.world_size,
            "lr": lr,
            "samples_per_s": self.samples_per_step * self.steps / elapsed,
        }
        self.seconds_per_step = elapsed / max(self.steps, 1)
        self.eta_s = (self.total_steps - step) * self.seconds_per_step
        self.loss_sum.zero_()
        self.steps = 0
        self.clock = time.perf_counter()
        return record

    def log_line(self, record: dict[str, float | int]) -> None:
        if self.bar is not None:
            self.bar.note(record)  # before the line: the bar drawn again after it shows this loss
        width = len(str(self.total_steps))
        text = (
            f"step {record['step']:>{width}}/{self.total_steps} loss {record['loss']:.4f} "
            f"lr {record['lr']:.3g} {record['samples_per_s']:.0f} samples/s eta {format_duration(self.eta_s)}"
        )
        if "eval_loss" in record:
            text += f" | eval_loss {record['eval_loss']:.4f}"
        if "eval_accuracy" in record:
            text += f" eval_accuracy {record['eval_accuracy']:.4f}"
        log.info(text)

    def close(self) -> None:
        """Erase the bar for good, before whatever the process prints next."""
        if self.bar is not None:
            logs.attach_overlay(None)
            self.bar.close()
            self.bar = None

    def _draw(self, bar: ProgressBar) -> None:
        elapsed = time.perf_counter() - self.clock
        if self.steps and elapsed > 0:  # this window so far; right after a line, the last one
            self.seconds_per_step = elapsed / self.steps
        rate = self.samples_per_step / self.seconds_per_step if self.seconds_per_step else 0.0
        eta = (self.total_steps - self.step) * self.seconds_per_step
        bar.draw(self.step, rate, eta)
