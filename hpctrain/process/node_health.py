"""A node's checks at the start of every life (slurm.health), so that a node broken but alive (its
local disk full, a GPU gone, the run dir's mount stale, a site's own check failing) is kept out
of the life instead of failing or crawling in it again and again.

The first task of each node (local rank 0) runs them before the rendezvous: the run dir takes a
small file, the scratch folder and the memory have room, the GPUs the job asked for are seen, and
the site's own command (slurm.health.command) ends with 0. A node that fails one journals a
`failure` (cause `node_health`, the node, the check and what it found) and its task leaves with
WORKER_NODE_UNHEALTHY; srun ends the step, and the control step counts the node as lost: a
relaunch on a spare, or a requeue without it (hpctrain.recovery.judge.lost_nodes). After the
rendezvous every rank takes part in one timed all-reduce, whose bandwidth the `start` record
keeps (`health`).

The judgments are pure functions of what was read (tests/test_node_health.py is their table);
`check_node` reads and times.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.health import HealthConfig
from hpctrain.run.causes import Cause
from hpctrain.run.events import Failure, Journal
from hpctrain.run.life import LifeStamp
from hpctrain.run.node_memory import available_bytes

GB = 1024**3
# What an all-reduce check sends: big enough to be timed, small enough to cost nothing.
ALLREDUCE_BYTES = 4 * 1024 * 1024
# The last characters of a site command's output that a failure keeps.
OUTPUT_TAIL = 300


@dataclass(frozen=True)
class CheckResult:
    check: str
    ok: bool
    result: str  # what it found, in words a user can act on
    seconds: float = 0.0


def judge_scratch(folder: str, free_bytes: int | None, min_gb: float) -> tuple[bool, str]:
    if free_bytes is None:
        return False, f"{folder} cannot be read (no such folder, or no access)"
    free = free_bytes / GB
    return free >= min_gb, f"{free:.1f} GB free in {folder} (slurm.health.min_scratch_gb={min_gb:g})"


def judge_memory(available_kb: int | None, min_gb: float) -> tuple[bool, str]:
    if available_kb is None:
        return True, "MemAvailable not shown by this kernel: not checked"
    available = available_kb * 1024 / GB
    return available >= min_gb, f"{available:.1f} GB available (slurm.health.min_memory_gb={min_gb:g})"


def judge_gpus(expected: int, seen: int) -> tuple[bool, str]:
    if expected == 0:
        return True, "no GPU asked for"
    return seen >= expected, f"{seen} of the {expected} GPUs this task should see"


def judge_command(command: str, exit_code: int | None, output: str, timeout_s: float) -> tuple[bool, str]:
    tail = " ".join(output.split())[-OUTPUT_TAIL:]
    said = f": {tail}" if tail else ""
    if exit_code is None:
        return False, f"`{command}` did not end within {timeout_s:g} s (slurm.health.timeout_s){said}"
    if exit_code != 0:
        return False, f"`{command}` exited {exit_code}{said}"
    return True, f"`{command}` exited 0"


def expected_gpus(gpus_per_node: int, visible: str | None) -> int:
    """The GPUs this task should see: those Slurm made visible to it (CUDA_VISIBLE_DEVICES: all of
    the node's, or one under slurm.gpu_bind=per_task), or the job's count per node."""
    if gpus_per_node == 0:
        return 0
    if visible:
        return len([gpu for gpu in visible.split(",") if gpu.strip()])
    return gpus_per_node


def allreduce_gbps(world_size: int, seconds: float, size: int = ALLREDUCE_BYTES) -> float:
    """The bus bandwidth of one all-reduce (NCCL's tests' convention: 2 (n-1)/n of the bytes
    cross each rank's link), in GB/s."""
    if world_size < 2 or seconds <= 0:
        return 0.0
    return 2 * (world_size - 1) / world_size * size / seconds / 1e9


# ---- reading the node ----------------------------------------------------------------------------


def check_node(
    health: HealthConfig,
    run_dir: Path,
    node: str,
    gpus_per_node: int,
    gpu_count: Callable[[], int],
    env: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Run slurm.health's checks on this node in order, each timed; the site's command last. Stops
    at the first that fails (the node is out of this life whatever the others find)."""
    env = os.environ if env is None else env
    checks: list[tuple[str, Callable[[], tuple[bool, str]]]] = []
    names = set(health.checks)
    if "run_dir" in names:
        checks.append(("run_dir", lambda: _run_dir_takes_a_file(run_dir, node)))
    if "scratch" in names:
        folder = health.scratch_dir or env.get("TMPDIR") or "/tmp"
        checks.append(("scratch", lambda: judge_scratch(folder, _free_bytes(folder), health.min_scratch_gb)))
    if "memory" in names:
        checks.append(("memory", lambda: judge_memory(_meminfo_available(), health.min_memory_gb)))
    if "gpus" in names:
        expected = expected_gpus(gpus_per_node, env.get("CUDA_VISIBLE_DEVICES"))
        checks.append(("gpus", lambda: judge_gpus(expected, gpu_count() if expected else 0)))
    if health.command:
        checks.append(("command", lambda: _site_command(health, run_dir, env)))
    results = []
    for name, check in checks:
        began = time.monotonic()
        # The site's command has its own timeout (its process is killed): a second more here.
        ok, said = _within(health.timeout_s + (1.0 if name == "command" else 0.0), check)
        results.append(CheckResult(name, ok, said, round(time.monotonic() - began, 4)))
        if not ok:
            break
    return results


def _within(timeout_s: float, check: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    """The check's answer, or a failure when it gives none within `timeout_s`: a stale network
    mount blocks a write or a statvfs for ever, and the node must be named, not wait with it (the
    thread is left behind; the process leaves soon)."""
    answer: list[tuple[bool, str]] = []

    def run() -> None:
        try:
            answer.append(check())
        except OSError as error:
            answer.append((False, f"{type(error).__name__}: {error}"))

    thread = threading.Thread(target=run, name="hpctrain-node-health", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not answer:
        return False, f"no answer within {timeout_s:g} s (slurm.health.timeout_s): a stale mount, a hung device"
    return answer[0]


def _run_dir_takes_a_file(run_dir: Path, node: str) -> tuple[bool, str]:
    probe = run_dir / f".health-{node}-{os.getpid()}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"hpctrain node health\n")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        return False, f"{run_dir} takes no file: {error.strerror or error}"
    return True, f"{run_dir} takes a file"


def _free_bytes(folder: str) -> int | None:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _meminfo_available() -> int | None:
    available = available_bytes()
    return None if available is None else available // 1024


def _site_command(health: HealthConfig, run_dir: Path, env: Mapping[str, str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            ["bash", "-c", health.command],
            env={**env, "HPCTRAIN_RUN_DIR": str(run_dir)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=health.timeout_s,
        )
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        return judge_command(
            health.command, None, output if isinstance(output, str) else output.decode(), health.timeout_s
        )
    return judge_command(health.command, done.returncode, done.stdout + done.stderr, health.timeout_s)


# ---- in the training process ------------------------------------------------------------------


class NodeUnhealthy(Exception):
    """This node failed a check; its `failure` is journaled."""


def gate(
    health: HealthConfig,
    run_dir: Path,
    node: str,
    gpus_per_node: int,
    gpu_count: Callable[[], int],
    journal: Journal,
    life: LifeStamp,
) -> dict[str, float]:
    """The node's checks before the rendezvous: each check's seconds when all pass; otherwise the
    `failure` written and NodeUnhealthy raised (the process leaves with WORKER_NODE_UNHEALTHY)."""
    results = check_node(health, run_dir, node, gpus_per_node, gpu_count)
    failed = next((r for r in results if not r.ok), None)
    if failed is not None:
        said = f"node {node} failed its {failed.check} check: {failed.result}"
        try:
            journal.write_event(
                Failure(
                    job_id=life.job_id,
                    restart=life.restart,
                    cause=Cause.NODE_HEALTH,
                    nodes=[node],
                    check=failed.check,
                    result=failed.result,
                )
            )
        except OSError as error:
            # The run dir this node cannot write (a stale mount): the job's output says it; the
            # step ends all the same, judged without the record (a crash).
            said += f"; not journaled: {error}"
        raise NodeUnhealthy(said)
    return {f"{r.check}_s": r.seconds for r in results}
