#!/usr/bin/env python3
"""A real Slurm cluster on one machine, for development and for the test suite.

Everything lives in one directory (default /tmp/hpctrain-devcluster): slurm.conf,
gres.conf, state, spool, pid files and logs.  Nothing is written to /etc/slurm;
every Slurm command finds the cluster through the SLURM_CONF environment variable.

    python scripts/devcluster.py up [--nodes 3] [--gpus-per-node 2] [--cpus-per-node 2]
                                    [--dir D] [--port-base 16817] [--no-accounting]
                                    [--min-job-age 300]
    python scripts/devcluster.py down   [--dir D]
    python scripts/devcluster.py freeze NODE [--dir D]   # NODE dies silently (devcluster_freeze.py)
    python scripts/devcluster.py thaw NODE [--dir D]
    python scripts/devcluster.py status [--dir D]
    eval "$(python scripts/devcluster.py env [--dir D])"

Layout of the fake cluster:
  * one slurmctld and N slurmd (node1..nodeN), all on this host, each slurmd on its
    own port (port-base+1 .. port-base+N), the controller on port-base;
  * G fake GPUs per node, exposed as gres backed by /dev/fakegpu0.. (character
    devices that behave like /dev/null), so Slurm sets CUDA_VISIBLE_DEVICES;
  * two partitions over the same nodes: `batch` (default, preemptible: REQUEUE after
    a 20 s grace time) and `urgent` (high priority tier, never preempted);
  * strict like a site: each task pinned to its CPUs (TaskPlugin=task/affinity), and
    accounting (slurmdbd on port-base+20, its own MariaDB on port-base+21, both started
    from this directory; see devcluster_accounting.py), so `sacct` answers.
    `--no-accounting` leaves accounting out: the path of the many small sites without it.

Tests import `ensure_cluster()` from this file (via importlib) to get a running
cluster and the environment that points at it.  This file is the command line and that
API; the work is in its siblings, each of one concern: devcluster_host.py (what every
cluster on the machine shares: packages, munged, fake GPUs), devcluster_config.py (the
shape and slurm.conf), devcluster_daemons.py (the daemons in /proc, and the nodes'
states), devcluster_lifecycle.py (up, down, freeze), devcluster_accounting.py and
devcluster_freeze.py.

Needs root (it installs slurm-wlm, munge, and for accounting mariadb-server and slurmdbd
with apt-get, and starts daemons).
Python 3.11, standard library only.
"""

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType


def _load_sibling(name: str) -> ModuleType:
    """A sibling module, found by path (tests load this file by path too, not as a package), loaded
    once: registered under its own name, so the siblings' imports of each other find it, and a
    second load of this file shares its classes (a Shape read back equals the Shape asked for)."""
    if name in sys.modules:
        return sys.modules[name]
    location = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, location)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# In the order they import each other.
for _sibling in (
    "devcluster_accounting",
    "devcluster_freeze",
    "devcluster_host",
    "devcluster_config",
    "devcluster_daemons",
    "devcluster_lifecycle",
):
    _load_sibling(_sibling)

import devcluster_accounting as accounting  # noqa: E402
from devcluster_config import Paths, Shape, read_shape, render_gres_conf, render_slurm_conf  # noqa: E402
from devcluster_daemons import cluster_pids, controller_responds, node_states, nodes_healthy  # noqa: E402
from devcluster_host import DevClusterError, log, require_root, run_cmd, slurm_env  # noqa: E402
from devcluster_lifecycle import (  # noqa: E402
    check_ports_free,
    cluster_ports,
    freeze_node,
    locked,
    stop_cluster,
    thaw_node,
    up,
)

# What tests and scripts use of this file, besides ensure_cluster and stop.
__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PORT_BASE",
    "DevClusterError",
    "Paths",
    "Shape",
    "accounting",
    "check_ports_free",
    "cluster_pids",
    "cluster_ports",
    "ensure_cluster",
    "freeze_node",
    "render_gres_conf",
    "render_slurm_conf",
    "slurm_env",
    "stop",
    "thaw_node",
]

DEFAULT_DIR = "/tmp/hpctrain-devcluster"

DEFAULT_PORT_BASE = 16817


def resolve_port_base(directory: str, port_base: int | None) -> int:
    """An explicit port base wins; else keep the one of the cluster in `directory`
    (so `up --dir D` does not restart a cluster started with another --port-base);
    else the default."""
    if port_base is not None:
        return port_base
    previous = read_shape(Paths(Path(directory).absolute()))
    return previous.port_base if previous else DEFAULT_PORT_BASE


# --------------------------------------------------------------------------- public API


def ensure_cluster(
    nodes: int,
    gpus_per_node: int,
    directory: str,
    *,
    cpus_per_node: int = 2,
    port_base: int | None = None,
    with_accounting: bool = True,
    min_job_age_s: int = 300,
    max_array_size: int | None = None,
    enforce_limits: bool = False,
    slurmd_timeout_s: int = 10,
    pin_cpus: bool = True,
    max_job_count: int | None = None,
) -> dict[str, str]:
    """Start (or reuse) a cluster and return the environment that points at it.

    Returns {"SLURM_CONF": "<directory>/slurm.conf"}; merge it into os.environ (or a
    subprocess env) before calling sbatch/srun/squeue.  Reuses a healthy cluster of
    the same shape; restarts one of another shape.  Raises DevClusterError.
    """
    port = resolve_port_base(directory, port_base)
    shape = Shape(
        nodes,
        gpus_per_node,
        cpus_per_node,
        port,
        with_accounting,
        min_job_age_s,
        max_array_size,
        enforce_limits,
        slurmd_timeout_s,
        pin_cpus,
        max_job_count,
    )
    return up(shape, directory)


def stop(directory: str) -> bool:
    """Stop the cluster started from `directory`; True when something was running."""
    require_root()
    paths = Paths(Path(directory).absolute())
    if not paths.root.is_dir():
        return False
    with locked(paths):
        return stop_cluster(paths)


# --------------------------------------------------------------------------- CLI


def cmd_up(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.gpus_per_node < 0 or args.cpus_per_node < 1 or args.min_job_age < 2:
        raise DevClusterError("need --nodes >= 1, --cpus-per-node >= 1, --gpus-per-node >= 0, --min-job-age >= 2", 2)
    env = ensure_cluster(
        args.nodes,
        args.gpus_per_node,
        args.dir,
        cpus_per_node=args.cpus_per_node,
        port_base=args.port_base,
        with_accounting=not args.no_accounting,
        min_job_age_s=args.min_job_age,
        max_array_size=args.max_array_size,
        enforce_limits=args.enforce_limits,
        slurmd_timeout_s=args.slurmd_timeout,
        max_job_count=args.max_job_count,
    )
    print(f"export SLURM_CONF={shlex.quote(env['SLURM_CONF'])}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if stop(args.dir):
        log(f"stopped the cluster in {Path(args.dir).absolute()}")
    else:
        log(f"nothing running from {Path(args.dir).absolute()}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    paths = Paths(Path(args.dir).absolute())
    if not controller_responds(paths):
        print(f"devcluster in {paths.root}: down")
        return 1
    env = slurm_env(paths)
    for command in (["sinfo"], ["squeue"]):
        result = run_cmd(command, env=env)
        print(result.stdout, end="")
        if result.returncode != 0:
            print(result.stderr, end="", file=sys.stderr)
            return 1
    shape = read_shape(paths)
    if shape and not nodes_healthy(node_states(paths), shape, idle_only=False):
        log("warning: some nodes are not in a working state (see sinfo above)")
    return 0


def cmd_freeze(args: argparse.Namespace) -> int:
    frozen = freeze_node(args.dir, args.node)
    log(f"{args.node}: {len(frozen)} processes stopped (slurmd, its step daemons, their tasks)")
    return 0


def cmd_thaw(args: argparse.Namespace) -> int:
    continued = thaw_node(args.dir, args.node)
    log(f"{args.node}: {len(continued)} processes continued")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    conf = Path(args.dir).absolute() / "slurm.conf"
    if not conf.exists():
        log(f"warning: {conf} does not exist yet; run `up` first")
    print(f"export SLURM_CONF={shlex.quote(str(conf))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devcluster.py",
        description="A real Slurm cluster (slurmctld + N slurmd, fake GPUs) on this machine.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add_dir(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"directory holding the cluster's config/state (default {DEFAULT_DIR})"
        )

    p_up = commands.add_parser("up", help="install Slurm if needed and start the cluster")
    p_up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p_up.add_argument("--gpus-per-node", type=int, default=2, help="fake GPUs per node (default 2)")
    p_up.add_argument("--cpus-per-node", type=int, default=2, help="CPUs per node (default 2)")
    add_dir(p_up)
    p_up.add_argument(
        "--port-base",
        type=int,
        default=None,
        help=f"slurmctld port; nodes use the next N ports (default: the port of the "
        f"cluster already in --dir, else {DEFAULT_PORT_BASE})",
    )
    p_up.add_argument(
        "--no-accounting",
        action="store_true",
        help="no slurmdbd/MariaDB: sacct answers 'accounting storage is disabled', as on many small sites",
    )
    p_up.add_argument(
        "--min-job-age",
        type=int,
        default=300,
        help="seconds slurmctld keeps an ended job for scontrol (MinJobAge; default 300, Slurm's minimum 2)",
    )
    p_up.add_argument(
        "--max-array-size",
        type=int,
        default=None,
        help="MaxArraySize: job array task ids 0..N-1 (default: Slurm's 1001)",
    )
    p_up.add_argument(
        "--max-job-count",
        type=int,
        default=None,
        help="MaxJobCount: job records slurmctld holds, ended ones for MinJobAge (default: Slurm's 10000)",
    )
    p_up.add_argument(
        "--enforce-limits",
        action="store_true",
        help="AccountingStorageEnforce=associations,limits: sacctmgr's MaxSubmitJobs/MaxJobs apply (needs accounting)",
    )
    p_up.add_argument(
        "--slurmd-timeout",
        type=int,
        default=10,
        help="SlurmdTimeout: seconds before a silent node is marked DOWN (default 10; Slurm's own is 300)",
    )
    p_up.set_defaults(func=cmd_up)

    p_down = commands.add_parser("down", help="stop the daemons started from --dir")
    add_dir(p_down)
    p_down.set_defaults(func=cmd_down)

    p_status = commands.add_parser("status", help="show sinfo and squeue; exit 1 if down")
    add_dir(p_status)
    p_status.set_defaults(func=cmd_status)

    for name, action, func in (
        ("freeze", "stop every process of NODE, as a node that dies silently", cmd_freeze),
        ("thaw", "continue the processes `freeze` stopped on NODE", cmd_thaw),
    ):
        sub = commands.add_parser(name, help=action)
        sub.add_argument("node", help="the node (node1, node2, ...)")
        add_dir(sub)
        sub.set_defaults(func=func)

    p_env = commands.add_parser("env", help="print `export SLURM_CONF=...` for eval")
    add_dir(p_env)
    p_env.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DevClusterError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
