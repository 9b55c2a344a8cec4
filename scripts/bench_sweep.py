#!/usr/bin/env python
"""Time until the shell is back: `hpctrain-submit -m` with N points against N bare sbatch calls.

Needs a real Slurm (SLURM_CONF set, e.g. `eval "$(python scripts/devcluster.py up)"`). Every
job is queued held (`--hold`) and cancelled right after its case, so nothing trains. Cases, for
each point count, in rotated order every round (the machine is noisy):

  sbatch 1x    N bare `sbatch --parsable --hold` calls of a rendered hpctrain job script, one at a time
  sbatch 8x    the same, `slurm.submit_parallelism` (8) at a time, as hpctrain-submit calls them
  submit       `hpctrain-submit -m optim.lr=<N values> slurm.extra=[--hold]`: compose, check,
               render, write the run dirs, read the site's limits, queue the sweep as one job
               array (slurm.array), print the ids
  submit jobs  the same with slurm.array=false: one sbatch per point, as before arrays
  prepare      the same with dry_run=true: everything before the first sbatch

After each case its jobs are cancelled and its run dirs removed, then the machine settles
(`os.sync()` and a pause, --settle-s): right after 1000 run dirs were removed, creating the next
1000 took up to twice as long.

Printed: median and p90 seconds per case, ratios against `sbatch 8x` measured in the same run,
and the median CPU seconds of each case's processes (sbatch's own, not slurmctld's). The `submit`
cases count the run dirs printed and the jobs Slurm queued (`squeue -r`: one per point, whether
each point is its own job or a task of a job array) and fail unless every point is there.

    python scripts/bench_sweep.py [--points 100 1000] [--rounds 3] [--cases ...] [overrides ...]

`--cases prepare` needs no Slurm.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PARALLELISM = 8  # slurm.submit_parallelism's default
CASES = ["sbatch 1x", "sbatch 8x", "submit", "submit jobs", "prepare"]
Samples = dict[tuple[int, str], list[float]]  # (points, case) -> one value per round
JOB_ID = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)


def submit_command() -> list[str]:
    """The console script users type, next to this Python (else the module)."""
    script = Path(sys.executable).with_name("hpctrain-submit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpctrain.cli.submit"]


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command[:6])} ...\n{done.stderr[-3000:]}")
    return done.stdout


def sbatch_once(script: Path) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def bare_sbatch(script: Path, count: int, parallelism: int) -> list[str]:
    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        return list(pool.map(lambda _: sbatch_once(script), range(count)))


def cancel(job_ids: list[str]) -> None:
    """scancel in chunks; says so when Slurm refuses (a held job left behind is noticed)."""
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start : start + 500]
        done = subprocess.run(["scancel", *chunk], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"warning: scancel failed: {done.stderr.strip()}", file=sys.stderr)


def queued(job_ids: list[str]) -> int:
    """Jobs Slurm holds for these ids, array tasks one by one (squeue -r)."""
    if not job_ids:
        return 0
    done = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"squeue failed ({done.returncode}): {done.stderr.strip()}")
    return len(done.stdout.split())


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(
    case: str, count: int, work: Path, script: Path, overrides: list[str], settle_s: float
) -> tuple[float, float]:
    """One case: (seconds from start to shell back, CPU seconds of the processes it ran);
    its jobs are cancelled afterwards (not timed)."""
    lrs = ",".join(f"{1e-5 * (i + 1):.6g}" for i in range(count))
    sweep_dir = work / f"sweep-{time.monotonic_ns()}"
    sweep = [*submit_command(), "-m", f"optim.lr={lrs}", f"hydra.sweep.dir={sweep_dir}", *overrides]
    cpu_before, start = children_cpu_s(), time.perf_counter()
    if case == "sbatch 1x":
        job_ids = bare_sbatch(script, count, 1)
    elif case == "sbatch 8x":
        job_ids = bare_sbatch(script, count, PARALLELISM)
    elif case.startswith("submit"):
        jobs = ["slurm.array=false"] if case == "submit jobs" else []
        printed = run([*sweep, "slurm.extra=[--hold]", *jobs], work)
        job_ids = sorted(set(JOB_ID.findall(printed)))  # an array's id cancels all its tasks
        points = printed.count("  run dir: ")
    else:
        run([*sweep, "dry_run=true"], work)
        job_ids = []
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu_before
    if case.startswith("submit") and (points != count or queued(job_ids) != count):
        cancel(job_ids)
        sys.exit(f"hpctrain-submit printed {points} run dirs and queued {queued(job_ids)} jobs for {count} points")
    cancel(job_ids)
    shutil.rmtree(sweep_dir, ignore_errors=True)
    settle(settle_s)
    return elapsed, cpu


def settle(seconds: float) -> None:
    """Not timed: let the file system write back and free what the last case made and removed
    (1000 run dirs), and slurmctld record the cancellations, before the next case starts."""
    os.sync()
    time.sleep(seconds)


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause after each case's cleanup (not timed)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES, help="in this order, rotated every round")
    parser.add_argument("overrides", nargs="*", default=["cluster=devcluster"], help="for every hpctrain-submit")
    args = parser.parse_args()
    cases = args.cases
    if shutil.which("sbatch") is None and cases != ["prepare"]:
        sys.exit("no sbatch on PATH: start a cluster (scripts/devcluster.py up) and set SLURM_CONF")
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        run([*submit_command(), "dry_run=true", f"hydra.run.dir={work / 'one'}", *args.overrides], work)
        script = work / "one" / "job.sbatch"  # what the bare calls queue: a real hpctrain job script
        times: Samples = {}
        cpus: Samples = {}
        for round_index in range(args.rounds):
            for count in args.points:
                shift = round_index % len(cases)
                for case in cases[shift:] + cases[:shift]:
                    seconds, cpu = timed(case, count, work, script, args.overrides, args.settle_s)
                    times.setdefault((count, case), []).append(seconds)
                    cpus.setdefault((count, case), []).append(cpu)
                    print(f"round {round_index + 1} {count:5d} points  {case:10s} {seconds:7.2f}s (CPU {cpu:.2f}s)")
        print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        report(times, cpus, args.points, cases)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(times: Samples, cpus: Samples, counts: list[int], cases: list[str]) -> None:
    """Wall time until the shell is back (median, p90, ratio to `sbatch 8x`), and the median CPU
    time of the processes (a busy machine stretches wall time more than CPU time)."""
    print(f"\n{'points':>6}  {'case':10s} {'median':>8} {'p90':>8}  {'/ sbatch 8x':>11}  {'per point':>9}  {'CPU':>7}")
    for count in counts:
        floor = statistics.median(times[count, "sbatch 8x"]) if (count, "sbatch 8x") in times else float("nan")
        for case in cases:
            median = statistics.median(times[count, case])
            print(
                f"{count:6d}  {case:10s} {median:7.2f}s {p90(times[count, case]):7.2f}s  {median / floor:10.2f}x"
                f"  {1000 * median / count:6.1f} ms  {statistics.median(cpus[count, case]):6.2f}s"
            )


if __name__ == "__main__":
    main()
