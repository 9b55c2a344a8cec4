"""TensorBoard scalars from rank 0: one tag per metrics.jsonl key (loss, lr, samples_per_s,
eval_loss, eval_accuracy), in one folder for every life of the run."""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from hpctrain.config.schema import MetricsConfig
from hpctrain.metrics.extras import import_extra
from hpctrain.run.paths import RunDir


def log_dir(settings: MetricsConfig, run_dir: Path) -> Path:
    """metrics.tensorboard_dir, relative to the run dir; <run dir>/tensorboard when empty."""
    return (
        (run_dir / Path(settings.tensorboard_dir).expanduser())
        if settings.tensorboard_dir
        else RunDir(run_dir).tensorboard
    )


class TensorBoardSink:
    label = "TensorBoard"

    def __init__(self, folder: Path, resumed_from_step: int) -> None:
        writer_module = import_extra("tensorboard")
        # A start marker at the first step this life logs: readers drop the events an earlier
        # life logged from that step on (it died before its next checkpoint), so each step is
        # seen once. A fresh run marks step 1, which hides nothing.
        self.writer = writer_module.SummaryWriter(str(folder), purge_step=resumed_from_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, numbers.Real):
                self.writer.add_scalar(key, float(value), step)
        # Once per log line, as metrics.jsonl: a live TensorBoard sees it, a killed job loses none.
        self.writer.flush()

    def close(self, outcome: str) -> None:
        self.writer.close()
