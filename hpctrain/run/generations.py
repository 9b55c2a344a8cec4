"""One authority per run dir: generations, the fencing tokens of its lives and submissions.

Seven actors can act on one run (the batch shell, its control step, the heartbeat watcher, the
keeper, the guardian, a warm standby, a user's `hpctrain-submit --retry`), on different machines,
each deciding from what it sees. What keeps two of them from both going on is a numbered file
per act in the run dir's `generations/` folder:

    generations/00000001.json   {"kind": "submit", "by": "hpctrain-submit", "job_id": "36", "token": ...}
    generations/00000002.json   {"kind": "life", "job_id": "36", "restart": 0, ...}
    generations/00000003.json   {"kind": "submit", "by": "keeper", "job_id": "41", "token": ...}
    generations/00000004.json   {"kind": "life", "job_id": "41", "restart": 0, ...}

Taking generation N+1 is the compare-and-swap: it is created by a hard link of a finished
temporary file to its name, which fails when the name exists, atomically on every POSIX
filesystem and on NFS, Lustre and GPFS across machines (where flock may be missing). So of the
guardian, the keeper and a `--retry` that each saw generation N and each try N+1, exactly one
wins; the others are told who did and stop.

- A submission (hpctrain-submit, `--retry`, the guardian, the keeper, the control step's
  resubmission after a refused requeue) takes a `submit` generation *before* its sbatch, and
  hands the new job a token (TOKEN_ENV); once sbatch answered it names the job in its record.
- Each life of a job (`control begin`, hpctrain.run.lives) takes a `life` generation, allowed only when the newest
  is its own job's (a submission whose token it carries, or its own job's earlier life or
  requeue). A life that finds a newer act than its job's is fenced: it launches nothing.
- The control step's requeue takes a `requeue` generation after its own life's, and its
  relaunch of a step within the life a `relaunch` generation: the old step's ranks (a node that
  froze and thaws) are fenced by it, the life's other processes are not (hpctrain.run.fencing).
- Every write a life makes (journal, metrics, checkpoints, prune, model.pt) asks `superseded`
  first: one stat() of the next generation's name. A fenced process exits at once, writing
  nothing (hpctrain.run.fencing).

A process frozen between that stat and its write (a SIGSTOP, a hung kernel, microseconds wide)
can still land that one write after a newer life began: a file of its own is all a filesystem
can fence without storage-side support. A job submitted by hand (`sbatch RUN_DIR/job.sbatch`,
no token) is a user's explicit act: its first life takes the run over from whoever held it.
Run dirs written before generations existed have none: their first act starts at 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# The folder of a run dir (hpctrain.run.paths.RunDir.generations spells it for everyone else).
FOLDER = "generations"
# The token a submission hands the job it queues, in sbatch's environment; Slurm keeps a job's
# environment across requeues, so every life of that job carries it.
TOKEN_ENV = "HPCTRAIN_CLAIM"

SUBMIT, LIFE, REQUEUE, RELAUNCH = "submit", "life", "requeue", "relaunch"
KINDS = (SUBMIT, LIFE, REQUEUE, RELAUNCH)
# A submission's generation whose sbatch has not answered yet: another actor that finds it
# newest waits for its job (or for this long: an sbatch that hung, a submitter that died).
PENDING_SUBMIT_S = 300.0

_NAME = re.compile(r"^(\d{8,})\.json$")


@dataclass(frozen=True)
class Generation:
    """One act on the run: who took it, for which job."""

    number: int
    kind: str  # SUBMIT, LIFE, REQUEUE or RELAUNCH
    by: str  # hpctrain-submit, retry, guardian, keeper, hpctrain (the control step), slurm
    job_id: str | None = None  # the job: a submission's once sbatch answered (None before)
    restart: int | None = None  # a life's SLURM_RESTART_COUNT
    token: str | None = None  # a submission's: the job it queued carries it (TOKEN_ENV)
    names: tuple[str, ...] = ()  # a life's other names (an array task's own number)
    abandoned: bool = False  # a submission whose sbatch queued nothing
    host: str = ""
    pid: int = 0
    time: float = 0.0

    def names_job(self, job_ids: Iterable[str]) -> bool:
        ids = set(job_ids)
        return bool(ids & {self.job_id, *self.names})

    def describe(self) -> str:
        what = {SUBMIT: "submission", LIFE: "life", REQUEUE: "requeue", RELAUNCH: "relaunch"}.get(self.kind, self.kind)
        job = f" of job {self.job_id}" if self.job_id else " (its sbatch not answered yet)"
        restart = f" restart {self.restart}" if self.kind in (LIFE, RELAUNCH) and self.restart is not None else ""
        return f"generation {self.number}: {what}{job}{restart} by {self.by} on {self.host or '?'}"

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["names"] = list(self.names)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Generation:
        fields = {k: record[k] for k in cls.__dataclass_fields__ if k in record}
        fields["names"] = tuple(fields.get("names") or ())
        return cls(**fields)


class Superseded(Exception):
    """A newer generation than the one an act was based on exists: the act loses. `newer` is it
    (None when it could not be read)."""

    def __init__(self, based_on: int, newer: Generation | None) -> None:
        self.based_on = based_on
        self.newer = newer
        who = newer.describe() if newer else f"generation {based_on + 1}"
        super().__init__(f"the run was taken over ({who})")


def folder(run_root: Path) -> Path:
    return run_root / FOLDER


def path_of(run_root: Path, number: int) -> Path:
    return folder(run_root) / f"{number:08d}.json"


def numbers(run_root: Path) -> list[int]:
    """Every generation's number, ascending ([] for a run dir without any)."""
    try:
        names = os.listdir(folder(run_root))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)


def read(run_root: Path, number: int) -> Generation | None:
    try:
        return Generation.from_record(json.loads(path_of(run_root, number).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def newest(run_root: Path) -> Generation | None:
    """The run's newest generation (None: none taken yet, or a run dir from before them). A
    newest that cannot be read (a name without its text yet cannot exist: the link is of a
    finished file) counts as absent only when it does not exist."""
    found = numbers(run_root)
    if not found:
        return None
    return read(run_root, found[-1]) or Generation(found[-1], "unknown", "unknown")


def superseded(run_root: Path, number: int) -> bool:
    """A newer generation than `number` exists: one stat(), the check before every write."""
    return os.path.lexists(path_of(run_root, number + 1))


def take(run_root: Path, after: int, generation: Generation) -> Generation:
    """Generation `after + 1` taken for `generation` (its number, host, pid and time set here),
    exactly once among every process that tries it on any machine; raises Superseded (naming
    the winner) when another took it first, or took a later one already."""
    taken = replace(generation, number=after + 1, host=socket.gethostname(), pid=os.getpid(), time=time.time())
    target = path_of(run_root, taken.number)
    folder(run_root).mkdir(parents=True, exist_ok=True)
    if superseded(run_root, after + 1):  # a later one exists already: `after` is long gone
        raise Superseded(after, read(run_root, after + 1))
    tmp = folder(run_root) / f".{taken.number:08d}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        tmp.write_text(json.dumps(taken.to_record()) + "\n")
    except OSError:  # a full disk: nothing of this try is left behind
        tmp.unlink(missing_ok=True)
        raise
    try:
        try:
            os.link(tmp, target)
        except FileExistsError:
            # NFS may answer EEXIST to a retransmitted LINK that did succeed: the link count of
            # our own file says whether the name is ours.
            if os.stat(tmp).st_nlink < 2:
                raise Superseded(after, read(run_root, taken.number)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return taken


def name_job(run_root: Path, generation: Generation, job_id: str | None) -> Generation:
    """A submission's generation once its sbatch answered: the job it queued (None: nothing was
    queued, the generation abandoned). Only its taker writes it, replaced whole."""
    named = replace(generation, job_id=job_id, abandoned=job_id is None)
    target = path_of(run_root, generation.number)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.named")
    tmp.write_text(json.dumps(named.to_record()) + "\n")
    os.replace(tmp, target)
    return named


def withdraw(run_root: Path, generation: Generation) -> bool:
    """A submission whose sbatch surely queued nothing (refused): marked abandoned (it decides
    nothing, `dead`). Only a run dir's first generation, still alone, is removed, so that a run
    dir whose first submission was refused is left as it was (no `generations/` either). True
    when removed: its taker has no generation again."""
    if generation.number != 1 or superseded(run_root, generation.number):
        # Marked, never removed: an act taken after it meanwhile keeps its number, and the
        # numbers never leave a gap that a later check would not see past.
        name_job(run_root, generation, None)
        return False
    with contextlib.suppress(FileNotFoundError):
        path_of(run_root, generation.number).unlink()
    with contextlib.suppress(OSError):
        folder(run_root).rmdir()
    return True


def new_token() -> str:
    return secrets.token_hex(8)


def submission(by: str, token: str) -> Generation:
    """A submission's generation, before its sbatch (`take` numbers it)."""
    return Generation(0, SUBMIT, by, token=token)


def claim_submission(run_root: Path, by: str, token: str, after: int | None = None) -> Generation:
    """A submission's generation taken on the run's newest (or `after`, the one the caller based
    its decision on). Raises Superseded when another act came first, and when the newest is a
    submission still waiting for its sbatch's answer (another actor submitting right now)."""
    if after is None:
        current = newest(run_root)
        if current is not None and current.kind == SUBMIT and pending(current):
            raise Superseded(current.number - 1, current)
        after = current.number if current else 0
    return take(run_root, after, submission(by, token))


def pending(generation: Generation, now: float | None = None) -> bool:
    """A submission whose sbatch has not answered yet (and not for so long that its submitter
    must have died)."""
    now = time.time() if now is None else now
    return (
        generation.kind == SUBMIT
        and generation.job_id is None
        and not generation.abandoned
        and now - generation.time < PENDING_SUBMIT_S
    )


def dead(generation: Generation, now: float | None = None) -> bool:
    """A submission that queued nothing: abandoned (sbatch refused it, and someone acted after
    it), or named no job long after it was taken (its submitter died, or its sbatch never
    answered). It decides nothing: acts are judged by the generation before it."""
    unnamed = generation.kind == SUBMIT and generation.job_id is None
    return unnamed and (generation.abandoned or not pending(generation, now))


def standing(run_root: Path) -> Generation | None:
    """The newest generation that decides who owns the run: the newest, past the dead
    submissions above it (None: none). A new act is still numbered after the newest."""
    for number in reversed(numbers(run_root)):
        found = read(run_root, number) or Generation(number, "unknown", "unknown")
        if not dead(found):
            return found
    return None


def basis(run_root: Path, job_ids: Iterable[str]) -> Generation | None:
    """The generation an act on the job (any of `job_ids`) is based on (its new generation comes
    after it): the newest, when the act that decides (`standing`: past submissions that queued
    nothing) is that job's (its life, its requeue, the submission that queued it); None for a run
    dir without generations. Raises Superseded when it is another job's, or when the newest is a
    submission whose sbatch has not answered yet (another actor submitting right now)."""
    current = newest(run_root)
    if current is None:
        return None
    if pending(current):
        raise Superseded(current.number - 1, current)
    deciding = standing(run_root)
    if deciding is not None and not deciding.names_job(job_ids):
        raise Superseded(current.number - 1, deciding)
    return current
