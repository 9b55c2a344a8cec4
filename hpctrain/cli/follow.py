"""hpctrain-follow RUN_DIR: stream a submitted job's log until it ends, then print its result.

Exit code 0 when the run finished (a `finish` event), 1 when the job ended without one (or Slurm's
commands cannot run here). A controller that does not answer (a restart) ends nothing: the job
is followed on, and the silence said once.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.events import Finish, read_events
from hpctrain.run.paths import RunDir
from hpctrain.slurm import client
from hpctrain.slurm.client import Kind, Purpose
from hpctrain.slurm.states import ENDED_STATES


@dataclass(frozen=True)
class Seen:
    state: str | None  # Slurm's word; None: Slurm answered that it does not know the job
    silence: str | None = None  # set: no answer (why), the state is unknown
    cannot_ask: bool = False  # Slurm's commands cannot run here


def job_state(job_id: str) -> Seen:
    """The job's state from squeue (queued or running), else scontrol (recently ended)."""
    queued = client.job_state(job_id, Purpose.LOOK)
    if queued.value is not None:
        return Seen(queued.value)
    if not queued.answered:  # "Invalid job id specified" is an answer: not queued
        return Seen(None, queued.why(), queued.kind is Kind.MISSING)
    shown = client.show_job(job_id, Purpose.LOOK)
    if not shown.answered:
        return Seen(None, shown.why(), shown.kind is Kind.MISSING)
    return Seen(shown.value.state if shown.value else None)


def finished(run: RunDir) -> dict | None:
    ends = [e for e in read_events(run.events) if isinstance(e, Finish)]
    return ends[-1].to_record() if ends else None


def _stream(run: RunDir, offsets: dict[Path, int], out) -> None:
    """What the job's output files gained since the last call."""
    for log in run.slurm_outputs():
        with open(log, "rb") as file:
            file.seek(offsets.get(log, 0))
            chunk = file.read()
            offsets[log] = file.tell()
        out.write(chunk.decode(errors="replace"))
    out.flush()


def follow(run_dir: Path, poll_s: float = 1.0, out=sys.stdout) -> int:
    run = RunDir(run_dir)
    job_id = run.submitted_job_id() or ""
    offsets: dict[Path, int] = {}
    state: str | None = None
    silence: str | None = None
    while True:
        _stream(run, offsets, out)
        # A refused requeue goes on in a new job (submission.json names it): follow that one.
        job_id = run.submitted_job_id() or job_id
        seen = job_state(job_id)
        if seen.cannot_ask:
            print(f"hpctrain-follow: {seen.silence}; follow the job where Slurm's commands run", file=sys.stderr)
            return 1
        if seen.silence is not None:
            if silence is None:
                print(f"hpctrain-follow: Slurm gives no answer ({seen.silence}); still following", file=sys.stderr)
            silence = seen.silence
            time.sleep(poll_s)
            continue
        silence = None
        if seen.state != state:
            print(f"hpctrain-follow: job {job_id} {seen.state or 'is gone from Slurm'}", file=sys.stderr)
            state = seen.state
        if finished(run) and state not in ("RUNNING", "COMPLETING"):
            break
        if state in ENDED_STATES or state is None:
            break
        time.sleep(poll_s)
    end = finished(run)
    if not end:
        ended = f"ended ({state})" if state else "is gone from Slurm"
        print(f"hpctrain-follow: job {job_id} {ended} without finishing; see {run_dir}", file=sys.stderr)
        return 1
    shown = ", ".join(f"{k} {end[k]:.4f}" for k in ("eval_accuracy", "eval_loss", "loss") if end.get(k) is not None)
    print(f"hpctrain-follow: job {job_id} finished at step {end.get('step')}: {shown}")
    return 0


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="hpctrain-follow", description="Stream a submitted run's log until the job ends."
    )
    parse.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run dir written by hpctrain-submit")
    return parse


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if RunDir(args.run_dir).submitted_job_id() is None:
        sys.exit(f"error: {args.run_dir} holds no submission.json: was it submitted with hpctrain-submit?")
    sys.exit(follow(args.run_dir))


if __name__ == "__main__":
    main()
