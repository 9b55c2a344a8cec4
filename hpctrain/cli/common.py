"""What every Hydra entry point does first: check the composed config, write config.yaml.

Every refusal here is a user's mistake: one `error: ...` line on stderr naming what to change,
exit 2, no traceback, and a run dir this command made is removed again.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.config import Config, differences, fingerprint, identity, save_resolved, to_typed
from hpctrain.errors import UserError
from hpctrain.metrics.extras import check_extras
from hpctrain.run import lock
from hpctrain.run.events import Journal, Replanned
from hpctrain.run.exitcodes import CLI_USER_ERROR
from hpctrain.run.paths import RunDir, checkpoints_in, remove_empty_parents
from hpctrain.trainer.layout import range_refusal

# Hydra's own files in a fresh output dir, and the lock of the command that made it
# (hpctrain.run.lock); a run dir holding nothing else can go on a bad config.
_HYDRA_FILES = {".hydra", RunDir(Path()).lock.name}
# (composed config, its overrides) -> (typed Config, resolved config to write as config.yaml)
Checker = Callable[[DictConfig, Sequence[str]], tuple[Config, Any]]


def importable_here() -> None:
    """The folder the command runs in, importable first, as `python -m` and `python script.py`
    make theirs: a user's own package beside the command line (`model._target_=mypkg.nets.Net`)
    is found by hpctrain-train, -submit and -tune as by `python -c "import mypkg"`. A console
    script has only its own folder on sys.path; the job's processes start in the submit folder
    (--chdir) and find it the same way."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(CLI_USER_ERROR)


def is_fresh(root: Path) -> bool:
    """True when the run dir holds nothing of a run (only what Hydra writes before the entry)."""
    return not root.is_dir() or {p.name for p in root.iterdir()} <= _HYDRA_FILES


def run_dir_key() -> str:
    """The override that names the run dir: hydra.sweep.dir for a sweep's points."""
    return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"


def prepare_run_dir(cfg: DictConfig, check: Checker = to_typed) -> tuple[Config, RunDir]:
    """Check the config and write the run dir's config.yaml; on a bad config, print what to
    change, remove the run dir Hydra just made (if it holds nothing of a run) and exit 2.
    `check` gives the typed and the resolved config (a sweep checks its points more cheaply)."""
    config, run, _ = write_run_dir(cfg, check)
    return config, run


def write_run_dir(cfg: DictConfig, check: Checker = to_typed) -> tuple[Config, RunDir, dict[str, Any]]:
    """`prepare_run_dir`, also giving the resolved config it wrote as plain dicts and lists (what
    reading config.yaml back would give, without the read: a sweep's points each need it)."""
    hydra_cfg = HydraConfig.get()
    run = RunDir(Path(hydra_cfg.runtime.output_dir))
    try:
        config, resolved = check(cfg, hydra_cfg.overrides.task)
        check_extras(config.metrics)  # the training processes would refuse to start without them
        if not checkpoints_in(run.checkpoints):  # a run that trained keeps its global batch: the trainer checks
            check_node_range(config)
    except ValueError as error:
        discard_if_empty(run.root)
        fail(str(error))
    _refuse_a_live_command(run)
    _refuse_a_live_job(run)
    replanned = _refuse_a_different_config(run, resolved) if run.config.exists() else {}
    _refuse_checkpoints_of_another_model(run, config)
    if replanned:
        _refuse_a_plan_shorter_than_trained(run, replanned)
    plain = resolved if isinstance(resolved, dict) else OmegaConf.to_container(resolved, enum_to_str=True)
    assert isinstance(plain, dict)  # a DictConfig's container is a dict
    plain = cast(dict[str, Any], plain)  # its keys are config keys
    _write_overrides(run, hydra_cfg.overrides.task, _config_dirs(hydra_cfg))
    save_resolved(plain, run.config)
    lock.announce(run)
    if replanned:
        Journal(run.events).write_event(Replanned(changes=replanned))
        changes = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in replanned.items())
        print(f"hpctrain: {run.root} goes on with a new plan ({changes})", file=sys.stderr)
    return config, run, plain


def _write_overrides(run: RunDir, task: Sequence[str], config_dirs: Sequence[str]) -> None:
    """The accepted command line's overrides in .hydra/overrides.yaml, as Hydra wrote them, and its
    `--config-dir` (a resume reads both: hpctrain.cli.resume), written only once nothing refused
    the command."""
    from hpctrain.config import resolved_yaml

    run.overrides.parent.mkdir(exist_ok=True)
    written = {run.overrides: [str(line) for line in task], run.config_dirs: list(config_dirs)}
    for path, lines in written.items():
        if path == run.config_dirs and not lines:
            path.unlink(missing_ok=True)
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(resolved_yaml(lines))
        tmp.replace(path)


def _config_dirs(hydra_cfg: Any) -> list[str]:
    """The folder given with `--config-dir`, absolute (Hydra lists it as a command-line source)."""
    return [
        str(source.path).removeprefix("file://")
        for source in hydra_cfg.runtime.config_sources
        if source.provider == "command-line" and str(source.schema) == "file"
    ]


class MakeRunDir(Callback):
    """Make the run (or sweep) dir before Hydra does: a path that cannot be made (no such mount,
    no permission) is then one error line naming the key, not Hydra's traceback. Listed in
    conf/config.yaml under hydra.callbacks."""

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        _make(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        _make(config, "hydra.sweep.dir")


def _make(config: DictConfig, key: str) -> None:
    try:
        HydraConfig.instance().set_config(config)  # for ${hydra:...} in the path; Hydra sets it again
        folder = str(OmegaConf.select(config, key))
    except OmegaConfBaseException:
        return  # Hydra resolves it itself and says what is wrong
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"{key}: cannot make {folder}: {error.strerror or error}")


def _refuse_a_live_command(run: RunDir) -> None:
    """Another hpctrain-train or hpctrain-submit writing or training in this run dir right now:
    both would write the same files. This command holds the run dir's lock until it exits.
    Not inside a Slurm job (a rank of the user's own `srun hpctrain-train`): a requeued life must
    never wait on a lock its lost node still holds on a shared filesystem (NFS keeps a dead
    client's lock for its lease); the job's own record keeps its lives apart there."""
    if os.environ.get("SLURM_JOB_ID"):
        return
    try:
        lock.hold(run)
    except lock.RunDirInUse as holder:
        fail(
            f"{run.root} is in use by a live hpctrain command ({holder}): two runs would train in the "
            f"same run dir. Wait for it to end to resume there, or pick a new {run_dir_key()}"
        )
    except OSError as error:
        fail(f"{run.root}: cannot lock {run.lock.name} ({error.strerror or error}); pick a new {run_dir_key()}")


def _refuse_a_live_job(run: RunDir) -> None:
    """A run dir submitted before whose job is still queued or running: a second job (or a local
    run) would train in it at the same time."""
    from hpctrain.submit.submission import live_job

    job = live_job(run)
    if job is not None:
        fail(
            f"{run.root} belongs to job {job}, which has not ended: a second run would train in the same run dir. "
            f"Wait for it to end (or scancel it) to resume there, or pick a new {run_dir_key()}"
        )


def check_node_range(config: Config) -> None:
    """An elastic node range (slurm.nodes=2-4) whose sizes cannot all go on at each other's
    global batch is refused now, not at the first node lost (hpctrain.trainer.layout). For a new
    run: one that has trained keeps the global batch of its first life, which a resume checks."""
    slurm = config.slurm
    if not slurm.elastic_nodes:
        return
    sizes = range(slurm.min_nodes, slurm.max_nodes + 1)
    refusal = range_refusal(sizes, slurm.tasks_per_node, config.data.batch_size, config.trainer.grad_accum)
    if refusal:
        raise UserError(f"slurm.nodes: {refusal}")


def _refuse_a_different_config(run: RunDir, resolved: DictConfig | dict[str, Any]) -> dict[str, list[Any]]:
    """Starting an existing run dir again resumes it, with the config it ran but for the keys of
    its plan (REPLANNABLE): those changed are returned as {key: [old, new]}."""
    try:
        old = OmegaConf.to_container(OmegaConf.load(run.config))
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as error:
        fail(f"{run.config} is unreadable ({str(error).splitlines()[0]}); pick a new {run_dir_key()}")
    new = OmegaConf.to_container(resolved) if isinstance(resolved, DictConfig) else resolved
    was, now = _what_a_run_is(old), _what_a_run_is(new)
    # An elastic run may also resume on another number of processes, turned elastic at this very
    # resume too (the resize it is turned on for: before, that was refused with advice to do it).
    elastic = _leaf(now, "trainer.elastic") is True
    replannable = REPLANNABLE + (ELASTIC_REPLANNABLE if elastic else ())
    plan = {key: [_leaf(was, key), _leaf(now, key)] for key in replannable if _leaf(was, key) != _leaf(now, key)}
    changed = differences(_without(was, replannable), _without(now, replannable))
    if changed:
        sizes = [key for key in ELASTIC_REPLANNABLE if _leaf(was, key) != _leaf(now, key)]
        hint = f"; another size needs trainer.elastic=true ({', '.join(sizes)})" if sizes and not elastic else ""
        fail(
            f"{run.root} already holds a run with another config ({changed}); resume it with its own config "
            f"(only its plan may change: {', '.join(replannable)}{hint}) or pick a new {run_dir_key()}"
        )
    return plan


# The keys of a run's plan, which may change when its run dir is started again (a finished run
# trained longer, checkpoints more often, a longer time limit, a spare node): each change is
# journaled (`replanned`). What is trained (model, data, optimizer, schedule, seed, world) may not.
REPLANNABLE = (
    "trainer.max_steps",
    "trainer.epochs",
    "trainer.log_every",
    "trainer.eval_every",
    "trainer.ckpt_every",
    "trainer.keep_checkpoints",
    "slurm.time",
    "slurm.spare_nodes",
    "slurm.signal_delay_s",
    "trainer.elastic",
)
# With trainer.elastic, the number of processes is part of the plan too (hpctrain.trainer.layout).
ELASTIC_REPLANNABLE = (
    "trainer.nprocs",
    "slurm.nodes",
    "slurm.ntasks_per_node",
    "slurm.gpus_per_node",
)


def _leaf(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _without(tree: dict, keys: Sequence[str]) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for key in keys:
        section, _, name = key.partition(".")
        if isinstance(out.get(section), dict):
            out[section].pop(name, None)
    return out


def _refuse_a_plan_shorter_than_trained(run: RunDir, replanned: dict[str, list[Any]]) -> None:
    """A step budget cut below the newest checkpoint would end a run past its own plan."""
    new_steps = replanned.get("trainer.max_steps", [None, None])[1]
    trained = [entry.step for entry in checkpoints_in(run.checkpoints)]
    if new_steps and trained and max(trained) > new_steps:
        fail(
            f"trainer.max_steps={new_steps} is below the {max(trained)} steps {run.root} has trained; "
            f"raise it to at least {max(trained)}, or pick a new {run_dir_key()}"
        )


# Keys that say how a run is submitted or watched, not what it trains: starting a run dir again
# may change them (a dry run then the real one; TensorBoard switched on for the rest of a run;
# the site's network interfaces).
_NOT_WHAT_A_RUN_IS = {
    None: ("dry_run", "metrics", "tune"),
    "slurm": ("submit_parallelism", "code_snapshot", "network", "array", "array_parallelism", "warm_standby"),
    "trainer": ("progress_bar",),
}
# Sections with a fixed schema: a key a newer hpctrain added to them is missing from an older
# run's config.yaml, and its default is what that run trained with.
_SCHEMA_SECTIONS = ("data", "trainer", "slurm")


def _what_a_run_is(tree: object) -> dict:
    """A config less what changes only how it is submitted or watched, with the defaults of keys
    added since it was written filled in."""
    plain = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (tree if isinstance(tree, dict) else {}).items()}
    defaults = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(Config)))
    for section in _SCHEMA_SECTIONS:
        if isinstance(plain.get(section), dict):
            plain[section] = _with_missing_defaults(plain[section], defaults[section])
    for part, keys in _NOT_WHAT_A_RUN_IS.items():
        where = plain if part is None else plain.get(part)
        if isinstance(where, dict):
            for key in keys:
                where.pop(key, None)
    return plain


def _with_missing_defaults(values: dict, defaults: dict) -> dict:
    merged = dict(values)
    for key, default in defaults.items():
        if key not in merged:
            merged[key] = default
        elif isinstance(merged[key], dict) and isinstance(default, dict):
            merged[key] = _with_missing_defaults(merged[key], default)
    return merged


def _refuse_checkpoints_of_another_model(run: RunDir, config: Config) -> None:
    """Resuming checkpoints of another model, dataset or optimizer would train this config from
    the wrong state; the trainer refuses them too, but here nothing has started yet. Reads only
    the newest checkpoint's small .json (older checkpoints did not record a fingerprint)."""
    for entry in checkpoints_in(run.checkpoints):
        try:
            meta = json.loads(entry.meta.read_text())
        except (OSError, ValueError):
            continue  # a torn newest checkpoint: the trainer skips it, so does this check
        saved = meta.get("fingerprint")
        if saved is not None and saved != fingerprint(config):
            changed = differences(meta.get("identity") or {}, identity(config)) or "fingerprint " + saved
            fail(
                f"{run.checkpoints} holds checkpoints of another model, data or optimizer "
                f"(step {entry.step}: {changed}); resuming them would start this config from the wrong state. "
                f"Train it in a new run dir ({run_dir_key()}=...), or move {run.checkpoints} away to start over here"
            )
        return


def discard_if_empty(root: Path) -> None:
    """Remove a run dir holding nothing but Hydra's files, and the empty folders above it up to
    the current directory (Hydra made `runs/<date>/` for it)."""
    if root.is_dir() and is_fresh(root):
        shutil.rmtree(root, ignore_errors=True)
        remove_empty_parents(root)


def single_line(key: str, path: Path) -> None:
    """A path written into the job script: a newline would end its #SBATCH line."""
    if "\n" in str(path) or "\r" in str(path):
        raise ValueError(f"{key}: {str(path)!r} must be a single line (it contains a newline)")
