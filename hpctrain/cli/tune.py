"""hpctrain-tune: an Optuna search whose trials submit each other; the command returns at once.

    hpctrain-tune 'optim.lr=float(1e-4,1e-1,log)' 'data.batch_size=choice(32,64)' \\
        tune.metric=eval_accuracy tune.direction=maximize tune.n_trials=12 tune.parallel=3

Arguments whose value is `float(...)`, `int(...)` or `choice(...)` are the search space
(added to `tune.params`); the others are the usual Hydra overrides. The command checks the
config and the edges of the space, writes the sweep dir (hydra.sweep.dir, as with -m: the
study's journal, base.yaml, the code snapshot), submits the first `tune.parallel` trials in one
submit_all call, prints their `Submitted batch job <id>` lines and returns. Each trial's job,
when its run ends, tells the study and submits the next trials (hpctrain/tune/report.py).

Exit 2 for a mistake in the command or config (nothing written), 1 when sbatch refused the
trials (nothing queued, the sweep dir removed).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli import compose_once
from hpctrain.cli.common import discard_if_empty, fail, importable_here, is_fresh
from hpctrain.cli.overrides import before_hydra
from hpctrain.config import save_resolved, to_typed
from hpctrain.config.search_space import Param, is_spec, parse_space
from hpctrain.metrics.extras import check_extras
from hpctrain.run.exitcodes import CLI_REFUSED
from hpctrain.run.paths import TuneDir, restrict_umask

hconfig.register()

# What metrics.jsonl holds: the trainer's log line and, at evaluation steps, evaluate()'s.
KNOWN_METRICS = ("eval_loss", "eval_accuracy", "loss", "lr", "samples_per_s")
_space_from_argv: dict[str, str] = {}


def split_space(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(Hydra's arguments, search dimensions): `KEY=float(...)|int(...)|choice(...)` are the
    latter; Hydra would read them as its own sweep syntax and refuse them outside -m."""
    rest, space = [], {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and not arg.startswith("-") and not key.startswith(("+", "~")) and is_spec(value):
            space[key] = value
        else:
            rest.append(arg)
    return rest, space


def require_optuna() -> None:
    try:
        import optuna  # noqa: F401
    except Exception as error:  # a half-installed package fails in more ways than ImportError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        fail(f"hpctrain-tune needs Optuna, which cannot be imported here ({reason}): pip install 'hpctrain[tune]'")


def check_space(cfg: DictConfig, resolved: DictConfig, space: list[Param]) -> None:
    """Every tuned key exists, nothing follows it by interpolation (base.yaml is resolved, so
    a follower would keep the base value), and the space's edges pass the config's checks."""
    from hpctrain.tune.trials import check_params

    unresolved = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]))
    missing = object()
    for param in space:
        where = f"tune.params.{param.key}"
        if OmegaConf.select(resolved, param.key, default=missing) is missing:
            fail(
                f"{where}: {param.key} is not a key of the config; tune a key that exists"
                " (hpctrain-train --cfg job lists them)"
            )
        if "${" + param.key + "}" in unresolved or "${" + param.key + "." in unresolved:
            fail(
                f"{where}: another key follows {param.key} by interpolation (${{{param.key}}}); tune that key too "
                "or set it explicitly"
            )
        for value in param.edges():
            try:
                check_params(resolved, {param.key: value})
            except ValueError as error:
                fail(f"{where}: the value {value!r} in the space is refused: {error}")


def check_settings(config: Any) -> None:
    tune = config.tune
    if tune.metric not in KNOWN_METRICS:
        fail(f"tune.metric: {tune.metric!r} is not logged in metrics.jsonl; use one of {', '.join(KNOWN_METRICS)}")
    if tune.pruner != "none" and config.trainer.eval_every == 0:
        fail(
            "tune.pruner: the pruner judges trials at evaluation steps; set trainer.eval_every > 0 or tune.pruner=none"
        )
    if tune.pruner != "none" and not tune.metric.startswith("eval_"):
        fail(
            f"tune.pruner: prunes on evaluation metrics; set tune.metric to eval_loss or eval_accuracy "
            f"(got {tune.metric}) or tune.pruner=none"
        )
    if config.dry_run:
        fail(
            "dry_run: hpctrain-tune queues trials as they end and has no dry run; "
            "hpctrain-submit dry_run=true shows a job script"
        )


def write_study(tune: TuneDir, cfg: DictConfig, overrides: list[str]) -> list[Param]:
    """Check everything, then write base.yaml, the code snapshot, study.json and the study."""
    import json
    import os
    import time

    from hpctrain import __version__
    from hpctrain.submit.code_snapshot import CodeSnapshot, targets_in
    from hpctrain.tune import study as studies

    try:
        config, resolved = to_typed(cfg, overrides)
        check_extras(config.metrics)
    except ValueError as error:
        discard_if_empty(tune.root)
        fail(str(error))
    space = parse_space(config.tune.params)
    if not space:
        fail("tune.params: no search space; add one like 'optim.lr=float(1e-5,1e-1,log)' to the command")
    check_settings(config)
    check_space(cfg, resolved, space)
    save_resolved(resolved, tune.base)
    code_dir = None
    if config.slurm.code_snapshot:
        code = CodeSnapshot(tune.code)
        chosen = [str(c) for p in space if p.key.endswith("_target_") for c in p.choices]
        code.include([*targets_in(OmegaConf.to_container(resolved)), *chosen], Path(os.getcwd()))
        code_dir = str(code.folder)
    record = {
        "study_name": config.tune.study_name,
        "submit_dir": os.getcwd(),
        "code": code_dir,
        "created_at": round(time.time(), 3),
        "hpctrain_version": __version__,
        "overrides": overrides,
    }
    tune.study.write_text(json.dumps(record, indent=2) + "\n")
    studies.create(tune, config.tune)
    return space


@hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="tune")
def _main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    tune = TuneDir(Path(HydraConfig.get().runtime.output_dir).resolve())
    if tune.is_study() or not is_fresh(tune.root):
        fail(f"{tune.root} holds files already (a study?); pick a new hydra.sweep.dir=...")
    try:
        require_optuna()
    except SystemExit:
        discard_if_empty(tune.root)  # made by Hydra for this command: nothing of it stays
        raise
    overrides = [str(o) for o in HydraConfig.get().overrides.task]
    with open_dict(cfg):
        from_config = OmegaConf.to_container(cfg.tune.params)
        assert isinstance(from_config, dict)
        cfg.tune.params = {**from_config, **_space_from_argv}
    overrides += [f"tune.params.{k}={v}" for k, v in _space_from_argv.items()]
    try:
        write_study(tune, cfg, overrides)
        submitted = submit_first(tune)
    except BaseException:
        shutil.rmtree(tune.root, ignore_errors=True)  # all or nothing, as hpctrain-submit
        raise
    print(f"  sweep dir: {tune.root}")
    print(f"  {submitted} trial(s) queued; each submits the next when it ends. Follow: hpctrain-status {tune.root}")


def submit_first(tune: TuneDir) -> int:
    from hpctrain.cli.submit import announce
    from hpctrain.tune import study as studies
    from hpctrain.tune.launch import fill
    from hpctrain.tune.trials import StudySetup

    with studies.study_lock(tune):
        setup = StudySetup.read(tune)
        filled = fill(setup)
        studies.write_summary(tune, setup.settings, studies.load(tune, setup.settings).get_trials(deepcopy=False))
    for error in filled.errors:
        print(f"error: {error}", file=sys.stderr)
    if not filled.points:
        print("error: no trial could be queued; nothing was queued and the sweep dir was removed", file=sys.stderr)
        sys.exit(CLI_REFUSED)
    announce(filled.points, filled.job_ids)
    return len(filled.points)


def main() -> None:
    restrict_umask()  # before Hydra makes the sweep dir
    rest, space = split_space(sys.argv[1:])
    _space_from_argv.update(space)
    sys.argv = [sys.argv[0], *rest]
    importable_here()  # the user's own package beside the command line
    before_hydra("hpctrain-tune")
    compose_once.skip_the_mode_composition(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()
