"""hpctrain-status: one row per run, what Slurm and the run's own journal say about it.

    hpctrain-status                        # the recent runs under runs/, most recent first
    hpctrain-status runs/multirun/2024-05-01/12-00-00 runs/2024-05-02/09-30-00
    hpctrain-status --watch 10             # refresh every 10 s until Ctrl-C
    hpctrain-status --json                 # machine-readable rows (goodput, lives and cost included)
    hpctrain-status --detail RUN_DIR       # the run's lives, its goodput and what it cost
    hpctrain-status --plot curves.png      # loss and eval accuracy against step

Exit 0 when no listed run failed, 1 when one did (FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY,
CANCELLED before finishing, or a `failure` event that ended it), 2 for a user's mistake.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hpctrain.config.health import HealthConfig
from hpctrain.config.slurm_file import slurm_settings
from hpctrain.run.events import read_events
from hpctrain.run.exitcodes import CLI_OK, CLI_REFUSED, CLI_USER_ERROR
from hpctrain.run.paths import RunDir
from hpctrain.status import discover
from hpctrain.status.detail import render_detail
from hpctrain.status.diagnosis import diagnosis_lines
from hpctrain.status.goodput import Goodput, goodput_of
from hpctrain.status.plot import PlotUnavailable, draw, require_matplotlib
from hpctrain.status.rows import Row, Status, collect
from hpctrain.status.sweeps import sweep_costs
from hpctrain.status.table import render
from hpctrain.tune.summary import read_summary, render_summary

DEFAULT_WATCH_S = 5.0
# Move to the top left and clear the screen: the table is redrawn in place.
_CLEAR = "\x1b[H\x1b[2J"


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="hpctrain-status",
        description="Where every run stands: job, state, restarts, step, loss, eval accuracy, last checkpoint, "
        "node-hours and GPU-hours (a sweep's total above the table).",
    )
    parse.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="RUN_OR_SWEEP_DIR",
        help=f"run dirs, sweep dirs (all their points) or folders holding runs (default: {discover.DEFAULT_ROOT}/)",
    )
    parse.add_argument(
        "-n",
        "--limit",
        type=int,
        default=discover.DEFAULT_LIMIT,
        help=f"at most this many runs from each folder searched, most recent first; 0 for all "
        f"(default {discover.DEFAULT_LIMIT}; named run and sweep dirs are always shown)",
    )
    parse.add_argument(
        "--watch",
        nargs="?",
        const=str(DEFAULT_WATCH_S),
        default=None,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C",
    )
    parse.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    parse.add_argument(
        "--detail",
        action="store_true",
        help="for each run: its lives (allocated, start-up, kept, stalls, redone), its goodput and its "
        "allocations' node-hours and GPU-hours",
    )
    parse.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw loss and eval accuracy against step (needs the `plot` extra)",
    )
    return parse


def options(argv: list[str] | None) -> argparse.Namespace:
    parse = parser()
    args = parse.parse_args(argv)
    if args.watch is not None:
        # `--watch runs/`: argparse takes the path for SECONDS; it is a path, watched every 5 s.
        try:
            args.watch = float(args.watch)
        except ValueError:
            args.paths.insert(0, Path(args.watch))
            args.watch = DEFAULT_WATCH_S
        if args.watch <= 0:
            parse.error(f"--watch: SECONDS must be > 0 (got {args.watch:g})")
    if args.limit < 0:
        parse.error(f"--limit: must be >= 0 (got {args.limit})")
    return args


def refresh(args: argparse.Namespace) -> Status:
    """Find the runs again (a new run appears in a watched folder) and read them all."""
    return collect(discover.run_dirs(args.paths, args.limit), with_goodput=args.json)


def show(status: Status, args: argparse.Namespace) -> None:
    for note in status.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        # A row of a named sweep carries the sweep's total; the list stays a list of rows.
        of_sweep = {run.resolve(): s.to_json() for s in sweep_costs(args.paths, status.rows) for run in s.runs}
        rows = [{**row.to_json(), "sweep": of_sweep.get(row.run_dir.resolve())} for row in status.rows]
        # Under --watch, one JSON list a line: a reader takes each refresh as it comes.
        print(json.dumps(rows, indent=None if args.watch else 2))
    else:
        show_text(status, args)
    if args.plot is not None:
        draw(status.rows, args.plot)
        print(f"hpctrain-status: loss and eval accuracy against step drawn to {args.plot}", file=sys.stderr)


def show_text(status: Status, args: argparse.Namespace) -> None:
    """The table (or each run's detail), above it the total of each named sweep that has held
    an allocation (a dry-run sweep, or one still queued, has none to tell)."""
    for sweep in sweep_costs(args.paths, status.rows):
        if sweep.cost.allocations:
            print(sweep.header())
    if status.rows and args.detail:
        print("\n\n".join(_detail(row) for row in status.rows))
    elif status.rows:
        print(render(status.rows))
    else:
        print("no runs found")
    studies = [(path, read_summary(path)) for path in args.paths]
    for path, summary in studies:
        if summary is not None:  # a hpctrain-tune sweep dir: its study's counts and best trial
            print()
            print(render_summary(path, summary))


def _detail(row: Row) -> str:
    """The run's lives and goodput, then what its journal says of stragglers and of its end."""
    run = RunDir(row.run_dir)
    try:
        keep_out_after = slurm_settings(run.config).health.keep_out_after_lives
    except (OSError, ValueError):  # no config.yaml, or one this hpctrain cannot read: the default
        keep_out_after = HealthConfig().keep_out_after_lives
    said = diagnosis_lines(read_events(run.events), keep_out_after)
    return "\n".join([render_detail(row, figures_of(row)), *said])


def figures_of(row: Row) -> Goodput:
    """The run's goodput; a running job's last life counts until now."""
    run = RunDir(row.run_dir)
    now = time.time() if row.state.startswith("RUNNING") else None
    return goodput_of(run, now)


def watch(args: argparse.Namespace) -> int:
    clear = sys.stdout.isatty() and not args.json
    code = CLI_OK
    # Ctrl-C (SIGINT) ends the watch however it was started: a shell without job control (a
    # script) starts its `&` commands with SIGINT ignored, and Python then leaves it ignored,
    # so a SIGINT would never end the loop. Set back for a caller in the same process.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            status = refresh(args)
            if clear:
                print(_CLEAR, end="")
            if not args.json:  # into a file or a pipe, each table is told apart by its time
                print(f"hpctrain-status, every {args.watch:g} s, {time.strftime('%H:%M:%S')} (Ctrl-C to stop)\n")
            show(status, args)
            sys.stdout.flush()
            code = CLI_REFUSED if status.any_failed else CLI_OK
            time.sleep(args.watch)
    except KeyboardInterrupt:
        if clear:
            print()
        return code
    finally:
        if before is not None:  # None: set outside Python, nothing to set back
            signal.signal(signal.SIGINT, before)


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    try:
        if args.plot is not None:
            require_matplotlib()
        if args.watch is not None:
            return watch(args)
        status = refresh(args)
        show(status, args)
        return CLI_REFUSED if status.any_failed else CLI_OK
    except (discover.NotARunDir, PlotUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return CLI_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `hpctrain-status | head`: the reader has gone, which is not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLI_OK


if __name__ == "__main__":
    sys.exit(main())
