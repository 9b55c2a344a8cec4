"""Tests for scripts/devcluster.py: a real one-machine Slurm cluster.

The `slurm` tests start a real cluster (installing slurm-wlm with apt-get the first
time), so they need root and a Debian/Ubuntu machine; elsewhere they are skipped.
The cluster they start is stopped when the test run ends (tests/conftest.py).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest
from slurmtools import DEVCLUSTER_DIR, DEVCLUSTER_PORT_BASE, ensure_cluster

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "devcluster.py"
# Not the developer's default cluster (/tmp/hpctrain-devcluster, ports 16817..): the suite's own.
TEST_DIR, TEST_PORT_BASE = DEVCLUSTER_DIR, DEVCLUSTER_PORT_BASE
NODES = 2
GPUS_PER_NODE = 2
JOB_TIMEOUT_S = 180.0


def load_devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


devcluster = load_devcluster()


def _skip_reason() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "devcluster needs root (installs slurm-wlm, starts slurmctld/slurmd)"
    if shutil.which("apt-get") is None:
        return "devcluster installs Slurm with apt-get; this is not Debian/Ubuntu"
    return None


needs_cluster = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    """Environment for Slurm commands, pointing at the (started or reused) test cluster."""
    env = ensure_cluster(TEST_DIR, NODES, GPUS_PER_NODE, TEST_PORT_BASE)
    assert env == {"SLURM_CONF": f"{TEST_DIR}/slurm.conf"}
    return {**os.environ, **env}


@pytest.fixture()
def job_dir() -> Path:
    # Slurm runs jobs as root here, so any directory works; keep outputs apart per test.
    path = Path(TEST_DIR) / "jobs" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    return path


def submit(env: dict[str, str], workdir: Path, *sbatch_args: str) -> tuple[str, Path]:
    output = workdir / "out.txt"
    result = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={workdir}", f"--output={output}", *sbatch_args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0], output


def job_state(env: dict[str, str], job_id: str) -> str:
    result = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for field in result.stdout.split():
        if field.startswith("JobState="):
            return field.removeprefix("JobState=")
    return "UNKNOWN"


def task_lines(output: Path) -> list[str]:
    """The tasks' output lines: srun's own notes ("srun: Job 1 step creation temporarily
    disabled, retrying" under load) are not theirs."""
    return [line for line in output.read_text().splitlines() if not line.startswith("srun:")]


def wait_for_job(env: dict[str, str], job_id: str, timeout: float = JOB_TIMEOUT_S) -> str:
    """Poll until the job leaves PENDING/RUNNING/COMPLETING; return the final state."""
    deadline = time.monotonic() + timeout
    state = "UNKNOWN"
    while time.monotonic() < deadline:
        state = job_state(env, job_id)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "UNKNOWN"):
            return state
        time.sleep(1)
    pytest.fail(f"job {job_id} still {state} after {timeout:.0f}s")


# --------------------------------------------------------------------------- no cluster


def test_config_for_one_node_without_gpus_has_no_ranges_and_no_gres() -> None:
    shape = devcluster.Shape(nodes=1, gpus_per_node=0, cpus_per_node=2, port_base=20000)
    paths = devcluster.Paths(Path("/tmp/x"))
    conf = devcluster.render_slurm_conf(shape, paths, "host")
    assert "NodeName=node1 NodeHostname=host NodeAddr=127.0.0.1 Port=20001 " in conf
    assert "Gres" not in conf
    assert "SlurmctldPort=20000" in conf
    assert "Name=gpu" not in devcluster.render_gres_conf(shape)


def test_config_declares_gpus_and_both_partitions() -> None:
    shape = devcluster.Shape(nodes=3, gpus_per_node=2, cpus_per_node=2, port_base=16817)
    paths = devcluster.Paths(Path("/tmp/x"))
    conf = devcluster.render_slurm_conf(shape, paths, "host")
    assert "Port=16818-16820" in conf and "Gres=gpu:2" in conf and "GresTypes=gpu" in conf
    assert "PartitionName=batch Nodes=node[1-3] Default=YES" in conf
    assert "PartitionName=urgent Nodes=node[1-3] Default=NO" in conf
    gres = devcluster.render_gres_conf(shape)
    assert "NodeName=node[1-3] Name=gpu File=/dev/fakegpu[0-1]" in gres


def test_config_is_strict_like_a_site_by_default() -> None:
    """CPU pinning and accounting through slurmdbd at port base + 20; MariaDB at + 21."""
    shape = devcluster.Shape(nodes=2, gpus_per_node=0, cpus_per_node=2, port_base=20000)
    conf = devcluster.render_slurm_conf(shape, devcluster.Paths(Path("/tmp/x")), "host")
    assert "TaskPlugin=task/affinity" in conf.splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStorageHost=127.0.0.1\nAccountingStoragePort=20020\n" in conf
    assert "MinJobAge=300" in conf
    assert devcluster.cluster_ports(shape) == [20000, 20001, 20002, 20020, 20021]


def test_config_without_accounting_names_no_slurmdbd() -> None:
    shape = devcluster.Shape(2, 0, 2, 20000, accounting=False, min_job_age_s=2)
    conf = devcluster.render_slurm_conf(shape, devcluster.Paths(Path("/tmp/x")), "host")
    assert "Accounting" not in conf and "MinJobAge=2" in conf.splitlines()
    assert "TaskPlugin=task/affinity" in conf.splitlines()
    assert devcluster.cluster_ports(shape) == [20000, 20001, 20002]


def test_slurmdbd_conf_is_private_and_points_at_its_own_database(tmp_path: Path) -> None:
    paths = devcluster.accounting.AccountingPaths(tmp_path)
    password = devcluster.accounting.write_slurmdbd_conf(paths, 20000)
    assert (paths.dbd_conf.stat().st_mode & 0o777) == 0o600  # slurmdbd refuses a readable one
    lines = paths.dbd_conf.read_text().splitlines()
    assert {"DbdPort=20020", "StoragePort=20021", "StorageHost=127.0.0.1", f"StoragePass={password}"} <= set(lines)
    assert len(password) == 32 and password != devcluster.accounting.write_slurmdbd_conf(paths, 20000)


def test_a_taken_database_port_is_named() -> None:
    import socket

    def others_free(shape: devcluster.Shape, taken_port: int) -> bool:
        # The kernel hands out neighbouring ports to other connections of a busy suite: the test
        # is about the taken port only, so it needs the cluster's other ports free.
        for other in devcluster.cluster_ports(shape):
            if other == taken_port:
                continue
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("0.0.0.0", other))
                except OSError:
                    return False
        return True

    for _ in range(50):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            port = taken.getsockname()[1]
            taken.listen()
            # Pick a base whose MariaDB port (base + 21) is the taken one.
            shape = devcluster.Shape(1, 0, 2, port - 21)
            if not others_free(shape, port):
                continue
            with pytest.raises(devcluster.DevClusterError, match=f"port {port} is in use.*MariaDB {port}"):
                devcluster.check_ports_free(shape)
            return
    pytest.fail("no port found whose neighbours were free in 50 tries")


@pytest.mark.slurm
@needs_cluster
def test_a_database_that_cannot_start_shows_its_log(tmp_path: Path) -> None:
    """A data dir never initialised: mariadbd exits, and the error carries the end of its log."""
    import socket

    for folder in ("run", "log", "db"):
        (tmp_path / folder).mkdir()
    with socket.socket() as probe:  # a free port for MariaDB (port base + 21)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    paths = devcluster.accounting.AccountingPaths(tmp_path)
    env = devcluster.slurm_env(devcluster.Paths(tmp_path))
    with pytest.raises(devcluster.accounting.AccountingError, match=r"(?s)mariadbd exited.*privilege tables"):
        devcluster.accounting.start_database(paths, port - 21, env)


@pytest.mark.slurm
@needs_cluster
def test_a_half_made_data_dir_is_made_again(tmp_path: Path) -> None:
    """An `up` killed while mariadb-install-db ran left `mysql/` and a zero-byte ibdata1; every
    later `up` failed on it ("Header page consists of zero bytes"). Such a dir is made again,
    and a finished one is kept as it is."""
    paths = devcluster.accounting.AccountingPaths(tmp_path)
    env = devcluster.slurm_env(devcluster.Paths(tmp_path))
    (paths.datadir / "mysql").mkdir(parents=True)
    (paths.datadir / "ibdata1").write_bytes(b"")
    devcluster.accounting.init_database(paths, env)
    assert (paths.datadir / devcluster.accounting.INITIALISED).is_file()
    assert (paths.datadir / "ibdata1").stat().st_size > 0 and any((paths.datadir / "mysql").iterdir())
    assert not paths.datadir.with_name(f"{paths.datadir.name}.building").exists()
    kept = (paths.datadir / "mysql").stat().st_ino
    devcluster.accounting.init_database(paths, env)  # complete: nothing done again
    assert (paths.datadir / "mysql").stat().st_ino == kept


def test_env_prints_only_the_export_line() -> None:
    result = run_cli("env", "--dir", TEST_DIR)
    assert result.returncode == 0
    assert result.stdout == f"export SLURM_CONF={TEST_DIR}/slurm.conf\n"


# --------------------------------------------------------------------------- real cluster


@pytest.mark.slurm
@needs_cluster
def test_job_runs_one_task_on_each_node(cluster_env: dict[str, str], job_dir: Path) -> None:
    job_id, output = submit(
        cluster_env,
        job_dir,
        f"--nodes={NODES}",
        "--ntasks-per-node=1",
        "--wrap",
        "srun hostname && srun bash -c 'echo node=$SLURMD_NODENAME'",
    )
    assert wait_for_job(cluster_env, job_id) == "COMPLETED", output.read_text()
    lines = task_lines(output)
    nodes = sorted(line for line in lines if line.startswith("node="))
    assert nodes == [f"node=node{i}" for i in range(1, NODES + 1)]
    assert len(lines) == 2 * NODES, lines  # plus one `hostname` line per node


@pytest.mark.slurm
@needs_cluster
def test_each_local_task_gets_its_own_fake_gpu(cluster_env: dict[str, str], job_dir: Path) -> None:
    job_id, output = submit(
        cluster_env,
        job_dir,
        f"--nodes={NODES}",
        f"--gpus-per-node={GPUS_PER_NODE}",
        f"--ntasks-per-node={GPUS_PER_NODE}",
        "--wrap",
        "srun --gpus-per-task=1 bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
    )
    assert wait_for_job(cluster_env, job_id) == "COMPLETED", output.read_text()
    devices_by_node: dict[str, list[str]] = defaultdict(list)
    ranks = []
    for line in task_lines(output):
        rank, node, visible = line.split()
        ranks.append(int(rank))
        devices_by_node[node].append(visible)
    assert sorted(ranks) == list(range(NODES * GPUS_PER_NODE))
    for node, per_task in devices_by_node.items():
        # One device per task, and no two tasks of a node share one.
        assert sorted(per_task) == [str(i) for i in range(GPUS_PER_NODE)], (node, per_task)


@pytest.mark.slurm
@needs_cluster
def test_status_and_up_again_report_a_healthy_cluster(cluster_env: dict[str, str]) -> None:
    status = run_cli("status", "--dir", TEST_DIR)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "batch*" in status.stdout and "urgent" in status.stdout
    again = run_cli(
        "up",
        "--nodes",
        str(NODES),
        "--gpus-per-node",
        str(GPUS_PER_NODE),
        "--dir",
        TEST_DIR,
        "--port-base",
        str(TEST_PORT_BASE),
    )
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert again.stdout.splitlines()[-1] == f"export SLURM_CONF={TEST_DIR}/slurm.conf"


@pytest.mark.slurm
@needs_cluster
def test_tasks_are_pinned_and_sacct_answers(cluster_env: dict[str, str], job_dir: Path) -> None:
    """task/affinity: two tasks on a 2-CPU node get one CPU each; accounting records the job."""
    job_id, output = submit(
        cluster_env,
        job_dir,
        "--nodes=1",
        "--ntasks=2",
        "--cpus-per-task=1",
        "--wrap",
        "srun --cpus-per-task=1 bash -c 'echo $SLURM_PROCID $(grep Cpus_allowed_list /proc/self/status)'",
    )
    assert wait_for_job(cluster_env, job_id) == "COMPLETED", output.read_text()
    cpus = sorted(line.split()[-1] for line in task_lines(output))
    assert cpus == ["0", "1"], output.read_text()
    # slurmctld tells slurmdbd of the job's end after the job has ended, through a queue: sacct
    # may not know of it, or say RUNNING, for a moment (longer on a loaded machine). The bound is
    # for a record never sent.
    deadline = time.monotonic() + 60
    while True:
        sacct = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobIDRaw,State,AllocCPUS"],
            env=cluster_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        state = sacct.stdout.split("|")[1] if sacct.stdout.count("|") >= 2 else ""
        if sacct.returncode != 0 or state not in ("", "PENDING", "RUNNING") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (sacct.returncode, sacct.stdout) == (0, f"{job_id}|COMPLETED|2\n"), sacct.stderr


@pytest.mark.slurm
@needs_cluster
def test_down_stops_every_daemon_and_up_restarts(cluster_env: dict[str, str]) -> None:
    paths = devcluster.Paths(Path(TEST_DIR))
    down = run_cli("down", "--dir", TEST_DIR)
    assert down.returncode == 0, down.stderr
    assert devcluster.cluster_pids(paths) == {}  # slurmdbd and mariadbd included
    assert run_cli("status", "--dir", TEST_DIR).returncode != 0
    assert run_cli("down", "--dir", TEST_DIR).returncode == 0  # nothing to stop: fine

    # Leave the cluster up for the Slurm tests that follow.
    up = run_cli(
        "up",
        "--nodes",
        str(NODES),
        "--gpus-per-node",
        str(GPUS_PER_NODE),
        "--dir",
        TEST_DIR,
        "--port-base",
        str(TEST_PORT_BASE),
    )
    assert up.returncode == 0, up.stderr
    assert set(devcluster.cluster_pids(paths).values()) >= {"slurmctld", "slurmd", "slurmdbd", "mariadbd"}
    assert run_cli("status", "--dir", TEST_DIR).returncode == 0
