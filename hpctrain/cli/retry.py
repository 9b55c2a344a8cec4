"""hpctrain-submit --retry: resubmit the points of a sweep that ended without finishing.

    hpctrain-submit --retry runs/multirun/2026-11-23/12-00-00             # every unfinished point
    hpctrain-submit --retry runs/multirun/2026-11-23/12-00-00 3 7         # only these points
    hpctrain-submit --retry --dry-run runs/multirun/2026-11-23/12-00-00   # which, and why; queue nothing

Each point is submitted again into its own run dir with its own job.sbatch, so it resumes from
its newest checkpoint with the config and code it was first submitted with, and gets a new
restart budget window (a `retry` event). Which points are taken: see hpctrain/sweep/pick.py.
Exit 0 when done or nothing needs a retry, 1 when sbatch refused (nothing then stays queued), 2
for a sweep or point that does not exist or a run dir that cannot be submitted again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.cli.sweep_choice import choose
from hpctrain.errors import UserError
from hpctrain.run.exitcodes import CLI_OK, CLI_REFUSED, CLI_USER_ERROR
from hpctrain.slurm.jobid import split as split_job_id
from hpctrain.submit import sbatch
from hpctrain.sweep.points import PointError
from hpctrain.sweep.retry import resubmit, resume_step


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="hpctrain-submit --retry",
        description="Resubmit a sweep's points whose jobs ended without finishing; each resumes in its own run dir.",
    )
    parse.add_argument("target", type=Path, metavar="SWEEP_DIR", help="a sweep dir (hpctrain-submit -m) or one run dir")
    parse.add_argument(
        "points", nargs="*", metavar="POINT", help="only these points: names (`3`) or paths (default: all)"
    )
    parse.add_argument("--dry-run", action="store_true", help="list what it would resubmit and why; queue nothing")
    return parse


def _resumes(run: Path) -> str:
    step = resume_step(run)
    return f"resumes from step {step}" if step is not None else "starts from step 0 (no checkpoint yet)"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    chosen = choose(args.target, args.points, retry=True)
    if isinstance(chosen, int):
        return chosen
    if not chosen:
        print("nothing to retry")
        return CLI_OK
    if args.dry_run:
        for verdict in chosen:
            print(f"would retry {verdict.point.name}: {verdict.why}; {_resumes(verdict.point.run)}")
        print("dry run: nothing queued")
        return CLI_OK
    try:
        retried = resubmit(chosen)
    except (PointError, UserError) as error:
        print(f"error: {error}; nothing was queued", file=sys.stderr)
        return CLI_USER_ERROR
    except sbatch.SbatchError as error:
        print(f"error: {error}", file=sys.stderr)
        if not error.maybe_queued:
            print("nothing was queued; every run dir is as it was", file=sys.stderr)
        return CLI_REFUSED
    queued: set[str] = set()
    for done in retried:
        point = done.verdict.point
        job, task = split_job_id(done.job_id)
        if job not in queued:  # once per sbatch: a job, or an array of several points
            queued.add(job)
            print(f"Submitted batch job {job}")
        print(f"  run dir: {point.run}" + ("" if task is None else f" (job {done.job_id})"))
        print(f"  retry of point {point.name}: {done.verdict.why}; {_resumes(point.run)}")
    return CLI_OK


if __name__ == "__main__":
    sys.exit(main())
