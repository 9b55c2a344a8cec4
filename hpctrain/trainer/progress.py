"""Training-loss bookkeeping between log lines, averaged over ranks only when a line is due.

The step adds its loss to a device tensor (no host sync); at a log step one all-reduce gives
the mean over every rank and step since the last line.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from hpctrain.dist import DistContext

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, ctx: DistContext, samples_per_step: int, total_steps: int) -> None:
        self.ctx = ctx
        self.samples_per_step = samples_per_step  # global: batch x grad_accum x world size
        self.total_steps = total_steps
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self.steps = 0
        self.clock = time.perf_counter()

    def add(self, step_loss: torch.Tensor) -> None:
        self.loss_sum += step_loss.detach().double()
        self.steps += 1

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
        self.eta_s = (self.total_steps - step) * elapsed / max(self.steps, 1)
        self.loss_sum.zero_()
        self.steps = 0
        self.clock = time.perf_counter()
        return record

    def log_line(self, record: dict[str, float | int]) -> None:
        width = len(str(self.total_steps))
        text = (
            f"step {record['step']:>{width}}/{self.total_steps} loss {record['loss']:.4f} "
            f"lr {record['lr']:.3g} {record['samples_per_s']:.0f} samples/s eta {_duration(self.eta_s)}"
        )
        if "eval_loss" in record:
            text += f" | eval_loss {record['eval_loss']:.4f}"
        if "eval_accuracy" in record:
            text += f" eval_accuracy {record['eval_accuracy']:.4f}"
        log.info(text)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
