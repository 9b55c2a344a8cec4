"""Accounting for the dev cluster: a MariaDB server and a slurmdbd of its own, like a site's.

Loaded by scripts/devcluster.py (which owns the cluster's directory and ports). Everything lives
in the cluster's directory: the database files in `db/`, `slurmdbd.conf` beside `slurm.conf`
(slurmdbd reads it from there), pid files in `run/`, logs in `log/`. Ports come from the
cluster's port base (slurmdbd at base+20, MariaDB at base+21), so clusters started from other
directories with other port bases never share a daemon.

Both daemons get SLURM_CONF=<this cluster's slurm.conf> in their environment: that is how
`down` tells them from another cluster's (devcluster.cluster_pids reads it back from /proc).
Python 3.11, standard library only.
"""

import os
import secrets
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DBD_PORT_OFFSET = 20
DB_PORT_OFFSET = 21
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
# What `apt-get install` needs besides slurm-wlm and munge, and the commands it brings.
PACKAGES = ("mariadb-server", "slurmdbd")
COMMANDS = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr", "sacct")
DAEMON_NAMES = ("slurmdbd", "mariadbd")
START_TIMEOUT_S = 60.0


class AccountingError(Exception):
    """A step of starting accounting failed; the message says which and shows the log tail."""


@dataclass(frozen=True)
class AccountingPaths:
    root: Path  # the cluster's directory

    @property
    def datadir(self) -> Path:
        return self.root / "db"

    @property
    def socket(self) -> Path:
        return self.root / "run" / "mysql.sock"

    @property
    def db_pid(self) -> Path:
        return self.root / "run" / "mariadbd.pid"

    @property
    def db_log(self) -> Path:
        return self.root / "log" / "mariadbd.log"

    @property
    def db_tmp(self) -> Path:
        """MariaDB's temporary tables, this cluster's own: in a shared /tmp, clusters set up at
        once collided on their names (`Could not remove temporary table: '/tmp/#sql-temptable-
        edc-1-3'`, then `Unknown table 'mysql.tmp_user_sys'`: 4 of 24 data dirs made at once
        failed, none of 36 with a folder each)."""
        return self.root / "run" / "dbtmp"

    @property
    def dbd_conf(self) -> Path:
        return self.root / "slurmdbd.conf"

    @property
    def dbd_pid(self) -> Path:
        return self.root / "run" / "slurmdbd.pid"

    @property
    def dbd_log(self) -> Path:
        return self.root / "log" / "slurmdbd.log"


def ports(port_base: int) -> tuple[int, int]:
    """(slurmdbd port, MariaDB port) of the cluster at this port base."""
    return port_base + DBD_PORT_OFFSET, port_base + DB_PORT_OFFSET


def slurm_conf_lines(port_base: int) -> list[str]:
    dbd_port, _ = ports(port_base)
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={dbd_port}",
        # Per-task CPU time and memory in sacct (MaxRSS, TotalCPU), as sites record them.
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
    ]


def render_slurmdbd_conf(paths: AccountingPaths, port_base: int, password: str) -> str:
    dbd_port, db_port = ports(port_base)
    return (
        "\n".join(
            [
                "# Written by scripts/devcluster.py; rewritten by every `up` (mode 600: it holds a password).",
                "AuthType=auth/munge",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"PidFile={paths.dbd_pid}",
                f"LogFile={paths.dbd_log}",
                "DebugLevel=info",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                f"StorageUser={DB_USER}",
                f"StoragePass={password}",
                f"StorageLoc={DB_NAME}",
            ]
        )
        + "\n"
    )


# --------------------------------------------------------------------------- MariaDB


def _run(args: list[str], env: dict[str, str], what: str, stdin: str | None = None) -> str:
    """Run a short command; its stdout, or AccountingError naming `what` failed and why."""
    try:
        done = subprocess.run(args, env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise AccountingError(f"{what}: `{shlex.join(args)}` did not run: {error}") from None
    if done.returncode != 0:
        raise AccountingError(
            f"{what}: `{shlex.join(args)}` failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(cannot read {path}: {error})"


# Written into a data dir once mariadb-install-db finished it; a dir without it is half made.
INITIALISED = ".hpctrain-initialised"


def init_database(paths: AccountingPaths, env: dict[str, str]) -> None:
    """Create the data dir once; later `up`s reuse it (drop_job_records forgets old jobs).

    Made beside its place and renamed into it when complete: an `up` killed during the
    initialisation (a test run interrupted at its start) leaves no half-made dir that every
    later `up` would fail on ("InnoDB: Header page consists of zero bytes"). A dir without the
    marker is made again."""
    if (paths.datadir / INITIALISED).is_file():
        return
    building = paths.datadir.with_name(f"{paths.datadir.name}.building")
    for stale in (building, paths.datadir):
        shutil.rmtree(stale, ignore_errors=True)
    building.mkdir(parents=True)
    paths.db_tmp.mkdir(parents=True, exist_ok=True)
    # --no-defaults: the machine's /etc/mysql settings (socket, port, datadir) are not ours.
    _run(
        [
            "mariadb-install-db",
            "--no-defaults",
            "--user=root",
            f"--datadir={building}",
            f"--tmpdir={paths.db_tmp}",
            "--skip-test-db",
        ],
        env,
        "initialising the MariaDB data dir",
    )
    (building / INITIALISED).write_text("mariadb-install-db completed\n")
    building.rename(paths.datadir)


def start_database(paths: AccountingPaths, port_base: int, env: dict[str, str]) -> None:
    _, db_port = ports(port_base)
    paths.db_tmp.mkdir(parents=True, exist_ok=True)
    args = [
        "mariadbd",
        "--no-defaults",
        "--user=root",
        f"--datadir={paths.datadir}",
        f"--tmpdir={paths.db_tmp}",
        f"--socket={paths.socket}",
        f"--port={db_port}",
        "--bind-address=127.0.0.1",
        f"--pid-file={paths.db_pid}",
        f"--log-error={paths.db_log}",
        # A scratch database: no need to flush every commit to disk, which is slow on shared disks.
        "--innodb-flush-log-at-trx-commit=0",
        "--skip-name-resolve",
    ]
    with open(os.devnull, "w") as devnull:
        # setsid: the daemon outlives this script and a Ctrl-C in the caller's terminal.
        process = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=devnull, stderr=devnull, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AccountingError(f"mariadbd exited at once (exit {process.returncode}):\n{_tail(paths.db_log)}")
        if paths.socket.exists() and _sql_ok(paths, env, "SELECT 1"):
            return
        time.sleep(0.2)
    raise AccountingError(f"mariadbd did not answer within {START_TIMEOUT_S:.0f}s:\n{_tail(paths.db_log)}")


def _sql_ok(paths: AccountingPaths, env: dict[str, str], sql: str) -> bool:
    try:
        sql_as_root(paths, env, sql, "probing MariaDB")
    except AccountingError:
        return False
    return True


def sql_as_root(paths: AccountingPaths, env: dict[str, str], sql: str, what: str) -> str:
    # MariaDB's root logs in through the unix socket (as the unix root user), without a password.
    return _run(["mariadb", "--no-defaults", f"--socket={paths.socket}", "-u", "root", "-N", "-B"], env, what, sql)


def prepare_database(paths: AccountingPaths, env: dict[str, str], password: str) -> None:
    """A fresh job database (job ids restart at 1 with every cluster, so old records would
    answer for new jobs) and the password user slurmdbd logs in as (over TCP)."""
    statements = [f"DROP DATABASE IF EXISTS {DB_NAME};", f"CREATE DATABASE {DB_NAME};"]
    for host in ("localhost", "127.0.0.1"):
        statements += [
            f"CREATE OR REPLACE USER '{DB_USER}'@'{host}' IDENTIFIED BY '{password}';",
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}';",
        ]
    sql_as_root(paths, env, "\n".join(statements) + "\n", "creating the accounting database and its user")


# --------------------------------------------------------------------------- slurmdbd


def write_slurmdbd_conf(paths: AccountingPaths, port_base: int) -> str:
    """A new random password each `up`; the file is created with mode 600 (slurmdbd insists)."""
    password = secrets.token_hex(16)
    paths.dbd_conf.unlink(missing_ok=True)
    fd = os.open(paths.dbd_conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as conf:
        conf.write(render_slurmdbd_conf(paths, port_base, password))
    return password


def start_slurmdbd(paths: AccountingPaths, env: dict[str, str]) -> None:
    """slurmdbd forks into the background; wait until sacctmgr gets an answer through it."""
    stderr_path = paths.root / "log" / "slurmdbd.stderr"
    with open(stderr_path, "w") as err:
        started = subprocess.run(
            ["slurmdbd"], env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=60, check=False
        )
    if started.returncode != 0:
        raise AccountingError(
            f"`slurmdbd` failed (exit {started.returncode}):\n{_tail(stderr_path)}\n{_tail(paths.dbd_log)}"
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0:
            return
        last = done.stderr.strip()
        time.sleep(0.3)
    raise AccountingError(f"slurmdbd did not answer within {START_TIMEOUT_S:.0f}s ({last}):\n{_tail(paths.dbd_log)}")


def add_cluster(cluster: str, env: dict[str, str]) -> None:
    """Register the cluster: slurmctld refuses to record jobs of a cluster slurmdbd does not know.
    Adding it also creates the `root` account with user root, the association jobs run under here."""
    _run(["sacctmgr", "-i", "add", "cluster", cluster], env, f"adding cluster {cluster} to accounting")
    users = _run(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"cluster={cluster}", "format=user"], env, "reading associations"
    )
    if "root" not in users.split():
        raise AccountingError(f"sacctmgr added cluster {cluster}, but root has no association in it:\n{users}")


def start(root: Path, port_base: int, cluster: str, env: dict[str, str]) -> None:
    """MariaDB, then slurmdbd, then the cluster's record; slurmctld starts after this."""
    paths = AccountingPaths(root)
    init_database(paths, env)
    start_database(paths, port_base, env)
    password = write_slurmdbd_conf(paths, port_base)
    prepare_database(paths, env, password)
    start_slurmdbd(paths, env)
    add_cluster(cluster, env)
