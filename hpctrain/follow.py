"""hpctrain-follow RUN_DIR: stream a submitted job's log until it ends, then print its result.

Exit code 0 when the run finished (a `finish` event), 1 when the job ended without one.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.run.events import Finish, read_events
from hpctrain.run.paths import RunDir

# Slurm states after which the job will not run again by itself.
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def job_state(job_id: str) -> str | None:
    """The job's state from squeue (queued or running), else scontrol (recently ended)."""
    if shutil.which("squeue") is None:
        return None
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[0]
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    for field in done.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def finished(run: RunDir) -> dict | None:
    ends = [e for e in read_events(run.events) if isinstance(e, Finish)]
    return ends[-1].to_record() if ends else None


def follow(run_dir: Path, poll_s: float = 1.0, out=sys.stdout) -> int:
    run = RunDir(run_dir)
    job_id = run.submitted_job_id() or ""
    offsets: dict[Path, int] = {}
    state = None
    while True:
        for log in RunDir(run_dir).slurm_outputs():
            with open(log, "rb") as file:
                file.seek(offsets.get(log, 0))
                chunk = file.read()
                offsets[log] = file.tell()
            out.write(chunk.decode(errors="replace"))
        out.flush()
        # A refused requeue goes on in a new job (submission.json names it): follow that one.
        job_id = run.submitted_job_id() or job_id
        new_state = job_state(job_id)
        if new_state != state:
            print(f"hpctrain-follow: job {job_id} {new_state}", file=sys.stderr)
            state = new_state
        if finished(run) and state not in ("RUNNING", "COMPLETING"):
            break
        if state in _ENDED or state is None:
            break
        time.sleep(poll_s)
    end = finished(run)
    if not end:
        print(f"hpctrain-follow: job {job_id} ended ({state}) without finishing; see {run_dir}", file=sys.stderr)
        return 1
    shown = ", ".join(f"{k} {end[k]:.4f}" for k in ("eval_accuracy", "eval_loss", "loss") if end.get(k) is not None)
    print(f"hpctrain-follow: job {job_id} finished at step {end.get('step')}: {shown}")
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Stream a submitted run's log until the job ends.")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    if RunDir(args.run_dir).submitted_job_id() is None:
        sys.exit(f"error: {args.run_dir} holds no submission.json: was it submitted with hpctrain-submit?")
    sys.exit(follow(args.run_dir))


if __name__ == "__main__":
    main()
