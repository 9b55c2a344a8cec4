"""hpctrain-cancel: cancel a whole sweep, or chosen points of it, with one scancel.

    hpctrain-cancel runs/multirun/2026-11-23/12-00-00            # every point still queued or running
    hpctrain-cancel runs/multirun/2026-11-23/12-00-00 3 7        # points 3 and 7 (names or paths)
    hpctrain-cancel runs/2026-11-23/10-04-31                     # one run dir
    hpctrain-cancel --dry-run SWEEP_DIR                          # print the scancel, cancel nothing

Each cancelled point gets a `cancelled` event at once (a pending job never runs, so never
records it itself); a point whose job has ended is skipped and said. Resume them later with
`hpctrain-submit --retry SWEEP_DIR`. Exit 0 when done (or nothing to cancel), 1 when scancel
failed, 2 for a sweep or point that does not exist (nothing is cancelled then).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hpctrain.cli.sweep_choice import choose
from hpctrain.run.exitcodes import CLI_OK, CLI_REFUSED
from hpctrain.sweep import cancel


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="hpctrain-cancel",
        description="Cancel a sweep's jobs (all, or the points named) with one scancel; each is recorded as cancelled.",
    )
    parse.add_argument("target", type=Path, metavar="SWEEP_DIR", help="a sweep dir (hpctrain-submit -m) or one run dir")
    parse.add_argument("points", nargs="*", metavar="POINT", help="points to cancel: names or paths (default: all)")
    parse.add_argument("--dry-run", action="store_true", help="print the scancel it would run; cancel nothing")
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    chosen = choose(args.target, args.points, retry=False)
    if isinstance(chosen, int):
        return chosen
    if not chosen:
        print("nothing to cancel")
        return CLI_OK
    if args.dry_run:
        points = [v.point for v in chosen]
        command = cancel.scancel_command([str(p.job_id) for p in points], cancel.guardians_of(points))
        print(f"would run: {shlex.join(command)}")
        for verdict in chosen:
            print(f"would cancel {verdict.point.name}: {verdict.why}")
        return CLI_OK
    try:
        outcome = cancel.cancel([v.point for v in chosen])
    except cancel.ScancelError as error:
        print(f"error: {error}", file=sys.stderr)
        return CLI_REFUSED
    done = {id(p) for p in outcome.cancelled}
    for verdict in chosen:
        if id(verdict.point) in done:
            print(f"cancelled {verdict.point.name}: {verdict.why}")
        else:
            why = outcome.ended.get(str(verdict.point.job_id), "")
            print(f"skipped {verdict.point.name}: job {verdict.point.job_id} ended before the scancel ({why})")
    return CLI_OK


if __name__ == "__main__":
    sys.exit(main())
