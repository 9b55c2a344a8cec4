"""A dev cluster brought up and down (scripts/devcluster.py): its ports checked, its state
cleared, its daemons started until every node is idle, its jobs cancelled and daemons stopped,
a node frozen and thawed; `up` and `down` on one folder one at a time.
"""

import contextlib
import fcntl
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import devcluster_accounting as accounting
import devcluster_freeze as freezing
from devcluster_config import (
    CLUSTER_NAME,
    Paths,
    Shape,
    node_names,
    read_shape,
    render_slurm_conf,
    short_hostname,
    write_config,
)
from devcluster_daemons import cluster_pids, is_up, node_states, nodes_healthy, start_daemon, stop_processes
from devcluster_host import (
    DevClusterError,
    ensure_fake_gpus,
    ensure_installed,
    ensure_munge,
    log,
    machine_locked,
    require_root,
    run_cmd,
    slurm_env,
    tail,
)

# How long `up` waits for every node to report idle before giving up.
STARTUP_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- up


def cluster_ports(shape: Shape) -> list[int]:
    """Controller, nodes, and (with accounting) slurmdbd and MariaDB."""
    ports = list(range(shape.port_base, shape.port_base + shape.nodes + 1))
    return ports + (list(accounting.ports(shape.port_base)) if shape.accounting else [])


def check_ports_free(shape: Shape) -> None:
    """Fail early, and plainly, when another cluster (or anything) holds our ports."""
    for port in cluster_ports(shape):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                raise DevClusterError(
                    f"port {port} is in use (another devcluster?); "
                    f"pick another --port-base (the cluster uses {describe_ports(shape)})"
                ) from None


def clear_state(paths: Paths) -> None:
    """Forget jobs and logs of an earlier cluster in this directory: start clean."""
    for directory in (paths.state, paths.spool, paths.run, paths.log):
        shutil.rmtree(directory, ignore_errors=True)


def wait_until_idle(shape: Shape, paths: Paths, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] | None = None
    while time.monotonic() < deadline:
        states = node_states(paths)
        if nodes_healthy(states, shape, idle_only=True):
            return
        time.sleep(0.5)
    logs = [f"--- {paths.ctld_log} (tail) ---\n{tail(paths.ctld_log)}"]
    for node in node_names(shape.nodes):
        logs.append(f"--- {paths.slurmd_log(node)} (tail) ---\n{tail(paths.slurmd_log(node))}")
    raise DevClusterError(f"nodes not idle after {timeout:.0f}s (sinfo: {states}).\n" + "\n".join(logs))


def start_cluster(shape: Shape, paths: Paths) -> None:
    clear_state(paths)
    write_config(shape, paths)
    check_ports_free(shape)
    ensure_fake_gpus(shape.gpus_per_node)
    if shape.accounting:
        _start_accounting(shape, paths)
    conf = str(paths.conf)
    log(f"starting slurmctld on port {shape.port_base}")
    # -c: start from a clean state, ignoring jobs a previous controller saved.
    start_daemon(["slurmctld", "-c", "-f", conf], paths, "slurmctld.stderr")
    for node in node_names(shape.nodes):
        start_daemon(["slurmd", "-N", node, "-f", conf], paths, f"slurmd-{node}.stderr")
    log(f"started {shape.nodes} slurmd; waiting for the nodes to become idle")
    wait_until_idle(shape, paths, STARTUP_TIMEOUT_S)


def _start_accounting(shape: Shape, paths: Paths) -> None:
    dbd_port, db_port = accounting.ports(shape.port_base)
    log(f"starting MariaDB on port {db_port} and slurmdbd on port {dbd_port}")
    try:
        accounting.start(paths.root, shape.port_base, CLUSTER_NAME, slurm_env(paths))
    except accounting.AccountingError as error:
        raise DevClusterError(
            f"accounting did not start: {error}\n(--no-accounting starts the cluster without it)"
        ) from None


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    """Serialize `up`/`down` on one directory (e.g. parallel pytest workers that all
    call ensure_cluster): the second waits, then finds the cluster up."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.root / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def up(shape: Shape, directory: str) -> dict[str, str]:
    """Make sure a healthy cluster of this shape runs from `directory`; return its env."""
    require_root()
    paths = Paths(Path(directory).absolute())
    with locked(paths):
        return _up_locked(shape, paths)


def _up_locked(shape: Shape, paths: Paths) -> dict[str, str]:
    with machine_locked():
        ensure_installed(shape.accounting)
        ensure_munge()
    expected_conf = render_slurm_conf(shape, paths, short_hostname())
    same_shape = read_shape(paths) == shape and _read_text(paths.conf) == expected_conf
    if same_shape and is_up(paths, shape):
        log(f"already up in {paths.root} ({_describe(shape)})")
        return {"SLURM_CONF": str(paths.conf)}
    if cluster_pids(paths):
        reason = "shape differs" if not same_shape else "not healthy"
        log(f"restarting the cluster in {paths.root} ({reason})")
        stop_cluster(paths)
    start_time = time.monotonic()
    start_cluster(shape, paths)
    log(f"up in {time.monotonic() - start_time:.1f}s: {_describe(shape)}")
    return {"SLURM_CONF": str(paths.conf)}


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _describe(shape: Shape) -> str:
    kind = "with accounting" if shape.accounting else "no accounting"
    return (
        f"{shape.nodes} nodes x {shape.cpus_per_node} CPUs x {shape.gpus_per_node} GPUs, {kind}, "
        f"MinJobAge {shape.min_job_age_s}s, SlurmdTimeout {shape.slurmd_timeout_s}s"
        + (f", MaxArraySize {shape.max_array_size}" if shape.max_array_size else "")
        + (f", MaxJobCount {shape.max_job_count}" if shape.max_job_count else "")
        + (", limits enforced" if shape.enforce_limits else "")
        + f", ports {describe_ports(shape)}"
    )


def describe_ports(shape: Shape) -> str:
    text = f"{shape.port_base}..{shape.port_base + shape.nodes}"
    if shape.accounting:
        dbd_port, db_port = accounting.ports(shape.port_base)
        text += f", slurmdbd {dbd_port}, MariaDB {db_port}"
    return text


# --------------------------------------------------------------------------- down


def stop_cluster(paths: Paths) -> bool:
    """Stop every daemon of this cluster; True when something was running."""
    thaw_all(paths)  # a frozen process would hold its SIGTERM
    pids = cluster_pids(paths)
    if not pids:
        _remove_pid_files(paths)
        return False
    if "slurmctld" in pids.values():
        cancel_all_jobs(paths)
        pids = cluster_pids(paths)
    # Nodes first, controller last, so slurmd can still report job ends while
    # shutting down.  slurmscriptd is left to slurmctld: a SIGTERM sent to it
    # directly makes slurmctld hang on shutdown ("_write_msg: read/write op failed").
    stop_processes({p: n for p, n in pids.items() if n in ("slurmd", "slurmstepd")})
    stop_processes({p: n for p, n in pids.items() if n == "slurmctld"})
    # Accounting last: slurmctld sends its last job records to slurmdbd, which writes them to MariaDB.
    stop_processes({p: n for p, n in pids.items() if n == "slurmdbd"})
    stop_processes({p: n for p, n in pids.items() if n == "mariadbd"})
    leftover = cluster_pids(paths)
    if leftover:
        stop_processes(leftover)
    _remove_pid_files(paths)
    return True


def _remove_pid_files(paths: Paths) -> None:
    if paths.run.is_dir():
        for pid_file in paths.run.glob("*.pid"):
            pid_file.unlink(missing_ok=True)


def cancel_all_jobs(paths: Paths) -> None:
    """Cancel jobs first so their tasks end with them instead of being orphaned."""
    env = slurm_env(paths)
    jobs = run_cmd(["squeue", "--noheader", "--format=%A"], env=env, timeout=20)
    ids = jobs.stdout.split() if jobs.returncode == 0 else []
    if not ids:
        return
    log(f"cancelling {len(ids)} job(s)")
    run_cmd(["scancel", *ids], env=env, timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = run_cmd(["squeue", "--noheader", "--states=R,CG,S", "--format=%A"], env=env)
        if left.returncode != 0 or not left.stdout.strip():
            return
        time.sleep(0.5)


# --------------------------------------------------------------------------- freeze


def frozen_record(paths: Paths, node: str) -> Path:
    return paths.root / f"frozen-{node}.pids"


def freeze_node(directory: str, node: str) -> list[int]:
    """Every process of `node` stopped, as a node that died silently (devcluster_freeze.py)."""
    paths = Paths(Path(directory).absolute())
    try:
        return freezing.freeze(paths.slurmd_pid(node), paths.slurmd_log(node), frozen_record(paths, node))
    except LookupError as error:
        raise DevClusterError(f"cannot freeze {node} of the cluster in {paths.root}: {error}", 2) from None


def thaw_node(directory: str, node: str) -> list[int]:
    """The processes `freeze_node` stopped, continued."""
    return freezing.thaw(frozen_record(Paths(Path(directory).absolute()), node))


def thaw_all(paths: Paths) -> None:
    for record in paths.root.glob("frozen-*.pids"):
        freezing.thaw(record)
