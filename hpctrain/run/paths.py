"""The run directory contract: every path of a run dir, the files users, tools and a requeued
job read. No other module spells a run-dir file name."""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def no_room(error: BaseException) -> bool:
    """The filesystem is full, or the user's quota is: writing again will not help until
    someone makes room."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def no_room_message(run_dir: Path, error: OSError) -> str:
    """What to tell the user when the run dir cannot be written for want of room."""
    return (
        f"the run dir {run_dir} has no room ({error.strerror}): nothing more can be recorded, so this "
        f"run stops here and is not submitted again; make room, then `hpctrain-submit --retry {run_dir}` "
        "resumes it from its newest complete checkpoint"
    )


# The file a code snapshot (RUN_DIR/code, or a sweep's) holds beside the copied packages: what was
# copied and from which commit (hpctrain.submit.code_snapshot). Its presence marks a snapshot.
CODE_MANIFEST = "snapshot.json"


def in_code_snapshot(location: str | Path) -> bool:
    """True for a package (or module) found in a code snapshot: a copy a job imports, not the
    user's own code."""
    return (Path(location).parent / CODE_MANIFEST).is_file()


# sbatch's --output in a run dir: every life of a job appends to its file (%j: the job id).
SLURM_OUTPUT_PATTERN = "slurm-%j.out"
# The batch host's keeper's own output (srun --output, written on the keeper's node): its words
# outlive the batch host's loss, which takes the batch script's srun with it.
KEEPER_OUTPUT_PATTERN = "keeper-%j.out"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def overrides(self) -> Path:
        """The accepted command line's overrides, as Hydra writes them (a YAML list)."""
        return self.root / ".hydra" / "overrides.yaml"

    @property
    def config_dirs(self) -> Path:
        """The `--config-dir` the run was started with, absolute (a YAML list; absent: none), so
        `--resume` finds the user's own options again."""
        return self.root / ".hydra" / "config_dirs.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's event files (metrics.tensorboard), unless metrics.tensorboard_dir names another."""
        return self.root / "tensorboard"

    @property
    def mlruns(self) -> Path:
        """MLflow's local store when no tracking URI is set (metrics.mlflow)."""
        return self.root / "mlruns"

    @property
    def mlflow_run(self) -> Path:
        """The MLflow run id every life of the run logs to (metrics.mlflow)."""
        return self.root / "mlflow_run.json"

    @property
    def wandb(self) -> Path:
        """W&B's own files (offline runs to sync later), metrics.wandb."""
        return self.root / "wandb"

    @property
    def rendezvous(self) -> Path:
        """Where the ranks of one srun step meet: rank 0's address and port, its go-ahead."""
        return self.root / ".rendezvous"

    @property
    def memory(self) -> Path:
        """The in-memory tier's holders of the life: NODE.addr, `host:port` of each
        (hpctrain.recovery.memory_holder)."""
        return self.root / "memory"

    @property
    def wandb_run(self) -> Path:
        """The W&B run id every life of the run logs to (with metrics.wandb)."""
        return self.root / "wandb_run.json"

    @property
    def submission(self) -> Path:
        return self.root / "submission.json"

    @property
    def lock(self) -> Path:
        """Locked (flock) by the command that writes or trains in the run dir on this machine:
        hpctrain-train, hpctrain-submit; it holds who (hpctrain.run.lock)."""
        return self.root / ".run.lock"

    @property
    def code(self) -> Path:
        """hpctrain-submit's snapshot of the code the job imports (slurm.code_snapshot)."""
        return self.root / "code"

    @property
    def job_script(self) -> Path:
        """The rendered sbatch script (hpctrain-submit), runnable again by hand."""
        return self.root / "job.sbatch"

    @property
    def guardian_script(self) -> Path:
        """The guardian's sbatch script (hpctrain.recovery.guardian), absent with slurm.guardian=false."""
        return self.root / "guardian.sbatch"

    @property
    def trial(self) -> Path:
        """hpctrain-tune: this run is a trial of the study in its parent folder (number, params)."""
        return self.root / "trial.json"

    @property
    def generations(self) -> Path:
        """One numbered file per act on the run: the fencing tokens of its lives and submissions
        (hpctrain.run.generations owns their format)."""
        from hpctrain.run.generations import folder

        return folder(self.root)

    @property
    def listeners(self) -> Path:
        """The programs told when the run has ended (hpctrain.run.listeners): a trial of hpctrain-tune
        names the study's report."""
        return self.root / "listeners.json"

    def read_submission(self) -> dict[str, Any]:
        """submission.json as a dict; {} when it is missing or unreadable (a run never submitted)."""
        try:
            record = json.loads(self.submission.read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def write_submission(self, record: dict[str, Any], fenced: bool = True) -> None:
        """submission.json replaced whole (a reader sees the old record or the new, never half).
        `fenced`: refused to a replaced life (hpctrain.run.fencing); a submitter recording the new
        job's guardian writes it for the new job, after that job may have begun."""
        from hpctrain.run import fencing  # paths is imported by fencing's own imports' users

        if fenced:
            fencing.check(self.root)
        tmp = self.submission.with_name(self.submission.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, self.submission)

    def update_submission(self, fenced: bool = True, **fields: Any) -> None:
        """submission.json with `fields` set and every other field kept."""
        self.write_submission({**self.read_submission(), **fields}, fenced=fenced)

    def record_resubmission(self, job_id: str) -> None:
        """The run goes on in job `job_id` (a refused requeue was submitted again): tools that
        read submission.json follow it; the earlier record is kept under `resubmitted_from`."""
        record = self.read_submission()
        earlier = record.get("job_id")
        record.update(job_id=job_id, resubmitted_from=[*record.get("resubmitted_from", []), earlier])
        record.pop("guardian_job_id", None)  # the old job's: the new job's own is recorded once queued
        # A new job that is not the recorded array task (a refused requeue runs job.sbatch alone):
        # the array's fields went with the old one.
        if f"{record.get('array_job_id')}_{record.get('array_task_id')}" != job_id:
            for key in ("array_job_id", "array_task_id", "array_script", "array_guardian_job_id"):
                record.pop(key, None)
        self.write_submission(record)

    def room_left(self, probe_bytes: int = 64 * 1024) -> OSError | None:
        """None when the run dir's filesystem takes `probe_bytes` more (written, synced and
        removed again), else why not (ENOSPC, EDQUOT). A job submitted into a run dir that
        cannot record its own start would fail at once, and its record of that too."""
        probe = self.root / f".room-probe-{os.getpid()}"
        try:
            with open(probe, "wb") as file:
                file.write(b"\0" * probe_bytes)
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            if not no_room(error):
                raise
            return error
        finally:
            probe.unlink(missing_ok=True)
        return None

    @property
    def sigterm_mark_prefix(self) -> Path:
        """The batch shell's SIGTERM trap touches `<prefix><SLURM_JOB_ID>.<restart>` before
        anything else (a builtin, no process started): should Slurm kill the shell before the
        trap's control step has recorded the signal, the next life still knows its shell was
        told to stop (an admin's requeue, a preemption's grace ended), so no node died."""
        return self.root / ".sigterm-"

    def sigterm_mark(self, job_number: str, restart: int) -> Path:
        """The mark of life `restart` of job `job_number` (SLURM_JOB_ID): its shell got SIGTERM."""
        return Path(f"{self.sigterm_mark_prefix}{job_number}.{restart}")

    def slurm_outputs(self) -> list[Path]:
        """The jobs' output files (SLURM_OUTPUT_PATTERN), oldest job first."""
        return sorted(self.root.glob(SLURM_OUTPUT_PATTERN.replace("%j", "*")))

    def submitted_job_id(self) -> str | None:
        """The id of the job last submitted from this run dir (hpctrain-submit), or None."""
        job_id = self.read_submission().get("job_id")
        return str(job_id) if job_id else None


@dataclass(frozen=True)
class TuneDir:
    """hpctrain-tune's sweep dir: the study and what every trial's job needs to make the next
    trial without Hydra. Its trials are run dirs named by their number (`<sweep dir>/<n>`)."""

    root: Path

    @property
    def journal(self) -> Path:
        """Optuna's JournalStorage file: the study itself (every trial, its params and values)."""
        return self.root / "optuna.journal"

    @property
    def lock(self) -> Path:
        """Held while a trial's end is told and the next trials are submitted (one at a time).
        Optuna's open lock adds `.lock` to this name."""
        return self.root / "study"

    @property
    def base(self) -> Path:
        """The checked, resolved config every trial starts from (its params set on top)."""
        return self.root / "base.yaml"

    @property
    def study(self) -> Path:
        """The study's settings fixed at submit time: name, submit dir, code snapshot."""
        return self.root / "study.json"

    @property
    def summary(self) -> Path:
        """Best trial so far and counts, rewritten after every tell (read by hpctrain-status)."""
        return self.root / "tune.json"

    @property
    def events(self) -> Path:
        """The study's journal: every trial submitted and told, every failed submission."""
        return self.root / "tune.jsonl"

    @property
    def code(self) -> Path:
        """The code snapshot shared by every trial (slurm.code_snapshot)."""
        return self.root / "code"

    def trial_dir(self, number: int) -> Path:
        return self.root / str(number)

    def is_study(self) -> bool:
        return self.study.is_file()


@dataclass(frozen=True)
class SweepArrays:
    """A sweep's job arrays (slurm.array): array number `k` is queued from `script(k)`, whose task
    `t` trains in the run dir the relative symlink `links(k)/t` points to. Its --output goes
    through that link, so each task's SLURM_OUTPUT_PATTERN file lands in its own run dir."""

    sweep: Path

    @property
    def folder(self) -> Path:
        return self.sweep / ".array"

    def script(self, k: int) -> Path:
        return self.folder / f"array-{k}.sbatch"

    def links(self, k: int) -> Path:
        return self.folder / f"array-{k}"

    def guardian_script(self, k: int) -> Path:
        """The guardian of array `k` (hpctrain.recovery.array_guardian): one for all its tasks."""
        return array_guardian_script(self.links(k))


def array_guardian_script(links: Path) -> Path:
    """An array's guardian.sbatch, beside its links folder."""
    return links.with_name(f"{links.name}.guardian.sbatch")


def is_array_links(path: Path) -> bool:
    """A sweep's array links folder (`.array/array-K`), not a run dir."""
    return path.parent.name == ".array" and path.name.startswith("array-") and not (path / "config.yaml").exists()


# checkpoints/step_XXXXXXXX.pt with its step_XXXXXXXX.json, written last: a checkpoint counts
# from the moment its .json exists. Here, not in hpctrain.checkpoint, so that tools reading run
# dirs (hpctrain-status, the submit checks) need no torch.
_CHECKPOINT_META = re.compile(r"^step_(\d{8,})\.json$")
_CHECKPOINT_DATA = re.compile(r"^step_(\d{8,})\.pt$")


@dataclass(frozen=True)
class CheckpointFiles:
    step: int
    data: Path
    meta: Path


def checkpoint_files(folder: Path, step: int) -> CheckpointFiles:
    stem = f"step_{step:08d}"
    return CheckpointFiles(step, folder / f"{stem}.pt", folder / f"{stem}.json")


def checkpoints_in(folder: Path) -> list[CheckpointFiles]:
    """Complete-looking checkpoints (with their .json), newest first."""
    if not folder.is_dir():
        return []
    steps = [int(m.group(1)) for m in map(_CHECKPOINT_META.match, os.listdir(folder)) if m]
    return [checkpoint_files(folder, step) for step in sorted(steps, reverse=True)]


def unpublished_checkpoints_in(folder: Path) -> list[CheckpointFiles]:
    """Data files without their .json (a write or a prune cut between two renames), newest first."""
    if not folder.is_dir():
        return []
    names = set(os.listdir(folder))
    steps = [int(m.group(1)) for m in map(_CHECKPOINT_DATA.match, names) if m]
    found = [checkpoint_files(folder, step) for step in sorted(steps, reverse=True)]
    return [entry for entry in found if entry.meta.name not in names]


def restrict_umask() -> int:
    """Never make a file or folder writable by everyone, whatever umask the user has (000 on
    some shared machines): add `o-w` to this process's umask, which every file hpctrain writes,
    Hydra's run dir, sbatch's job (SLURM_UMASK) and its slurm-%j.out inherit. Group write is
    the user's choice and stays. Returns the umask now in force."""
    mask = os.umask(0) | 0o002
    os.umask(mask)
    return mask


def remove_empty_parents(path: Path) -> None:
    """After removing a run dir made by a failed command: the folders Hydra made for it
    (`runs/<date>/`), as long as they are empty, up to but never including the current directory."""
    here = Path.cwd().resolve()
    parent = path.resolve().parent
    while parent != here and here in parent.parents:
        try:
            parent.rmdir()  # only an empty folder goes
        except OSError:
            return
        parent = parent.parent
