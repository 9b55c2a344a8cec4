"""hpctrain-submit: compose, check, render and queue a job (or a sweep with -m), then return.

    hpctrain-submit slurm.nodes=4 slurm.gpus_per_node=8 optim.lr=3e-4
    hpctrain-submit -m optim.lr=1e-4,3e-4 model=convnet,mlp     # every point its own job
    hpctrain-submit dry_run=true                                 # print the script, queue nothing
    hpctrain-submit --retry SWEEP_DIR [POINT...] [--dry-run]     # resubmit unfinished points (cli/retry.py)

A sweep runs through hpctrain's Hydra launcher (hydra_plugins/hpctrain_launcher), which checks
and renders every point first and then submits them all at once.

Failures: a bad value exits 2 before anything is queued; sbatch's refusal exits 1 with sbatch's
own words. Either way no job of this command stays queued and no run dir it made is left.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli import compose_once, resume
from hpctrain.cli.common import (
    Checker,
    discard_if_empty,
    fail,
    importable_here,
    is_fresh,
    run_dir_key,
    single_line,
    write_run_dir,
)
from hpctrain.cli.overrides import before_hydra
from hpctrain.config import Config, to_typed
from hpctrain.errors import UserError
from hpctrain.run.exitcodes import CLI_REFUSED, CLI_USER_ERROR
from hpctrain.run.paths import restrict_umask
from hpctrain.slurm.jobid import split as split_job_id
from hpctrain.slurm.times import as_slurm_reads_it
from hpctrain.submit import sbatch
from hpctrain.submit.code_snapshot import CodeSnapshot, targets_in
from hpctrain.submit.shared_dirs import node_local_refusal
from hpctrain.submit.submission import (
    Point,
    discard_points,
    discard_run_dir,
    discard_sweep_dir,
    submit_all,
    write_script,
)

hconfig.register()


def prepare_point(cfg: DictConfig, shared_code: CodeSnapshot | None = None, check: Checker = to_typed) -> Point:
    """Check the config (with `check`), write config.yaml, the code snapshot and job.sbatch into
    the point's run dir. `shared_code`: a sweep's one snapshot for all its points (else the run
    dir's own)."""
    root = Path(HydraConfig.get().runtime.output_dir)
    fresh = is_fresh(root)
    try:
        # Both paths are written into the job script, where a newline would end a line.
        single_line(run_dir_key(), root)
        single_line("the current directory (the job's --chdir)", Path(os.getcwd()))
    except ValueError as error:
        discard_if_empty(root)
        fail(str(error))
    config, run, resolved = write_run_dir(cfg, _with_shared_run_dir(check, root))
    point = Point(config=config, run=run, overrides=list(HydraConfig.get().overrides.task), fresh=fresh)
    try:
        point.code = snapshot_code(point, shared_code, resolved)
        write_script(point, Path(os.getcwd()))
    except ValueError as error:  # a bad template or a value sbatch cannot take
        if fresh:
            discard_run_dir(run.root)
        fail(str(error))
    return point


def _with_shared_run_dir(check: Checker, root: Path) -> Checker:
    """`check`, then the run dir refused where the job's nodes would each have their own of it."""

    def checked(cfg: DictConfig, task: Sequence[str]) -> tuple[Config, Any]:
        config, resolved = check(cfg, task)
        slurm = config.slurm
        refusal = node_local_refusal(root, slurm.max_nodes + slurm.spare_nodes, slurm.node_local_dirs, run_dir_key())
        if refusal:
            raise ValueError(refusal)
        return config, resolved

    return checked


def snapshot_code(point: Point, shared_code: CodeSnapshot | None, resolved: dict[str, Any]) -> CodeSnapshot | None:
    """Copy the code the job will import into code/ (slurm.code_snapshot), or None when off.
    `resolved`: the config.yaml just written, as plain dicts (reading it back cost 25 ms a point)."""
    if not point.config.slurm.code_snapshot:
        return None
    code = shared_code or CodeSnapshot(point.run.code)
    try:
        code.include(targets_in(resolved), Path(os.getcwd()))
    except OSError as error:  # a full disk, an unreadable source file
        raise ValueError(
            f"slurm.code_snapshot: could not copy the code into {code.folder}: {error}; "
            "free space there or set slurm.code_snapshot=false"
        ) from None
    return code


def discard_sweep(sweep_dir: Path, points: list[Point]) -> None:
    """After a sweep failed before or while submitting: its points' run dirs, then its folder."""
    discard_points(points)
    discard_sweep_dir(sweep_dir)


def announce(points: list[Point], job_ids: list[str]) -> None:
    """`Submitted batch job <id>` once per sbatch (a job, or a whole array), then its run dirs;
    an array's points with their own `<array>_<task>`."""
    arrays: dict[str, list[tuple[Point, str]]] = {}
    for point, job_id in zip(points, job_ids):
        job, task = split_job_id(job_id)
        arrays.setdefault(job, []).append((point, "" if task is None else f" (job {job_id})"))
    for job, members in arrays.items():
        print(f"Submitted batch job {job}")
        for point, which in members:
            print(f"  run dir: {point.run.root}{which}")
    sys.stdout.flush()


def submit_or_exit(points: list[Point]) -> list[str]:
    try:
        job_ids = submit_all(points, points[0].config.slurm.submit_parallelism if points else 1)
    except sbatch.SbatchError as error:
        print(f"error: {error}", file=sys.stderr)
        if not error.maybe_queued:  # else the message says what to check
            fresh = all(point.fresh for point in points)
            print(
                "nothing was queued and no run dir was kept"
                if fresh
                else "nothing was queued; run dirs that held a run before are kept",
                file=sys.stderr,
            )
        sys.exit(CLI_REFUSED)  # sbatch refused
    except UserError as error:  # another actor submits into a run dir right now (its generation)
        print(f"error: {error}; nothing was queued", file=sys.stderr)
        sys.exit(CLI_USER_ERROR)
    announce(points, job_ids)
    # The time limit as Slurm will hold the job to it: `25:00` is 25 minutes, not 25 hours.
    limits = sorted({point.config.slurm.time for point in points})
    for limit in limits:
        print(f"hpctrain-submit: time limit {limit}: {as_slurm_reads_it(limit)}", file=sys.stderr)
    return job_ids


@hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="submit")
def _main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    point = prepare_point(cfg)
    if point.config.dry_run:
        print(point.script.read_text(), end="")
        print(f"# time limit {point.config.slurm.time}: {as_slurm_reads_it(point.config.slurm.time)}")
        print(f"# dry run: nothing queued; the run dir {point.run.root} holds job.sbatch and config.yaml")
        return
    submit_or_exit([point])


def main() -> None:
    restrict_umask()  # before Hydra makes the run dir
    importable_here()  # the user's own package beside the command line
    if "--retry" in sys.argv[1:]:  # no Hydra override is spelled so: a sweep's points again
        from hpctrain.cli import retry

        sys.exit(retry.main([a for a in sys.argv[1:] if a != "--retry"]))
    before_hydra("hpctrain-submit")
    sys.argv[1:] = resume.with_the_runs_own(sys.argv[1:])  # the run's own plan kept (cli/resume.py)
    compose_once.skip_the_mode_composition(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()
