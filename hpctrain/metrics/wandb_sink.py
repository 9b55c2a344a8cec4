"""Weights & Biases from rank 0: one W&B run per run dir, the config once, metrics every log line.

The W&B run's id lives in <run dir>/wandb_run.json, written before the run starts, so every
life of a run (a requeue, a resume by hand) goes on in the same W&B run (`resume="allow"`).
W&B takes each step once and only in increasing order, so a resumed life sends only steps past
the last one W&B has: online, W&B says which (the resumed run's `starting_step`); offline, the
earlier lives' files in <run dir>/wandb say it. Steps an earlier life logged after its
checkpoint keep that life's values (the same numbers, for an exact resume).

W&B buffers its offline file (32 KiB blocks) and a killed life (SIGKILL, a node failure) loses
what was not written yet. The next life sends those steps first, from metrics.jsonl (which holds
every step up to the checkpoint it resumes from), so W&B ends with every step, once.

Offline (the default) writes only files: compute nodes often have no internet. Each life is an
`offline-run-<time>-<id>` folder; `wandb sync <run dir>/wandb/offline-run-*` uploads them in
order into the one run. W&B's setup (a service process, a login online) runs on a background
thread, so it never delays a step.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import secrets
import string
from pathlib import Path
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.metrics import wandb_files
from hpctrain.metrics.background import BackgroundCalls
from hpctrain.metrics.extras import import_extra
from hpctrain.metrics.mlflow_sink import run_name
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir

# At the end, queued metrics get this long to reach W&B before the process moves on.
CLOSE_TIMEOUT_S = 60.0
# Hydra writes it into a sweep's folder: a run dir beside it is one of the sweep's points.
SWEEP_MARKER = "multirun.yaml"


def group(config: Config, run_dir: Path) -> str | None:
    """metrics.wandb_group, else the sweep dir for a sweep's points, so W&B shows them together."""
    if config.metrics.wandb_group:
        return config.metrics.wandb_group
    sweep_dir = run_dir.resolve().parent
    return run_name(config.metrics, sweep_dir) if (sweep_dir / SWEEP_MARKER).is_file() else None


def saved_or_new_id(run_dir: Path) -> str:
    """The run's W&B id from wandb_run.json; a new one, saved before W&B sees it, on the first life."""
    path = RunDir(run_dir).wandb_run
    if path.exists():
        return str(json.loads(path.read_text())["run_id"])
    # W&B's own ids: 8 characters of [a-z0-9] (its generator is not public API).
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"run_id": run_id}, indent=1) + "\n")
    os.replace(tmp, path)
    return run_id


def to_send(record: dict[str, Any], logged_through: int) -> dict[str, float]:
    """The metrics of one metrics.jsonl record W&B still needs: none for a step it has (it would
    drop them with a warning, and offline it cannot overwrite them)."""
    if int(record["step"]) <= logged_through:
        return {}
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, numbers.Real)}


class WandbSink:
    label = "W&B"

    def __init__(self, config: Config, run_dir: Path, resumed_from_step: int) -> None:
        import_extra("wandb")
        self.config = config
        self.run_dir = run_dir
        # Read now, before this life appends to it: the steps up to the checkpoint resumed from.
        self.earlier = [r for r in read_jsonl(RunDir(run_dir).metrics) if int(r["step"]) <= resumed_from_step]
        self.run: Any = None
        self.logged_through = -1  # the last step the W&B run has
        self.calls = BackgroundCalls(self.label)
        self.calls.submit(self._open)

    def write(self, record: dict[str, Any]) -> None:
        self.calls.submit(self._log, dict(record))

    def close(self, outcome: str) -> None:
        self.calls.submit(self._end, outcome)
        self.calls.close(CLOSE_TIMEOUT_S)

    # ---- on the background thread -------------------------------------------------------------

    def _open(self) -> None:
        import wandb

        settings = self.config.metrics
        run_id = saved_or_new_id(self.run_dir)
        offline = settings.wandb_mode == "offline"
        if offline:
            self.logged_through = wandb_files.last_logged_step(RunDir(self.run_dir).wandb, run_id)
        self.run = wandb.init(
            id=run_id,
            resume="allow",
            mode="offline" if offline else "online",
            dir=str(self.run_dir),
            project=settings.wandb_project,
            entity=settings.wandb_entity or None,
            group=group(self.config, self.run_dir),
            tags=list(settings.wandb_tags) or None,
            name=run_name(settings, self.run_dir),
            config=dataclasses.asdict(self.config),
            # Training's own log lines stay as they are (W&B would wrap stdout); no system
            # sampling beside the training processes; no git or code scans of the job's cwd.
            settings=wandb.Settings(
                console="off", x_disable_stats=True, disable_git=True, save_code=False, silent=True
            ),
        )
        if not offline:
            self.logged_through = max(self.logged_through, int(self.run.starting_step) - 1)
        for record in self.earlier:  # steps an earlier life logged that W&B lost (or never got)
            self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        values = to_send(record, self.logged_through)
        if values:
            self.run.log(values, step=int(record["step"]))
            self.logged_through = int(record["step"])

    def _end(self, outcome: str) -> None:
        if outcome == "stopped":
            self.run.mark_preempting()  # W&B shows it as preempted, to be resumed
        self.run.finish(exit_code=1 if outcome == "failed" else 0)
