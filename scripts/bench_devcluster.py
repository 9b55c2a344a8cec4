#!/usr/bin/env python3
"""How long `devcluster.py up` takes from a stopped cluster, with and without accounting.

    python scripts/bench_devcluster.py --dir D --port-base P [--repeats 5] [--nodes 3]

Each round times three starts in rotated order (the machine is noisy, so no kind always goes
first): without accounting (the baseline), with accounting reusing the MariaDB data dir (what
every `up` after the first does), and with accounting from an empty data dir (the first `up`).
Every start is preceded by a `down`. Prints median and p90 per kind and the ratio of medians to
the baseline. Needs root, like devcluster.py. Stops the cluster at the end.
"""

import argparse
import importlib.util
import shutil
import statistics
import time
from pathlib import Path
from types import ModuleType

KINDS = ("no-accounting", "accounting", "accounting-fresh-db")


def load_devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster", Path(__file__).with_name("devcluster.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_up(devcluster: ModuleType, kind: str, args: argparse.Namespace) -> float:
    devcluster.stop(args.dir)
    if kind == "accounting-fresh-db":
        shutil.rmtree(Path(args.dir) / "db", ignore_errors=True)
    started = time.monotonic()
    devcluster.ensure_cluster(
        args.nodes, 0, args.dir, port_base=args.port_base, with_accounting=kind != "no-accounting"
    )
    return time.monotonic() - started


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--port-base", type=int, required=True)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    devcluster = load_devcluster()
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        for round_index in range(args.repeats):
            shift = round_index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                times[kind].append(time_up(devcluster, kind, args))
    finally:
        devcluster.stop(args.dir)
    baseline = statistics.median(times["no-accounting"])
    print(f"`up` of {args.nodes} nodes from a stopped cluster, {args.repeats} rounds, rotated order")
    for kind in KINDS:
        median = statistics.median(times[kind])
        print(f"{kind:22s} median {median:5.2f} s  p90 {p90(times[kind]):5.2f} s  x{median / baseline:4.2f}")


if __name__ == "__main__":
    main()
