"""Fault points: named moments in hpctrain's code where a test makes a process die, stop or wait.

A fault that matters lands at the worst moment (between a checkpoint's two renames, during the
import of torch, inside the requeue), and a test can only prove recovery from it if it can put
the fault exactly there. `point("checkpoint.between_renames")` marks such a moment; the
environment variable HPCTRAIN_FAULT_POINTS arms it:

    HPCTRAIN_FAULT_POINTS="checkpoint.between_renames=kill"
    HPCTRAIN_FAULT_POINTS="worker.after_imports=sleep:30,trainer.step=stop@40"

    kill        SIGKILL this process: nothing after it runs (no handler, no `finally`)
    stop        SIGSTOP this process: it stops answering without exiting (a silent node)
    term        SIGTERM this process (a signal at exactly this moment)
    signal:NAME that signal to this process (signal:USR2: the time-limit warning)
    sleep:S     wait S seconds, then go on
    gate:S      write NAME.reached in $HPCTRAIN_FAULT_GATES, then wait until the test writes
                NAME.open there (at most S seconds): the test acts while the process is held
                exactly here, however slow the machine is; `$VAR`s in the folder are the
                process's own (`.../gates/$SLURM_ARRAY_TASK_ID`: one folder per array task)
    exit:N      leave at once with exit code N (os._exit: no cleanup)

A point fires once per process, the first time it is reached, unless its action ends in `@K`
(`kill@3`: the third time), and in every training process, unless `#R` names one global rank
(`stop#1`: rank 1 alone, a peer that stops answering while the others go on). Unarmed (the
variable unset, as in every normal run) a point is one dictionary lookup. The points are listed
in POINTS; arming an unknown name is refused, so a test cannot arm a point that no longer exists
and pass without its fault.

In a Slurm job a point fires in the job's first life only, or in the life `/L` names
(`kill@40/2`: the 40th step of the second life, SLURM_RESTART_COUNT 1): a requeued job runs
every process again with the same environment, and a fault that fired in every life would
loop until a budget ran out. A job submitted again (a guardian's, a refused requeue's) is
submitted without the variable (hpctrain.submit.outside_job).

The batch script's own points (`batch.*`) are reached through `python -m hpctrain.faults NAME
PID` (only when the variable is set), which acts on the batch shell (PID) instead of itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV = "HPCTRAIN_FAULT_POINTS"
GATES_ENV = "HPCTRAIN_FAULT_GATES"  # the folder of gate:S's NAME.reached and NAME.open files
GATE_POLL_S = 0.05

# Every point in the code, and the moment it marks.
POINTS = {
    "batch.before_begin": "the batch script started, its `control begin` not run yet",
    "batch.setup": "the batch script about to run slurm.setup's lines",
    "batch.before_launch": "the batch script about to srun a training step (each launch of the life)",
    "batch.before_requeue": "the step ended and `requeue` was decided, not asked of Slurm yet",
    "control.after_step": "the control step judging an ended step, nothing decided yet",
    "control.requeue_asked": "`scontrol requeue` accepted, ExcNodeList not set yet",
    "train.before_launch": "`hpctrain-train` has its config, its ranks (or its own training) not started",
    "worker.before_imports": "`python -m hpctrain.worker` started, torch not imported yet",
    "worker.after_imports": "torch and the trainer imported, the config not read yet",
    "worker.before_rendezvous": "the stop handlers installed, the process group not joined yet",
    "trainer.resume_loading": (
        "the newest usable checkpoint read, the weights loaded, the rest of its state not yet applied"
        " (nothing journaled)"
    ),
    "trainer.step": "an optimizer step done (@K: the K-th of this process), not yet logged, voted or saved",
    "checkpoint.periodic_in_flight": "a periodic checkpoint's first bytes written, its .pt.tmp incomplete",
    "checkpoint.forced_in_flight": "a stop's forced save: its first bytes written, its .pt.tmp incomplete",
    "checkpoint.between_renames": "a checkpoint's .pt renamed into place, its .json not yet",
    "batch.after_requeue": "`scontrol requeue` accepted and ExcNodeList set; the shell not yet exited",
    "guardian.before_look": "the guardian started (its job ended not ok), Slurm's record not read yet",
    "guardian.before_claim": "the guardian decided to submit the run again; its generation not taken yet",
    "guardian.before_sbatch": "the guardian's generation taken; its sbatch not run yet",
    "watch.before_step_kill": "the heartbeat watcher heard a node fall silent; the step's kill not asked yet",
    "keeper.before_sbatch": "the keeper decided to submit the run again without the silent batch host; sbatch not run",
}


@dataclass(frozen=True)
class Armed:
    action: str  # kill, stop, term, signal, sleep, gate, exit
    value: float = 0.0  # sleep's seconds, exit's code, signal's number
    on_hit: int = 1  # fire the K-th time the point is reached
    life: int = 1  # only in this life of a Slurm job (SLURM_RESTART_COUNT life-1; 1 outside Slurm)
    rank: int | None = None  # only in the training process of this global rank (None: every one)


def parse(text: str) -> dict[str, Armed]:
    """`name=action[:value][@K][/L][#R],...`; ValueError naming what is wrong."""
    armed: dict[str, Armed] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, spec = item.partition("=")
        if not sep or name not in POINTS:
            known = ", ".join(sorted(POINTS))
            raise ValueError(f"{ENV}: {item!r} is not NAME=ACTION with a known point ({known})")
        spec, _, rank = spec.partition("#")
        spec, _, life = spec.partition("/")
        spec, _, hit = spec.partition("@")
        if hit and name.startswith("batch."):
            raise ValueError(
                f"{ENV}: {item!r}: the batch script reaches its points once per life; name the life with /L"
            )
        if rank and name.startswith(("batch.", "control.")):
            raise ValueError(f"{ENV}: {item!r}: #R names a training process; the batch script has no rank")
        action, _, value = spec.partition(":")
        valued = ("sleep", "exit", "signal", "gate")
        if action not in ("kill", "stop", "term", *valued) or (action in valued) != bool(value):
            raise ValueError(
                f"{ENV}: {item!r}: the action is kill, stop, term, signal:NAME, sleep:SECONDS, gate:SECONDS "
                "or exit:CODE"
            )
        if action == "gate" and not os.environ.get(GATES_ENV):
            raise ValueError(f"{ENV}: {item!r}: a gate needs {GATES_ENV}, the folder its files go in")
        if action == "signal":
            number = getattr(signal, f"SIG{value}", None)
            if not isinstance(number, signal.Signals):
                raise ValueError(f"{ENV}: {item!r}: {value!r} is not a signal name (TERM, USR2, ...)")
            value = str(int(number))
        try:
            armed[name] = Armed(action, float(value or 0), int(hit or 1), int(life or 1), int(rank) if rank else None)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r}: SECONDS, CODE, @K, /L and #R are numbers") from None
    return armed


def life_of(environ: Mapping[str, str]) -> int:
    """This process's life of its Slurm job: 1, then 2 after the first requeue (1 outside Slurm)."""
    return int(environ.get("SLURM_RESTART_COUNT") or 0) + 1


def _from_env(environ: Mapping[str, str]) -> dict[str, Armed]:
    """The points armed for this life; the others are left out, so they cost what unarmed ones do."""
    text = environ.get(ENV, "")
    life = life_of(environ)
    return {name: armed for name, armed in (parse(text) if text else {}).items() if armed.life == life}


_armed = _from_env(os.environ)
_hits: dict[str, int] = {}
_rank: int | None = None  # set_rank's, once the process knows its place


def set_rank(rank: int) -> None:
    """This training process's global rank, for the points armed with `#R`: a process spawned by
    the local launcher has no rank in its environment."""
    global _rank
    _rank = rank


def rank_of(environ: Mapping[str, str]) -> int | None:
    """The global rank a point armed with `#R` compares: set_rank's, else srun's or torchrun's."""
    if _rank is not None:
        return _rank
    text = environ.get("SLURM_PROCID") or environ.get("RANK")
    return int(text) if text and text.isdigit() else None


def point(name: str, target: int | None = None) -> None:
    """The moment `name` (one of POINTS): act if armed, else nothing. `target`: the process a
    signal goes to (the batch shell for `python -m hpctrain.faults`), else this one."""
    armed = _armed.get(name)
    if armed is None or (armed.rank is not None and armed.rank != rank_of(os.environ)):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != armed.on_hit:
        return
    if armed.action == "sleep":
        time.sleep(armed.value)
    elif armed.action == "gate":
        hold_at_gate(name, armed.value)
    elif armed.action == "exit":
        os._exit(int(armed.value))
    elif target is None and armed.action in ("kill", "stop"):
        # To this thread, not the process: a process-directed SIGSTOP is taken by the main thread
        # when it next runs, and on a loaded machine a writer thread that sent it went on to write
        # its .json first (seen in CI). A thread-directed one is taken before this call returns.
        signal.pthread_kill(threading.get_ident(), signal.SIGKILL if armed.action == "kill" else signal.SIGSTOP)
    else:
        # term and signal:NAME go to the process: its Python handlers run in the main thread,
        # which a process-directed signal interrupts in a blocking call.
        named = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
        os.kill(os.getpid() if target is None else target, named.get(armed.action) or int(armed.value))


def gate_files(folder: Path, name: str) -> tuple[Path, Path]:
    """(NAME.reached, NAME.open) of a gate in `folder`: the process writes the first, the test
    the second."""
    return folder / f"{name}.reached", folder / f"{name}.open"


def hold_at_gate(name: str, timeout_s: float) -> None:
    reached, opened = gate_files(Path(os.path.expandvars(os.environ[GATES_ENV])), name)
    reached.parent.mkdir(parents=True, exist_ok=True)
    tmp = reached.with_suffix(f".{os.getpid()}.tmp")  # every rank of a world may reach it at once
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(reached)  # whole or absent: the test may read it at any moment
    deadline = time.monotonic() + timeout_s
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(GATE_POLL_S)


def main(argv: list[str]) -> int:
    """`python -m hpctrain.faults NAME PID`: the batch shell's point NAME, acting on PID."""
    name, target = argv[0], int(argv[1])
    if name not in POINTS:
        print(f"hpctrain.faults: {name!r} is not a fault point", file=sys.stderr)
        return 2
    point(name, target)  # each life runs the script, and reaches each of its points, once
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
