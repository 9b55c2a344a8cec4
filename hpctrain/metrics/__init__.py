"""Where rank 0's metrics go: metrics.jsonl always, TensorBoard and MLflow when switched on
(`metrics.*` in the config). `open_sinks` is the one entry the trainer uses.
May import: run, config."""

from hpctrain.metrics.sinks import MetricSinks, open_sinks

__all__ = ["MetricSinks", "open_sinks"]
