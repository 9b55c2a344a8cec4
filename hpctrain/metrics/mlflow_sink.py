"""MLflow from rank 0: one MLflow run per run dir, params once, metrics every log line.

The MLflow run's id lives in <run dir>/mlflow_run.json, so every life of a run (a requeue, a
resume by hand) goes on in the same MLflow run. MLflow keeps every value logged for a step, so
a resumed life sends only steps past the last one each metric has there: steps an earlier life
logged after the checkpoint keep that life's values (the same numbers, for an exact resume).

Every MLflow call runs on a background thread: MLflow's HTTP client retries a server that is
gone for minutes, and training must not wait for it.
"""

from __future__ import annotations

import json
import numbers
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hpctrain.config.schema import MetricsConfig
from hpctrain.metrics.background import BackgroundCalls
from hpctrain.metrics.extras import import_extra
from hpctrain.run.paths import RunDir

# At the end, queued metrics get this long to reach the server before the process moves on.
CLOSE_TIMEOUT_S = 30.0
# How a life of the run ended, as MLflow says it; a stopped run (requeue pending) is KILLED
# until its next life sets it RUNNING again.
_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


def tracking_uri(settings: MetricsConfig, run_dir: Path) -> str:
    """metrics.mlflow_tracking_uri, else MLFLOW_TRACKING_URI, else a file store inside the run
    dir: it needs no server, moves with the run dir, and no two runs share it."""
    return (
        settings.mlflow_tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or RunDir(run_dir).mlruns.absolute().as_uri()
    )


def run_name(settings: MetricsConfig, run_dir: Path) -> str:
    """metrics.mlflow_run_name, else the run dir as the user named it: relative to the working
    directory (a job runs in its submit dir), `runs/2026-01-31/12-00-00`."""
    if settings.mlflow_run_name:
        return settings.mlflow_run_name
    here, where = Path.cwd().resolve(), run_dir.resolve()
    return str(where.relative_to(here)) if where.is_relative_to(here) and where != here else str(where)


class MlflowSink:
    label = "MLflow"

    def __init__(self, settings: MetricsConfig, run_dir: Path, params: dict[str, str]) -> None:
        import_extra("mlflow")
        self.settings = settings
        self.run_dir = run_dir
        self.params = params
        self.uri = tracking_uri(settings, run_dir)
        if urlparse(self.uri).scheme in ("", "file"):
            # MLflow 3 refuses its file store unless asked for it; a user's own "false" still wins.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.run_id = ""
        self.logged_through: dict[str, int] = {}  # metric -> the last step the MLflow run has
        self.calls = BackgroundCalls(self.label)
        self.calls.submit(self._open)

    def write(self, record: dict[str, Any]) -> None:
        self.calls.submit(self._log, dict(record), int(time.time() * 1000))

    def close(self, outcome: str) -> None:
        self.calls.submit(self._end, outcome)
        self.calls.close(CLOSE_TIMEOUT_S)

    # ---- on the background thread -------------------------------------------------------------

    def _open(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.uri)
        run = self._saved_run() or self._new_run()
        self.run_id = run.info.run_id
        if run.info.status != "RUNNING":
            self.client.update_run(self.run_id, status="RUNNING")
        self.logged_through = {m.key: m.step for m in run.data.to_proto().metrics}
        # Every param, once: a life killed right after creating the run has logged none yet.
        missing = [Param(k, v) for k, v in self.params.items() if k not in run.data.params]
        if missing:
            self.client.log_batch(self.run_id, params=missing)

    def _saved_run(self) -> Any:
        from mlflow.exceptions import MlflowException

        path = RunDir(self.run_dir).mlflow_run
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        try:
            return self.client.get_run(saved["run_id"])
        except MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise RuntimeError(
                f"MLflow run {saved['run_id']} of {path} is not in {self.uri}; "
                f"was metrics.mlflow_tracking_uri or MLFLOW_TRACKING_URI changed?"
            ) from None

    def _new_run(self) -> Any:
        run = self.client.create_run(
            self._experiment_id(),
            run_name=run_name(self.settings, self.run_dir),
            tags={"hpctrain.run_dir": str(self.run_dir.resolve())},
        )
        _write_atomically(
            RunDir(self.run_dir).mlflow_run,
            {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "tracking_uri": self.uri},
        )
        return run

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.settings.mlflow_experiment
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException as error:  # another run of a sweep made it meanwhile
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise RuntimeError(
                f"experiment {name!r} is deleted in {self.uri}; restore it or set metrics.mlflow_experiment"
            )
        return found.experiment_id

    def _log(self, record: dict[str, Any], timestamp_ms: int) -> None:
        from mlflow.entities import Metric

        step = int(record["step"])
        metrics = [
            Metric(key, float(value), timestamp_ms, step)
            for key, value in record.items()
            if key != "step" and isinstance(value, numbers.Real) and step > self.logged_through.get(key, -1)
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def _end(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, status=_STATUS[outcome])


def _write_atomically(path: Path, content: dict[str, str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=1) + "\n")
    os.replace(tmp, path)
