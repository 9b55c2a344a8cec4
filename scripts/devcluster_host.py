"""What every dev cluster on this machine shares (scripts/devcluster.py): Slurm's and munge's
packages, munged, the fake GPU devices, and running commands with Slurm's system directories on
PATH. Standard library only.
"""

import contextlib
import fcntl
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import devcluster_accounting as accounting

if TYPE_CHECKING:  # devcluster_config imports nothing of this file, but is loaded after it
    from devcluster_config import Paths

ROOT_MESSAGE = "devcluster needs root (it installs slurm-wlm and starts slurmctld/slurmd); run it with sudo or as root"

# The commands this script (and the tests) rely on; all come with slurm-wlm / munge.
SLURM_COMMANDS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")

MUNGE_COMMANDS = ("munged", "munge", "unmunge")

# Daemons are found under /usr/sbin, which is not always on a sudo user's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DevClusterError(Exception):
    """A failure to report to the user as one plain message (plus exit code)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- commands


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only what callers may `eval`."""
    print(f"devcluster: {message}", file=sys.stderr, flush=True)


def slurm_env(paths: "Paths") -> dict[str, str]:
    """The environment for Slurm commands and daemons of this cluster."""
    env = dict(os.environ)
    env["SLURM_CONF"] = str(paths.conf)
    env["PATH"] = path_with_system_dirs(env.get("PATH", ""))
    return env


def path_with_system_dirs(path: str) -> str:
    parts = [p for p in path.split(os.pathsep) if p]
    for extra in SYSTEM_PATH.split(os.pathsep):
        if extra not in parts:
            parts.append(extra)
    return os.pathsep.join(parts)


def which(command: str) -> str | None:
    return shutil.which(command, path=path_with_system_dirs(os.environ.get("PATH", "")))


def run_cmd(
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a short command and capture its output (never a daemon: see start_daemon)."""
    try:
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        result = subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout}s")
    if check and result.returncode != 0:
        raise DevClusterError(
            f"`{shlex.join(args)}` failed (exit {result.returncode}):\n{result.stdout}{result.stderr}".rstrip()
        )
    return result


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text[-lines:])


def require_root() -> None:
    if os.geteuid() != 0:
        raise DevClusterError(ROOT_MESSAGE, exit_code=2)


# --------------------------------------------------------------------------- install


def missing_commands(with_accounting: bool) -> list[str]:
    wanted = SLURM_COMMANDS + MUNGE_COMMANDS + (accounting.COMMANDS if with_accounting else ())
    return [c for c in wanted if which(c) is None]


def ensure_installed(with_accounting: bool) -> None:
    """apt-get install slurm-wlm and munge (and mariadb-server and slurmdbd for accounting),
    but only when something is missing."""
    missing = missing_commands(with_accounting)
    packages = ["slurm-wlm", "munge", *(accounting.PACKAGES if with_accounting else ())]
    if not missing:
        return
    if which("apt-get") is None:
        raise DevClusterError(
            "devcluster installs Slurm with apt-get (Debian/Ubuntu), which this machine "
            f"lacks, and these commands are missing: {', '.join(missing)}. "
            f"Install {', '.join(packages)} yourself (or pass --no-accounting to do without accounting).",
            exit_code=2,
        )
    log(f"installing {' '.join(packages)} (missing: {', '.join(missing)}); takes a minute")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    env["PATH"] = path_with_system_dirs(env.get("PATH", ""))
    for args in (
        ["apt-get", "update"],
        # A CI image's own apt (unattended-upgrades at boot) may hold dpkg's lock: wait for it.
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", *packages],
    ):
        # Let apt's output through: a slow mirror should be visible, not a silent hang.
        result = subprocess.run(args, env=env, stdout=sys.stderr, check=False)
        if result.returncode != 0:
            raise DevClusterError(f"`{shlex.join(args)}` failed (exit {result.returncode})")
    still_missing = missing_commands(with_accounting)
    if still_missing:
        raise DevClusterError(f"after installing {' '.join(packages)} these are still missing: {still_missing}")


# --------------------------------------------------------------------------- munge


def munge_works() -> bool:
    """True when a credential made by munge decodes, i.e. munged runs and has a key."""
    try:
        encoded = subprocess.run(
            ["munge", "-n"],
            capture_output=True,
            timeout=10,
            check=False,
            env=dict(os.environ, PATH=path_with_system_dirs(os.environ.get("PATH", ""))),
        )
        if encoded.returncode != 0:
            return False
        decoded = subprocess.run(
            ["unmunge"],
            input=encoded.stdout,
            capture_output=True,
            timeout=10,
            check=False,
            env=dict(os.environ, PATH=path_with_system_dirs(os.environ.get("PATH", ""))),
        )
        return decoded.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munge() -> None:
    if munge_works():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        # The Debian package creates the key; recreate it if someone removed it.
        log("creating the munge key")
        run_cmd(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    log("starting munged")
    # --force: munged refuses to run as root (or with lax permissions) without it.
    run_cmd(["munged", "--force"], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if munge_works():
            return
        time.sleep(0.2)
    raise DevClusterError("munged was started but `munge -n | unmunge` still fails")


# --------------------------------------------------------------------------- devices


def fake_gpu_devices(gpus_per_node: int) -> list[Path]:
    return [Path(f"/dev/fakegpu{i}") for i in range(gpus_per_node)]


def ensure_fake_gpus(gpus_per_node: int) -> None:
    """Create /dev/fakegpuN as char devices 1:3 (what /dev/null is) when missing.

    Slurm only needs the files to exist (gres.conf names them); nothing reads them.
    """
    for device in fake_gpu_devices(gpus_per_node):
        if device.exists():
            continue
        try:
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            # E.g. a container without CAP_MKNOD: an empty file is enough for Slurm.
            device.touch()
        device.chmod(0o666)  # mknod's mode is cut by the umask; jobs may run as anyone


# Slurm's packages and munged are the machine's, not one cluster's: clusters brought up at once
# from other folders (parallel pytest workers on a fresh machine) install and start them one at a
# time, and the later ones find them there. Without it two apt-gets raced for dpkg's lock and
# every cluster but one failed to come up.
MACHINE_LOCK = Path("/var/lock" if Path("/var/lock").is_dir() else "/tmp") / "hpctrain-devcluster-machine.lock"


@contextlib.contextmanager
def machine_locked() -> Iterator[None]:
    """Serialize what every cluster on this machine shares: installing packages, munged."""
    with open(MACHINE_LOCK, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield
