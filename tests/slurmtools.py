"""Helpers for tests on the real Slurm dev cluster (scripts/devcluster.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
# Its own folder and ports, so the suite never fights a developer's cluster. Two checkouts testing
# side by side on one machine each set their own (HPCTRAIN_TEST_CLUSTER_DIR, HPCTRAIN_TEST_PORT_BASE).
SUITE_DIR = os.environ.get("HPCTRAIN_TEST_CLUSTER_DIR", "/tmp/hpctrain-devcluster-suite")
SUITE_PORT_BASE = int(os.environ.get("HPCTRAIN_TEST_PORT_BASE", "18817"))
# Each pytest-xdist worker (PYTEST_XDIST_WORKER=gw0, gw1...) runs clusters of its own: worker N's
# folders end in -gwN and its ports are N blocks above the suite's, so two workers' Slurm tests never
# share a node, a port or a job id. Worker 0 (and a run without xdist) uses the suite's own.
WORKER_PORT_BLOCK = 100
MAX_WORKERS = 8


def worker_number() -> int:
    """This worker's number among every lane's (scripts/test.sh: the waiting lane's workers come
    after the main lane's, HPCTRAIN_TEST_WORKER_OFFSET)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")) + int(os.environ.get("HPCTRAIN_TEST_WORKER_OFFSET", "0"))


def worker_cluster_dir(number: int) -> str:
    return SUITE_DIR if number == 0 else f"{SUITE_DIR}-gw{number}"


CLUSTER_DIR = worker_cluster_dir(worker_number())
PORT_BASE = SUITE_PORT_BASE + WORKER_PORT_BLOCK * worker_number()
NODES = 3
GPUS_PER_NODE = 2
# Every cluster's ports lie inside the worker's block: the main cluster takes base..base+3, base+20
# and base+21 (slurmdbd, MariaDB); scripts/devcluster.py's own tests a 2-node cluster at base+5; the
# lenient shape (no accounting: sacct answers "accounting storage is disabled", as on many small
# sites) base+50; a cluster that forgets ended jobs within seconds (MinJobAge 2) base+60.
DEVCLUSTER_DIR, DEVCLUSTER_PORT_BASE = f"{CLUSTER_DIR}-devcluster", PORT_BASE + 5
LENIENT_DIR, LENIENT_PORT_BASE = f"{CLUSTER_DIR}-lenient", PORT_BASE + 50
FORGETFUL_DIR, FORGETFUL_PORT_BASE = f"{CLUSTER_DIR}-forgetful", PORT_BASE + 60
# Tasks bound to their CPUs, as sites do (the others leave them unbound): base+30, no accounting.
PINNED_DIR, PINNED_PORT_BASE = f"{CLUSTER_DIR}-pinned", PORT_BASE + 30
# A site's limits: MaxArraySize 3 (sweeps split into several arrays) and association limits enforced.
LIMITED_DIR, LIMITED_PORT_BASE, LIMITED_MAX_ARRAY_SIZE = f"{CLUSTER_DIR}-limited", PORT_BASE + 70, 3
# Slurm's own SlurmdTimeout (300 s): a node that dies silently is marked DOWN only after five minutes,
# so the tests of silent nodes cannot lean on Slurm noticing (no accounting) at base+40 (base+80 is
# the forgetful cluster's slurmdbd: a run that started both once lost a test to it). Four nodes, so
# a 2-node job that loses one silently and gets a second drained by Slurm ("Kill task failed": its
# step daemon cannot tell the silent node's srun that its task ended) still finds two, as on a site.
SITE_TIMEOUTS_DIR, SITE_TIMEOUTS_PORT_BASE, SITE_SLURMD_TIMEOUT_S = f"{CLUSTER_DIR}-site", PORT_BASE + 40, 300
SITE_NODES = 4
# The requeue hold is lifted to two seconds from now, not to now: a start in the same second as the
# requeue is refused by Slurm ("Killing non-startable batch JobId=67: Job credential revoked", seen on
# 22.05, which compares whole seconds) and the job ends FAILED with only its first life.
LIFTED_START = "StartTime=now+2"
# HPCTRAIN_TEST_KEEP_CLUSTERS=1 leaves the clusters this run started up at its end (to rerun a test fast).
KEEP_CLUSTERS = os.environ.get("HPCTRAIN_TEST_KEEP_CLUSTERS") == "1"
# Cluster folders this run started (or restarted in another shape): stopped when the run ends.
_started_here: set[str] = set()


def devcluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devcluster", REPO / "scripts" / "devcluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm dev cluster needs root (it installs slurm-wlm and starts slurmctld/slurmd)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no apt-get and no slurmctld: the dev cluster needs Debian/Ubuntu's slurm-wlm"
    return None


def ensure_cluster(directory: str, nodes: int, gpus_per_node: int, port_base: int, **shape: object) -> dict[str, str]:
    """devcluster's ensure_cluster, remembering whether this run started the cluster: a cluster found
    up (a developer's earlier run) is reused and left up; one started here is stopped at the end."""
    module = devcluster()
    paths = module.Paths(Path(directory).absolute())
    controller_before = _controller_pid(module, paths)
    try:
        return module.ensure_cluster(nodes, gpus_per_node, directory, port_base=port_base, **shape)
    finally:
        # Also when the start failed half-way (slurmdbd up, slurmctld not): stop what it left.
        if controller_before is None or _controller_pid(module, paths) != controller_before:
            _started_here.add(directory)


def _controller_pid(module: ModuleType, paths: object) -> int | None:
    return next((pid for pid, name in module.cluster_pids(paths).items() if name == "slurmctld"), None)


def stop_started_clusters() -> list[str]:
    """Stop every cluster this run started (when the test run ends); returns their folders."""
    if KEEP_CLUSTERS or not _started_here:
        return []
    module = devcluster()
    stopped = sorted(_started_here)
    for directory in stopped:
        module.stop(directory)
    _started_here.clear()
    return stopped


# The suite's clusters leave tasks unbound (devcluster's pin_cpus): their fake nodes share this
# machine's CPUs, every node's first CPU is the machine's CPU 0, and bound one-task-a-node jobs all
# ran on that one core (a full run: 8 ranks at 12% of a CPU each, the other CPU 38% idle). CPU
# binding, as sites do it, is proven on a cluster of its own (start_pinned_cluster).
UNBOUND = {"pin_cpus": False}


def start_cluster(*, accounting: bool = True) -> dict[str, str]:
    """The suite's cluster, strict like a site (accounting); accounting=False gives the lenient
    one-node cluster without accounting."""
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    if accounting:
        slurm = ensure_cluster(CLUSTER_DIR, NODES, GPUS_PER_NODE, PORT_BASE, **UNBOUND)
    else:
        slurm = ensure_cluster(LENIENT_DIR, 1, 0, LENIENT_PORT_BASE, with_accounting=False, **UNBOUND)
    return cluster_env(slurm)


def start_pinned_cluster() -> dict[str, str]:
    """3 nodes of 2 CPUs whose tasks are bound to their CPUs (TaskPlugin=task/affinity), as sites
    do; no accounting."""
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    return cluster_env(ensure_cluster(PINNED_DIR, NODES, 0, PINNED_PORT_BASE, with_accounting=False))


def start_forgetful_cluster() -> dict[str, str]:
    """Accounting on, MinJobAge 2 s: scontrol forgets an ended job within seconds, sacct does not."""
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    return cluster_env(ensure_cluster(FORGETFUL_DIR, 2, 0, FORGETFUL_PORT_BASE, min_job_age_s=2, **UNBOUND))


def start_limited_cluster() -> dict[str, str]:
    """Accounting on with limits enforced (AccountingStorageEnforce), MaxArraySize 3, 2 nodes."""
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    slurm = ensure_cluster(
        LIMITED_DIR, 2, 0, LIMITED_PORT_BASE, max_array_size=LIMITED_MAX_ARRAY_SIZE, enforce_limits=True, **UNBOUND
    )
    return cluster_env(slurm)


def start_site_timeouts_cluster() -> dict[str, str]:
    """4 nodes with Slurm's default SlurmdTimeout (300 s), no accounting: `devcluster.py freeze`
    makes a node die silently there."""
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    slurm = ensure_cluster(
        SITE_TIMEOUTS_DIR,
        SITE_NODES,
        0,
        SITE_TIMEOUTS_PORT_BASE,
        with_accounting=False,
        slurmd_timeout_s=SITE_SLURMD_TIMEOUT_S,
        **UNBOUND,
    )
    return cluster_env(slurm)


def cluster_env(slurm: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(slurm)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def submit(env: dict[str, str], run_dir: Path, *overrides: str, multirun: bool = False) -> tuple[list[str], str]:
    """hpctrain-submit for real; returns (job ids, stdout)."""
    command = [sys.executable, "-m", "hpctrain.cli.submit", *(["-m"] if multirun else [])]
    where = f"hydra.sweep.dir={run_dir}" if multirun else f"hydra.run.dir={run_dir}"
    done = subprocess.run(
        [*command, where, "cluster=devcluster", *overrides], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"hpctrain-submit failed:\n{done.stdout}\n{done.stderr}"
    return re.findall(r"^Submitted batch job (\d+)$", done.stdout, re.M), done.stdout


def point_jobs(stdout: str) -> dict[str, str]:
    """hpctrain-submit's `  run dir: DIR (job 36_7)` lines of a sweep queued as arrays: DIR -> id."""
    return dict(re.findall(r"^  run dir: (.*) \(job (\d+_\d+)\)$", stdout, re.M))


def job_field(env: dict[str, str], job_id: str, field: str) -> str | None:
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True)
    match = re.search(rf"\b{field}=(\S+)", done.stdout)
    return match.group(1) if match else None


def job_restarts(env: dict[str, str], job_id: str) -> int | None:
    """How often Slurm requeued the job: scontrol's Restarts; once MinJobAge dropped the record
    there (a long side-by-side test outlives it on a slow machine), sacct --duplicates, which
    lists one record per life (REQUEUED for all but the last)."""
    restarts = job_field(env, job_id, "Restarts")
    if restarts is not None:
        return int(restarts)
    done = subprocess.run(
        ["sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", "JobIDRaw"], env=env, capture_output=True, text=True
    )
    lives = [line for line in done.stdout.splitlines() if line == job_id]
    return len(lives) - 1 if lives else None


def job_state(env: dict[str, str], job_id: str) -> str | None:
    """The job's state from scontrol; once MinJobAge dropped it there, from sacct (with accounting)."""
    state = job_field(env, job_id, "JobState")
    if state is not None:
        return state
    done = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobIDRaw,State"], env=env, capture_output=True, text=True
    )
    for line in done.stdout.splitlines():
        raw_id, _, sacct_state = line.partition("|")
        if raw_id == job_id and sacct_state:
            return sacct_state.split()[0]  # "CANCELLED by 0"
    return None


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_for_state(
    env: dict[str, str], job_id: str, states: set[str], timeout_s: float, lift_holds: bool = False
) -> str:
    """Until the job is in one of `states`. With lift_holds, a job that a requeue left waiting for
    its BeginTime (~120 s) is started at once, however often it requeues (see lift_requeue_hold)."""
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = job_state(env, job_id)
        if state in states:
            return state
        if lift_holds and state == "PENDING" and job_field(env, job_id, "Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", LIFTED_START], env=env, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(
        f"job {job_id} still {state} after {timeout_s:.0f} s, wanted {sorted(states)}\n{why_waiting(env, job_id)}"
    )


def why_waiting(env: dict[str, str], job_id: str) -> str:
    """What Slurm says keeps a job where it is: its Reason and dependency, the nodes' states (a
    node drained by "Kill task failed" keeps a job PENDING for ever), and its story so far; for a
    job waiting on others (Dependency=afternotok:J), theirs too."""
    fields = {name: job_field(env, job_id, name) for name in ("Reason", "Dependency", "ExcNodeList", "BeginTime")}
    nodes = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T %E"], env=env, capture_output=True, text=True)
    told = " ".join(f"{name}={value}" for name, value in fields.items())
    said = [told, "nodes:", nodes.stdout.strip() or nodes.stderr.strip(), job_story(env, job_id)]
    for other in re.findall(r":(\d+)", fields["Dependency"] or ""):
        state, reason = job_field(env, other, "JobState"), job_field(env, other, "Reason")
        said += [f"--- job {job_id} waits on job {other}: JobState={state} Reason={reason}", job_story(env, other)]
    return "\n".join(said)


def wait_finished(env: dict[str, str], job_id: str, timeout_s: float = 300, lift_holds: bool = False) -> str:
    state = wait_for_state(env, job_id, ENDED, timeout_s, lift_holds)
    if state != "COMPLETED":  # pytest shows it when the test fails: what Slurm itself saw
        print(job_story(env, job_id), file=sys.stderr)
    return state


def job_story(env: dict[str, str], job_id: str) -> str:
    """Every life of a job as accounting and slurmctld's log tell it (for failure messages)."""
    lines = [f"--- job {job_id} as Slurm saw it"]
    done = subprocess.run(
        ["sacct", "-n", "-P", "-D", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList,Start,End,Reason"],
        env=env,
        capture_output=True,
        text=True,
    )
    lines.append(done.stdout.strip() or f"sacct: {done.stderr.strip()}")
    log = Path(env.get("SLURM_CONF", "")).parent / "log" / "slurmctld.log"
    if log.is_file():
        pattern = re.compile(rf"(JobId={job_id}|job {job_id}|JobId={job_id}_)\b")
        lines += [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)][-60:]
    return "\n".join(lines)


def job_output(run_dir: Path) -> str:
    """Every job's output, then every keeper's (its own file, written on its node)."""
    files = [*sorted(run_dir.glob("slurm-*.out")), *sorted(run_dir.glob("keeper-*.out"))]
    return "\n".join(p.read_text(errors="replace") for p in files)


def lift_requeue_hold(env: dict[str, str], job_id: str, timeout_s: float = 120) -> None:
    """A requeued job waits ~120 s (Reason=BeginTime); tests start it at once. The product never
    depends on this (it needs a PENDING job and, on a real site, the right to change it)."""
    wait_for_state(env, job_id, {"PENDING"}, timeout_s)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", LIFTED_START], env=env, capture_output=True)


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 300) -> None:
    """Until metrics.jsonl shows a logged step >= `step` (training is under way)."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]
            if lines and lines[-1]["step"] >= step:
                return
        time.sleep(0.3)
    raise AssertionError(f"{run_dir}: no step >= {step} within {timeout_s:.0f} s\n{job_output(run_dir)}")


def events(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def of(kind: str, run_dir: Path) -> list[dict]:
    """The run's events of one kind (`requeue`, `start`, ...), in the journal's order."""
    return [e for e in events(run_dir) if e["event"] == kind]


def with_test_helpers(env: dict[str, str]) -> str:
    """PYTHONPATH that also finds tests/helpers (the job inherits the submitting environment)."""
    return os.pathsep.join(p for p in (str(Path(__file__).parent), env.get("PYTHONPATH", "")) if p)


def wait_for_output(run_dir: Path, text: str, timeout_s: float) -> None:
    """Until the job's output holds `text`. The bound is for a job that never gets there: several
    jobs start at once on a shared machine, and each shell's start takes seconds under load."""
    deadline = time.monotonic() + timeout_s
    while text not in job_output(run_dir):
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s:.0f} s\n{job_output(run_dir)}"
        time.sleep(0.1)


def train_locally(env: dict[str, str], run_dir: Path, *overrides: str) -> None:
    """`hpctrain-train` into run_dir, or a copy of the same run another test trained (below)."""
    Reference(env, run_dir, list(overrides)).trained(timeout_s=900)


# The suffixes of a worker's cluster folders (CLUSTER_DIR and the shapes above).
CLUSTER_KINDS = ("", "-devcluster", "-lenient", "-forgetful", "-limited", "-site", "-pinned")


def suite_cluster_dirs() -> list[str]:
    """Every cluster folder the suite may start, for every worker (scripts/test.sh checks none is left)."""
    return [worker_cluster_dir(number) + kind for number in range(MAX_WORKERS) for kind in CLUSTER_KINDS]


def resume_nodes_drained_by_kill_task_failed() -> list[str]:
    """This worker's cluster nodes that Slurm drained with "Kill task failed", resumed; returns
    what it found (with the slurmd log's reason) for the test that left them so.

    slurmstepd drains a node when a step's end cannot be confirmed within UnkillableStepTimeout
    (60 s): a task that does not die, or, on this 2-core machine under the suite's load, an srun
    too starved to answer (slurmd logs "Socket timed out"). The node stays out of the cluster until
    someone resumes it, as on a site; here the next tests of the module would wait on it for
    nothing, so after each Slurm test it is resumed and said (a warning in the run's summary)."""
    module = devcluster()
    found = []
    for directory in (CLUSTER_DIR + kind for kind in CLUSTER_KINDS):
        paths = module.Paths(Path(directory).absolute())
        if not paths.ctld_pid.exists():
            continue
        env = module.slurm_env(paths)
        listed = subprocess.run(
            ["sinfo", "-h", "-N", "-t", "drain,draining,drained", "-o", "%N|%E"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        for line in sorted(set(listed.stdout.splitlines())):
            node, _, reason = line.partition("|")
            if "Kill task failed" not in reason:
                continue  # a test's own drain (scontrol), left to it
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, capture_output=True)
            log = paths.log / f"slurmd-{node}.log"
            told = (
                [x for x in log.read_text(errors="replace").splitlines() if "NOT ENDING" in x] if log.is_file() else []
            )
            found.append(f"{directory}: {node} drained ({reason}), resumed; {'; '.join(told[-3:])}")
    return found


def running_daemons() -> dict[str, list[str]]:
    """folder -> names of the daemons still running from it (scripts/test.sh checks none is left)."""
    module = devcluster()
    found = {}
    for directory in suite_cluster_dirs():
        names = sorted(module.cluster_pids(module.Paths(Path(directory).absolute())).values())
        if names:
            found[directory] = names
    return found


def node_state(env: dict[str, str], node: str, state: str, reason: str = "hpctrain-test") -> None:
    """`scontrol update nodename=NODE state=STATE` (down, drain, resume), as an administrator sets it."""
    done = subprocess.run(
        ["scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}"],
        env=env,
        capture_output=True,
        text=True,
    )
    # ReturnToService=2 may have brought a downed node back already: resuming it then fails.
    assert done.returncode == 0 or state == "resume", done.stderr


def preempt_everything(env: dict[str, str]) -> str:
    """Submit a 2-second job to the `urgent` partition needing every node exclusively: it
    preempts every job in `batch` (PreemptMode=REQUEUE). Returns its job id."""
    urgent = subprocess.run(
        ["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-N", "3", "-o", "/dev/null", "--wrap", "sleep 2"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return urgent.stdout.strip().split(";")[0]


def set_grace(env: dict[str, str], seconds: int) -> None:
    """The `batch` partition's GraceTime (the time a preempted job has before Slurm's SIGKILL)."""
    subprocess.run(
        ["scontrol", "update", "partitionname=batch", f"GraceTime={seconds}"], env=env, check=True, capture_output=True
    )


class Reference:
    """The uninterrupted run a faulted job must match bit for bit, trained on this machine beside
    the job (`hpctrain-train`, the test helpers importable): started at once, awaited at the end.

    Trained once per suite run for each config: the workers of one pytest-xdist run share a store
    (keyed by the overrides, those of Slurm and the cluster left out: they change where a run
    trains, never its numbers), the first to claim a config trains it there, and every test gets
    its own copy in run_dir. Outside xdist (`-n 0`) each trains its own."""

    def __init__(self, env: dict[str, str], run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        self.shared = _shared_reference(overrides)
        self.output: list[str] = []
        self.waiter: threading.Thread | None = None
        if self.shared is not None and not _claim(self.shared):
            return  # another test trains it: trained() waits for it and copies it
        target = run_dir if self.shared is None else self.shared / "run"
        process = subprocess.Popen(
            [sys.executable, "-m", "hpctrain.cli.train", f"hydra.run.dir={target}", *overrides],
            env={**env, "PYTHONPATH": with_test_helpers(env)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # Awaited by a thread of its own: the tests that share it learn its end even when the one
        # that started it failed before asking.
        self.waiter = threading.Thread(target=self._wait, args=(process,), daemon=True)
        self.waiter.start()

    def _wait(self, process: subprocess.Popen[str]) -> None:
        output, _ = process.communicate()
        self.output.append(f"exit {process.returncode}\n{output}")
        if self.shared is not None:
            (self.shared / ("done" if process.returncode == 0 else "failed")).write_text(output)

    def trained(self, timeout_s: float = 600) -> Path:
        """The run dir, once the run ended well (asserted, its output shown otherwise)."""
        if self.waiter is not None:
            self.waiter.join(timeout_s)
            assert self.output, f"the reference run took over {timeout_s} s"
            assert self.output[0].startswith("exit 0\n"), self.output[0][-3000:]
        if self.shared is not None:
            deadline = time.monotonic() + timeout_s
            while not (self.shared / "done").exists():
                failed = self.shared / "failed"
                assert not failed.exists(), failed.read_text()[-3000:]
                assert time.monotonic() < deadline, f"the shared reference in {self.shared} took over {timeout_s} s"
                time.sleep(0.2)
            shutil.copytree(self.shared / "run", self.run_dir, dirs_exist_ok=True)
        return self.run_dir


def references_of_this_run() -> Path | None:
    """The store of this pytest-xdist run's shared reference runs (None: no xdist, none shared)."""
    import tempfile

    # Both lanes of scripts/test.sh share one store (HPCTRAIN_TEST_RUN_ID); a lone xdist run its own.
    run = os.environ.get("HPCTRAIN_TEST_RUN_ID") or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    return Path(tempfile.gettempdir()) / "hpctrain-references" / run


def _shared_reference(overrides: list[str]) -> Path | None:
    """Where the workers of this pytest-xdist run share the run of these overrides (None: no xdist)."""
    import hashlib
    import json

    store = references_of_this_run()
    if store is None:
        return None
    kept = [o for o in overrides if not o.startswith(("slurm.", "cluster=", "hydra."))]
    key = hashlib.sha1(json.dumps(kept).encode()).hexdigest()[:16]
    return store / key


def _claim(shared: Path) -> bool:
    """True for the one caller that is to train the shared run (mkdir is atomic)."""
    shared.parent.mkdir(parents=True, exist_ok=True)
    try:
        shared.mkdir()
    except FileExistsError:
        return False
    return True


def current_job(run_dir: Path) -> str:
    """The job that carries the run on: the first, or the one a guardian submitted since."""
    import json

    return json.loads((run_dir / "submission.json").read_text())["job_id"]


def submission_field(run_dir: Path, name: str) -> str | None:
    import json

    return json.loads((run_dir / "submission.json").read_text()).get(name)


def run_ends(env: dict[str, str], run_dir: Path, first_job: str, timeout_s: float) -> tuple[str, str]:
    """Until the job that carries the run on has ended, requeue holds lifted. Returns (the first
    job's end state, the last job's end state)."""
    from hpctrain.run.paths import RunDir

    deadline = time.monotonic() + timeout_s
    first_state = wait_for_state(env, first_job, ENDED, timeout_s, lift_holds=True)
    while True:
        job = current_job(run_dir)
        state = wait_finished(env, job, max(1.0, deadline - time.monotonic()), lift_holds=True)
        # The job and its guardian read together, once it ended: read apart, a guardian that had
        # submitted the run again in between gave the next job's guardian, which waits on a job
        # whose requeue holds no one lifts (a guardian is recorded after its job, never before).
        submission = RunDir(run_dir).read_submission()
        if submission.get("job_id") != job:
            continue  # its guardian has submitted the run again already
        guardian = submission.get("guardian_job_id")
        # The guardian may still be about to submit the run again: look once more after it ran.
        if guardian:
            wait_for_state(env, guardian, {*ENDED, "CANCELLED"}, max(1.0, deadline - time.monotonic()))
        if current_job(run_dir) == job:
            return first_state, state


def cancel_run(env: dict[str, str], run_dir: Path) -> None:
    """scancel what a run may have left queued or running (its job, its guardian)."""
    if (run_dir / "submission.json").exists():
        left = [current_job(run_dir), submission_field(run_dir, "guardian_job_id") or ""]
        subprocess.run(["scancel", *filter(None, left)], env=env, capture_output=True)


def wait_at_gate(env: dict[str, str], job_id: str, reached: Path, timeout_s: float) -> None:
    """Until a process of the job is held at a fault point's gate (hpctrain.faults, gate:S),
    lifting the job's requeue holds meanwhile (a gate of a later life)."""
    deadline = time.monotonic() + timeout_s
    while not reached.exists():
        assert time.monotonic() < deadline, f"job {job_id}: {reached.name} not within {timeout_s:.0f} s"
        state = job_state(env, job_id)
        if state == "PENDING" and job_field(env, job_id, "Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", LIFTED_START], env=env, capture_output=True)
        assert state not in ENDED, f"job {job_id} ended {state} before {reached.name}"
        time.sleep(0.3)


def same_weights(a: Path, b: Path) -> bool:
    """model.pt of two run dirs, equal tensor for tensor and bit for bit."""
    import torch

    wa, wb = torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


if __name__ == "__main__":
    # `python tests/slurmtools.py running`: prints the suite's clusters still running, exit 1 if any.
    left = running_daemons()
    for directory, names in left.items():
        print(f"{directory}: {' '.join(names)}")
    sys.exit(1 if left else 0)


def first_step_after(run_dir: Path, when: float, timeout_s: float) -> dict:
    """The first metrics record logged after `when` (a UNIX time), waited for."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        later = [r for r in map(json.loads, filter(None, lines)) if (r.get("time") or 0) > when]
        if later:
            return later[0]
        time.sleep(0.2)
    raise AssertionError(f"no step trained within {timeout_s:.0f} s of {when:.1f}:\n{job_output(run_dir)[-3000:]}")


def signal_batch(env: dict[str, str], job_id: str, signal: str = "USR2", timeout_s: float = 60) -> None:
    """`scancel --batch --signal=SIGNAL JOB`: the time-limit warning, sent now to the batch
    shell. Tried again while it fails: under load Slurm answered "Invalid job id specified" for
    running jobs (an array task, a plain job) in fresh-clone runs, or timed out. Raises with
    Slurm's own words when it never succeeds."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = subprocess.run(
            ["scancel", "--batch", f"--signal={signal}", job_id], env=env, capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"scancel --batch --signal={signal} {job_id}: {done.returncode} {done.stderr}")
        time.sleep(1)
