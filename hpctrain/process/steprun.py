"""`hpctrain-train` started on every task of a world: `srun hpctrain-train ...` in a user's own
sbatch or salloc allocation, or torchrun's workers.

Every task composes the config itself, so three things must be agreed:
  - the run dir: the one named by `hydra.run.dir=`, else `runs/slurm-<job id>` (Hydra's default
    has the time of day in it, which differs from task to task). A requeued job keeps its id,
    so it finds its checkpoints there again;
  - who writes it: rank 0 checks the run dir and writes config.yaml (and Hydra's .hydra/); the
    others wait for rank 0's verdict, then check that what they composed is what it wrote;
  - how many processes: each task is one rank; trainer.nprocs > 1 as well is refused.

A step of one task (`srun --pty bash`, then `hpctrain-train trainer.nprocs=4`) is no world:
hpctrain-train runs there as on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.run import rendezvous_record
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir
from hpctrain.slurm.env import in_slurm_step

# How a run dir is named on the command line (Hydra's override grammar allows + and ++).
_RUN_DIR_KEYS = ("hydra.run.dir=", "+hydra.run.dir=", "++hydra.run.dir=")


class StepError(UserError):
    """The ranks could not agree (no verdict from rank 0); nothing has been started."""


def world_rank(env: Mapping[str, str]) -> int | None:
    """This process's rank when it is one of several tasks started for it (torchrun first, then
    a multi-task srun step); None when hpctrain-train starts its own processes."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]) if int(env["WORLD_SIZE"]) > 1 else None
    if in_slurm_step(env) and int(env["SLURM_STEP_NUM_TASKS"]) > 1:
        return int(env["SLURM_PROCID"])
    return None


def step_overrides(env: Mapping[str, str], argv: Sequence[str], life: LifeStamp) -> list[str]:
    """Overrides a task of a world adds to its command line: a run dir every task agrees on,
    and Hydra's own files written by rank 0 only."""
    rank = world_rank(env)
    if rank is None:
        return []
    if any(word in ("-m", "--multirun") or word.startswith("--multirun=") for word in argv):
        raise UserError("-m/--multirun: a sweep cannot run inside srun or torchrun; submit it with hpctrain-submit -m")
    added = []
    if not any(word.startswith(_RUN_DIR_KEYS) for word in argv):
        if not life.number:
            raise UserError("every rank needs the same run dir: name it with hydra.run.dir=...")
        # The job's own number (SLURM_JOB_ID, an array task's too), as run dirs were always named:
        # a requeued life finds its checkpoints there again, whichever hpctrain named it.
        added.append(f"hydra.run.dir=runs/slurm-{life.number}")
    if rank > 0:
        added.append("hydra.output_subdir=null")
    return added


def verdict_path(run_dir: Path, env: Mapping[str, str], life: LifeStamp) -> Path:
    """One file per launch: a requeued job (restart count), another array task or a second step
    never reads an earlier launch's verdict."""
    if "RANK" in env:  # torchrun: its run id and restart count
        name = f"torchrun-{env.get('TORCHELASTIC_RUN_ID', 'none')}.r{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    else:
        name = f"{life.job_id}.r{life.restart}.s{env['SLURM_STEP_ID']}"
    return RunDir(run_dir).rendezvous / f"{name}.config"


def publish_verdict(path: Path, error: str | None) -> None:
    """Rank 0: the run dir is ready (config.yaml written), or why it refused."""
    rendezvous_record.publish(path, {"ok": error is None, "error": error})


def wait_for_verdict(path: Path, timeout_s: float) -> dict:
    verdict = rendezvous_record.wait_for(path, timeout_s)
    if verdict is not None:
        return verdict
    raise StepError(
        f"rank 0 wrote no config to {path.parent.parent} within {timeout_s:.0f} s: is the run dir on a "
        "filesystem every node sees, and did rank 0 start? (its output says why it did not)"
    )
