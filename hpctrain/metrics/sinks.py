"""Rank 0's metric records, fanned out: metrics.jsonl always, TensorBoard, MLflow and W&B on request.

metrics.jsonl is the run's contract (hpctrain-status reads it): a failure to write it is a
failure of the run. The other sinks are extras: the first error of one is told once and the sink
is dropped, and training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hpctrain.config.schema import Config
from hpctrain.errors import UserError
from hpctrain.metrics import jsonl, params
from hpctrain.metrics.background import warn_failed
from hpctrain.run.jsonlines import JsonLines
from hpctrain.run.paths import RunDir

log = logging.getLogger(__name__)


class Sink(Protocol):
    label: str  # how the one warning names it: "TensorBoard"

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self, outcome: str) -> None:
        """outcome: finished, stopped (a signal; the run goes on in a later life) or failed."""


class MetricSinks:
    def __init__(self, lines: JsonLines | None = None, extras: list[Sink] | None = None) -> None:
        self.lines = lines
        self.extras = list(extras or [])

    def write(self, record: dict[str, Any]) -> None:
        if self.lines is not None:
            self.lines.write(record)
        for sink in list(self.extras):
            self._try(sink, sink.write, record)

    def close(self, outcome: str) -> None:
        for sink in list(self.extras):
            self._try(sink, sink.close, outcome)
        self.extras.clear()

    def _try(self, sink: Sink, call: Any, argument: Any) -> None:
        try:
            call(argument)
        except Exception as error:
            self.extras.remove(sink)
            warn_failed(sink.label, error)


def open_sinks(config: Config, run_dir: Path, resumed_from_step: int, is_main: bool) -> MetricSinks:
    """Rank 0's sinks, set to go on from `resumed_from_step`; other ranks get none.
    Raises UserError when a switched-on integration is not installed on this node."""
    if not is_main:
        return MetricSinks()
    run = RunDir(run_dir)
    dropped = jsonl.drop_steps_after(run.metrics, resumed_from_step)
    if dropped:
        log.info(
            "metrics.jsonl: dropped %d lines logged after step %d by the interrupted run", dropped, resumed_from_step
        )
    extras: list[Sink] = []
    settings = config.metrics
    if settings.tensorboard:
        from hpctrain.metrics.tensorboard_sink import TensorBoardSink, log_dir

        _add(extras, "TensorBoard", lambda: TensorBoardSink(log_dir(settings, run_dir), resumed_from_step))
    if settings.mlflow:
        from hpctrain.metrics.mlflow_sink import MlflowSink

        _add(extras, "MLflow", lambda: MlflowSink(settings, run_dir, params.flatten(config)))
    if settings.wandb:
        from hpctrain.metrics.wandb_sink import WandbSink

        _add(extras, "W&B", lambda: WandbSink(config, run_dir, resumed_from_step))
    return MetricSinks(jsonl.MetricsLines(run.metrics), extras)


def _add(extras: list[Sink], label: str, build: Callable[[], Sink]) -> None:
    """A sink that cannot start (a folder it cannot make) is told and left out, like one that
    fails later; an integration not installed here is the user's to fix, before any step."""
    try:
        extras.append(build())
    except UserError:
        raise
    except Exception as error:
        warn_failed(label, error)
