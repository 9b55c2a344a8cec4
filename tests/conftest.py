"""Shared fixtures: run `hpctrain-train` as a real subprocess and read what it left behind.

Training runs are the slow part of the suite, so `train_run` keeps them for the whole session
under a label: tests that need the same run (the default 2-process run, the 1 x 64 MLP run...)
share one subprocess instead of training twice. `train_run.prefetch(...)` starts a module's runs
side by side (a bounded number of training processes at a time), which fills the time each run
spends importing and spawning; the results do not depend on it (one thread per process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import load_gate
import pytest
import straggler_audit
import suite_order
import torch

from hpctrain.run.jsonlines import read_jsonl

# Variables that would make the launcher take another path (torchrun, Slurm) or add threads.
_FOREIGN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
)

# Idle OpenMP threads sleep instead of spinning. The suite runs more busy threads than this machine
# has cores (several workers, Slurm's fake nodes), and there a 2-thread training run's spinning
# threads burnt up to 6 times the CPU of its work (13-31 s against 5 s for 200 steps). The numbers
# a run computes do not depend on it. Every process the tests start inherits it, Slurm jobs too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Bytecode caches written, whatever PYTHONDONTWRITEBYTECODE says (set on many container images).
# The suite starts some 300 Python processes (every CLI call, launcher, forkserver and Slurm
# step): without the caches each compiled hpctrain's modules from source, and pytest rewrote
# every test module's asserts again in each worker. The caches land in __pycache__ folders,
# which git ignores.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# torchvision (timm's dependency, and imported by transformers whenever it is installed) cannot
# import against the pinned CPU torch here: fixtures/cpu_torchvision/torchvision_cpu.py says why
# and lets it. Armed in this process; a test of those libraries puts the folder on the PYTHONPATH
# of what it starts (library_env).
CPU_TORCHVISION = Path(__file__).parent / "fixtures" / "cpu_torchvision"
sys.path.insert(0, str(CPU_TORCHVISION))
import torchvision_cpu  # noqa: E402

torchvision_cpu.install()


def library_env() -> dict[str, str]:
    """The environment of a run that builds a transformers or timm model: this machine's, with one
    intra-op thread, no Slurm or torchrun variables and torchvision importable (above)."""
    return train_env(CPU_TORCHVISION)


RUN_TIMEOUT_S = 300
# Training processes running at once during a prefetch (the launcher processes mostly wait).
MAX_PARALLEL_PROCS = 4


def train_env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    return env


def train_command(run_dir: Path, overrides: tuple[str, ...] | list[str]) -> list[str]:
    return [sys.executable, "-m", "hpctrain.cli.train", *overrides, f"hydra.run.dir={run_dir}"]


def run_train(
    run_dir: Path,
    overrides: tuple[str, ...] | list[str],
    pythonpath: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`hpctrain-train OVERRIDES hydra.run.dir=RUN_DIR`, from RUN_DIR's parent (nothing lands
    in the repository), with one intra-op thread per process; `extra_env` added to its env."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        train_command(run_dir, overrides),
        cwd=run_dir.parent,
        env={**train_env(pythonpath), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    """The end of a run's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, describe(proc)


def load_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True, map_location="cpu")


def events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == name]


def finish(run_dir: Path) -> dict:
    done = events(run_dir, "finish")
    assert len(done) == 1, f"expected one finish event in {run_dir}, got {done}"
    return done[0]


@dataclass(frozen=True)
class Spec:
    label: str
    overrides: tuple[str, ...]
    pythonpath: Path | None = None

    @property
    def nprocs(self) -> int:
        for override in self.overrides:
            if override.startswith("trainer.nprocs="):
                return max(1, int(override.split("=", 1)[1]))
        return 1


class TrainRuns:
    """`runs(label, *overrides)` -> (CompletedProcess, run_dir), trained once per test run.

    The label names the run: two labels with the same overrides train twice (the determinism
    test needs that); a label asked for again returns the first result. Asking for a label with
    other overrides than the first time is a test bug and fails. Under pytest-xdist a run is
    shared by the workers too (tests only read a run they did not train): the first worker to
    claim its label trains it, the others wait for its result. A run with a PYTHONPATH of its
    own (a folder of one worker) stays that worker's."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.specs: dict[str, Spec] = {}
        self.results: dict[str, tuple[subprocess.CompletedProcess[str], Path]] = {}

    def __call__(
        self, label: str, *overrides: str, pythonpath: Path | None = None
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        self.prefetch(Spec(label, tuple(overrides), pythonpath))
        return self.results[label]

    def prefetch(self, *specs: Spec) -> None:
        """Train every spec not trained yet, up to MAX_PARALLEL_PROCS training processes at once."""
        todo: list[Spec] = []
        for spec in specs:
            known = self.specs.setdefault(spec.label, spec)
            assert known == spec, f"run {spec.label!r} was first asked for as {known}, now {spec}"
            if spec.label not in self.results and spec not in todo:
                todo.append(spec)
        # Another worker's claim: wait for its result instead of training the run again.
        elsewhere = [spec for spec in todo if not self._claim(spec)]
        todo = [spec for spec in todo if spec not in elsewhere]
        running: list[tuple[Spec, subprocess.Popen[str], Path, float]] = []
        while todo or running:
            busy = sum(spec.nprocs for spec, *_ in running)
            while todo and (not running or busy + todo[0].nprocs <= MAX_PARALLEL_PROCS):
                spec = todo.pop(0)
                running.append((spec, *self._start(spec), time.monotonic()))
                busy += spec.nprocs
            time.sleep(0.1)
            for entry in list(running):
                spec, popen, run_dir, started = entry
                if popen.poll() is None and time.monotonic() - started < RUN_TIMEOUT_S:
                    continue
                if popen.poll() is None:  # ran too long: stop the launcher and its workers
                    os.killpg(popen.pid, signal.SIGKILL)
                    popen.wait()
                running.remove(entry)
                self.results[spec.label] = (self._collect(spec, popen, run_dir), run_dir)
                self._publish(spec)
        for spec in elsewhere:
            self.results[spec.label] = self._await(spec)

    def _shared(self, spec: Spec) -> Path | None:
        """Where workers share `spec`'s run, or None when it is this process's own."""
        if "PYTEST_XDIST_WORKER" not in os.environ or spec.pythonpath is not None:
            return None
        return self.tmp_path_factory.getbasetemp().parent / "shared-train-runs" / spec.label

    def _claim(self, spec: Spec) -> bool:
        """True when this process is to train `spec` (no other worker claimed it first)."""
        shared = self._shared(spec)
        if shared is None:
            return True
        shared.parent.mkdir(exist_ok=True)
        try:
            self._claims(shared).mkdir()  # atomic: exactly one worker makes it
        except FileExistsError:
            return False
        (self._claims(shared) / "overrides.json").write_text(json.dumps(list(spec.overrides)))
        shared.mkdir()
        return True

    @staticmethod
    def _claims(shared: Path) -> Path:
        """The claim and result of a shared run, beside its folder (which holds what a test reads)."""
        return shared.with_name(f"{shared.name}.claim")

    def _publish(self, spec: Spec) -> None:
        shared = self._shared(spec)
        if shared is not None:
            proc, _ = self.results[spec.label]
            claims = self._claims(shared)
            (claims / "result.tmp").write_text(json.dumps({"args": proc.args, "returncode": proc.returncode}))
            (claims / "result.tmp").replace(claims / "result.json")

    def _await(self, spec: Spec) -> tuple[subprocess.CompletedProcess[str], Path]:
        shared = self._shared(spec)
        assert shared is not None
        result = self._claims(shared) / "result.json"
        deadline = time.monotonic() + RUN_TIMEOUT_S + 60  # its training, begun before we asked
        while not result.exists():
            assert time.monotonic() < deadline, f"no worker finished the shared run {spec.label!r} in time"
            time.sleep(0.2)
        claimed = json.loads((self._claims(shared) / "overrides.json").read_text())
        assert claimed == list(spec.overrides), f"run {spec.label!r} was claimed as {claimed}, now {spec}"
        done = json.loads(result.read_text())
        return self._collect_in(shared, done["args"], done["returncode"]), shared / "run"

    def _start(self, spec: Spec) -> tuple[subprocess.Popen[str], Path]:
        root = self._shared(spec) or self.tmp_path_factory.mktemp(spec.label)
        run_dir = root / "run"
        with open(root / "stdout.txt", "w") as out, open(root / "stderr.txt", "w") as err:
            popen = subprocess.Popen(
                train_command(run_dir, spec.overrides),
                cwd=root,
                env=train_env(spec.pythonpath),
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,  # its own process group, so a timeout stops the workers too
            )
        return popen, run_dir

    @classmethod
    def _collect(cls, spec: Spec, popen: subprocess.Popen[str], run_dir: Path) -> subprocess.CompletedProcess[str]:
        return cls._collect_in(run_dir.parent, popen.args, popen.returncode)

    @staticmethod
    def _collect_in(root: Path, args: object, returncode: int) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            args, returncode, (root / "stdout.txt").read_text(), (root / "stderr.txt").read_text()
        )


@pytest.fixture(scope="session")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> TrainRuns:
    return TrainRuns(tmp_path_factory)


# The README quickstart on two processes: default config, `trainer.nprocs=2`.
DEFAULT_RUN = Spec("default-2proc", ("trainer.nprocs=2",))


@pytest.fixture(scope="session")
def default_run(train_run: TrainRuns) -> Path:
    proc, run_dir = train_run(DEFAULT_RUN.label, *DEFAULT_RUN.overrides)
    assert_ok(proc)
    return run_dir


# A user's own model, outside hpctrain: plugged in with model._target_=mymod.Net.
USER_MODULE = '''
import torch
from torch import nn


class Net(nn.Module):
    """Takes no arguments: every argument of the default model must be dropped."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class WideNet(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.width = width
        self.hidden = nn.Linear(64, width)
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x.flatten(1))))


def create(name: str = "wide", num_classes: int = 10, **kwargs):
    """A factory taking anything, as timm.create_model does: it must get none of the default
    model's arguments (it would pass them on to a class that refuses them)."""
    if kwargs:
        raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
    return WideNet(width=num_classes)
'''


@pytest.fixture(scope="session")
def user_module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `mymod.py`, importable only once it is put on the path."""
    folder = tmp_path_factory.mktemp("usercode")
    (folder / "mymod.py").write_text(USER_MODULE)
    return folder


@pytest.fixture(autouse=True)
def _no_node_left_drained(request: pytest.FixtureRequest):
    """After a Slurm test, a node Slurm drained for "Kill task failed" is resumed and said, so
    the module's next tests do not wait on it (slurmtools.resume_nodes_drained_by_kill_task_failed)."""
    yield
    if request.node.get_closest_marker("slurm") is None:
        return
    import warnings

    import slurmtools

    for said in slurmtools.resume_nodes_drained_by_kill_task_failed():
        warnings.warn(f"{request.node.nodeid}: {said}", stacklevel=1)


# The folders of the tests marked `stragglers` (they slow a rank on purpose), in this worker.
_slowed_on_purpose: list[Path] = []


@pytest.fixture(autouse=True)
def _note_a_rank_slowed_on_purpose(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("stragglers") is not None:
        _slowed_on_purpose.append(request.getfixturevalue("tmp_path"))


@pytest.fixture(scope="session", autouse=True)
def _no_false_straggler(tmp_path_factory: pytest.TempPathFactory):
    """At the end of the worker's session, every journal its tests left is read: a `straggler` that
    no test marked `stragglers` made is an error (tests/straggler_audit.py)."""
    yield
    import slurmtools

    base = tmp_path_factory.getbasetemp()
    roots = [base, base.parent / "shared-train-runs"]
    references = slurmtools.references_of_this_run()
    if references is not None:
        roots.append(references)
    false = straggler_audit.false_stragglers(roots, expected=_slowed_on_purpose)
    if false:
        pytest.fail("a straggler was named where no test slowed a rank:\n" + "\n".join(false), pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """HPCTRAIN_TEST_LANE=main or waiting (scripts/test.sh) keeps that lane's modules only
    (tests/suite_order.py WAITING_LANE). On a pytest-xdist worker, the longest modules first;
    every worker orders alike, as xdist requires. A run without xdist keeps the files' order.
    Last of the hooks: `-m` has deselected its tests by then, so a module weighs what it runs
    (first, the Slurm tests of a module it skipped put it ahead of the quick subset's longest)."""
    lane = os.environ.get("HPCTRAIN_TEST_LANE")
    if lane:
        if lane not in suite_order.LANES:
            raise pytest.UsageError(f"HPCTRAIN_TEST_LANE={lane!r}: one of {', '.join(suite_order.LANES)}")
        other = [item for item in items if suite_order.lane_of(item.nodeid) != lane]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if suite_order.lane_of(item.nodeid) == lane]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = suite_order.longest_first(items, suite_order.read_measured())


# Seconds each test took in this run (its setup, call and teardown, less its wait at the load
# gate), for HPCTRAIN_TEST_STORE_SECONDS=1, which writes them to tests/test_seconds.json.
_test_seconds: dict[str, float] = {}
_gate_waits: dict[str, float] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Slurm or slow test starts once the machine has room (tests/load_gate.py): before its
    fixtures, which may start training runs of their own."""
    if not any(item.get_closest_marker(name) for name in load_gate.HEAVY_MARKERS):
        return
    per_core = load_gate.per_core_from_env()
    if per_core == 0:
        return
    cores = len(os.sched_getaffinity(0))
    waited = load_gate.take_turn(load_gate.max_load(cores, per_core), calm_load=float(cores))
    if waited >= load_gate.POLL_S:
        # In the report, which pytest-xdist carries to the process that writes the summary.
        item.user_properties.append((GATE_WAIT_PROPERTY, round(waited, 1)))


GATE_WAIT_PROPERTY = "load_gate_wait_s"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    waits = (float(v) for k, v in report.user_properties if k == GATE_WAIT_PROPERTY)
    waited = sum(waits) if report.when == "setup" else 0.0
    if waited:
        _gate_waits[report.nodeid] = waited
    _test_seconds[report.nodeid] = _test_seconds.get(report.nodeid, 0.0) + report.duration - waited


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long heavy tests waited for room, so a slow run says where its time went."""
    if _gate_waits:
        waits = sorted(_gate_waits.values())
        terminalreporter.write_line(
            f"load gate: {len(waits)} tests waited for the load to fall, {sum(waits):.0f} s in all "
            f"(longest {waits[-1]:.0f} s)"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the dev clusters this run started (their slurmctld, slurmd, slurmdbd and mariadbd), so a
    test run leaves no daemons behind. A cluster that was already up when the run began (a developer's)
    is reused and left up; HPCTRAIN_TEST_KEEP_CLUSTERS=1 keeps the started ones too. Under xdist each
    worker stops its own."""
    import slurmtools

    stopped = slurmtools.stop_started_clusters()
    if stopped:
        session.config.get_terminal_writer().line(f"stopped the dev clusters this run started: {', '.join(stopped)}")
    if os.environ.get("HPCTRAIN_TEST_STORE_SECONDS") == "1" and not os.environ.get("PYTEST_XDIST_WORKER"):
        suite_order.store_measured(_test_seconds)
