"""A trial's run dir, made from the study's base config and the trial's params, without Hydra.

hpctrain-tune composes and checks the config once and keeps it resolved in `base.yaml`; a
trial's job, on a compute node, sets the next trial's params on top of it, checks the result
like hpctrain-submit does (`to_typed`: types, values, `_target_` signatures), and writes the
run dir (config.yaml, trial.json, listeners.json, job.sbatch) that `submit_all` queues.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpctrain.config import save_resolved, to_typed
from hpctrain.config.search_space import Param, parse_space
from hpctrain.config.tune import TuneConfig
from hpctrain.run.listeners import write_listeners
from hpctrain.run.paths import RunDir, TuneDir
from hpctrain.submit.code_snapshot import MANIFEST, CodeSnapshot
from hpctrain.submit.submission import Point, write_script
from hpctrain.tune.report import LISTENER as REPORT


@dataclass(frozen=True)
class StudySetup:
    """What every trial of a study shares, read from the sweep dir."""

    tune: TuneDir
    base: DictConfig
    settings: TuneConfig
    space: list[Param]
    submit_dir: Path  # the job's --chdir: where hpctrain-tune was run
    code: CodeSnapshot | None
    submit_parallelism: int

    @classmethod
    def read(cls, tune: TuneDir) -> StudySetup:
        base = OmegaConf.load(tune.base)
        assert isinstance(base, DictConfig)
        study = json.loads(tune.study.read_text())
        settings = settings_of(base)
        return cls(
            tune=tune,
            base=base,
            settings=settings,
            space=parse_space(settings.params),
            submit_dir=Path(study["submit_dir"]),
            code=existing_snapshot(Path(study["code"])) if study.get("code") else None,
            submit_parallelism=int(OmegaConf.select(base, "slurm.submit_parallelism", default=8)),
        )


def settings_of(config: DictConfig) -> TuneConfig:
    merged = OmegaConf.merge(OmegaConf.structured(TuneConfig), config.get("tune", {}))
    settings = OmegaConf.to_object(merged)
    assert isinstance(settings, TuneConfig)
    return settings


def existing_snapshot(folder: Path) -> CodeSnapshot:
    """The sweep dir's code/ taken at submit time, as a trial's job script names it."""
    code = CodeSnapshot(folder)
    code.manifest = json.loads((folder / MANIFEST).read_text())
    return code


def with_params(base: DictConfig, params: dict[str, Any]) -> DictConfig:
    tree = OmegaConf.create(OmegaConf.to_container(base))
    assert isinstance(tree, DictConfig)
    for key, value in params.items():
        OmegaConf.update(tree, key, value, merge=False, force_add=True)
    return tree


def check_params(base: DictConfig, params: dict[str, Any]) -> tuple[Any, DictConfig]:
    """The typed and resolved config of a trial; ValueError naming the key when refused."""
    overrides = [f"{key}={value}" for key, value in params.items()]
    return to_typed(with_params(base, params), overrides)


def make_trial(setup: StudySetup, number: int, trial_id: int, params: dict[str, Any]) -> Point:
    """Write trial `number`'s run dir and job script; ValueError when its config is refused."""
    config, resolved = check_params(setup.base, params)
    run = RunDir(setup.tune.trial_dir(number))
    run.root.mkdir(parents=True, exist_ok=False)  # a trial's number is never reused
    save_resolved(resolved, run.config)
    record = {
        "number": number,
        "trial_id": trial_id,
        "params": params,
        "study_name": setup.settings.study_name,
        "metric": setup.settings.metric,
        "direction": setup.settings.direction,
    }
    run.trial.write_text(json.dumps(record, indent=2, default=str) + "\n")
    write_listeners(run, [REPORT])  # its job tells the study when the run has ended
    overrides = [f"{key}={value}" for key, value in params.items()]
    point = Point(config=config, run=run, overrides=overrides, fresh=True, code=setup.code)
    write_script(point, setup.submit_dir)
    return point


def read_trial(run: RunDir) -> dict[str, Any]:
    return dict(json.loads(run.trial.read_text()))
