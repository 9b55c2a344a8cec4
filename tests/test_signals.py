"""Real signals to real `hpctrain-train` runs: save, exit with 128+signal, resume bit-identically.

Every run here is a real subprocess (`python -m hpctrain.cli.train`) in a session of its own, so
the test can signal the launcher alone (a `kill`, a scheduler's preemption) or its whole process
group (Ctrl-C in a terminal), and check afterwards that no process of the run is left behind.

The proof of exactness: a run stopped mid-epoch and started again with the same command and run
dir ends with a model.pt equal, tensor for tensor and bit for bit, to an uninterrupted run of the
same config. The uninterrupted reference is trained once for the module.

Nothing here sleeps for correctness: the tests poll metrics.jsonl until the run is past the step
they want, then signal; waits are bounded by generous deadlines.

Time: every launch costs seconds of CPU (the imports) and every step more, so runs are shared.
One run is stopped three times, each time resumed in place with the same command: by SIGTERM (a
preemption), then by Ctrl-C to its process group, then by SIGUSR2 (the time-limit warning), then
trained to the end (the SIGTERM, Ctrl-C, SIGUSR2 and stopped-three-times tests read it). A copy
of its run dir as the SIGTERM left it, with the newest checkpoint truncated, resumes too (the
torn test). Runs nobody signals (the reference, the last resumes) train in one background thread
beside the run the current test signals.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import assert_ok, describe, events, finish, load_weights, run_train, train_env

from hpctrain.checkpoint import store
from hpctrain.run.jsonlines import read_jsonl

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux signals and /proc"),
]

MAX_STEPS = 400  # three stops, each landing tens of steps after its signal on a quiet machine, and room after
STEPS_PER_EPOCH = 22  # digits: 1437 training images at 32 per process x 2 processes
STOP_AFTER = 40  # signal once metrics.jsonl shows a step at least this far into the run
BASE = (f"trainer.max_steps={MAX_STEPS}", "trainer.log_every=5", "trainer.eval_every=0")
TWO_PROCS = (*BASE, "trainer.ckpt_every=0", "trainer.nprocs=2")
TWO_PROCS_PERIODIC = (*BASE, "trainer.ckpt_every=10", "trainer.nprocs=2")
ONE_PROC = (*BASE, "trainer.ckpt_every=0", "trainer.nprocs=1")

START_TIMEOUT_S = 300  # from launch to the wanted step, on a busy two-core machine
STOP_TIMEOUT_S = 180  # from the signal to the launcher's exit
REAP_TIMEOUT_S = 60  # from the launcher's exit to the last process of its group gone


# ---- processes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    start_time: int  # clock ticks since boot: tells a pid apart from a later one reusing it
    state: str
    pgrp: int
    cmdline: str
    ppid: int = 0


def _proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return Proc(pid, int(fields[19]), fields[0], int(fields[2]), cmdline.strip(), ppid=int(fields[1]))


def _group(pgid: int) -> list[Proc]:
    """The live (not zombie) processes of a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = _proc(int(entry.name))
            if proc is not None and proc.pgrp == pgid and proc.state not in ("Z", "X"):
                found.append(proc)
    return found


def _alive(proc: Proc) -> bool:
    now = _proc(proc.pid)
    return now is not None and now.start_time == proc.start_time and now.state not in ("Z", "X")


@dataclass
class Stopped:
    """What a run that was signalled left: its exit, output, processes and journal."""

    run_dir: Path
    returncode: int | None
    output: str
    workers: list[Proc]  # the spawned training processes, seen just before the signal
    leftovers: list[Proc]  # processes of the run's group still alive after the launcher exited
    signalled_at_step: int
    new_events: list[dict] = field(default_factory=list)  # events.jsonl lines this run added
    # The run dir as the stop left it (read at once: a background resume may change it later).
    checkpoint_steps: list[int] = field(default_factory=list)  # complete checkpoints, newest first
    newest_meta: dict | None = None  # the newest checkpoint's .json, if its .pt verifies
    newest_train: dict | None = None  # ... and the TrainState and rank count inside it
    newest_ranks: int = 0
    has_model: bool = False

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- output ---\n{self.output[-4000:]}"

    def checkpoints(self) -> list[dict]:
        return [e for e in self.new_events if e.get("event") == "checkpoint"]

    def forced_step(self) -> int:
        """The step of the signal-forced (non-periodic) checkpoint, 0 if there is none."""
        return next((c["step"] for c in reversed(self.checkpoints()) if c["reason"] != "periodic"), 0)


def _max_step(path: Path, skip: int) -> int:
    rows = read_jsonl(path)[skip:]
    return max((int(r.get("step", 0)) for r in rows), default=0)


def run_and_signal(
    run_dir: Path, overrides: tuple[str, ...], signum: int, *, after: int, whole_group: bool = False, nprocs: int = 2
) -> Stopped:
    """Start `hpctrain-train OVERRIDES hydra.run.dir=RUN_DIR`; once metrics.jsonl shows step
    `after` (a line this run wrote), send `signum` to the launcher (or to its whole process group,
    as Ctrl-C in a terminal does) and wait for everything to exit."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    metrics, journal = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    old_metrics, old_events = len(read_jsonl(metrics)), len(read_jsonl(journal))
    log_path = run_dir.parent / f"{run_dir.name}-{time.monotonic_ns()}.log"
    command = [sys.executable, "-m", "hpctrain.cli.train", *overrides, f"hydra.run.dir={run_dir}"]
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(
            command, cwd=run_dir.parent, env=train_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    pgid = launcher.pid  # a new session: the launcher leads its own process group
    workers: list[Proc] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while (step := _max_step(metrics, old_metrics)) < after:
            if launcher.poll() is not None:
                pytest.fail(f"the run ended before step {after}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step {after} within {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.05)
        # The ranks: forked by the launcher's rank server (hpctrain.process.rank_server), its children.
        group = _group(pgid)
        servers = {p.pid for p in group if p.ppid == launcher.pid and "forkserver" in p.cmdline}
        workers = [p for p in group if p.ppid in servers]
        if whole_group:
            os.killpg(pgid, signum)
        else:
            os.kill(launcher.pid, signum)
        try:
            returncode: int | None = launcher.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while (leftovers := _group(pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        # Whatever happened, nothing of this run outlives the test (the group is ours alone).
        if launcher.poll() is None or _group(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            launcher.wait(timeout=30)
    stopped = Stopped(
        run_dir=run_dir,
        returncode=returncode,
        output=log_path.read_text(),
        workers=workers,
        leftovers=leftovers,
        signalled_at_step=step,
        new_events=read_jsonl(journal)[old_events:],
        has_model=(run_dir / "model.pt").exists(),
    )
    found = store.entries(run_dir / "checkpoints")
    stopped.checkpoint_steps = [e.step for e in found]
    if found:
        try:
            stopped.newest_meta = store.verify(found[0])
            state = torch.load(found[0].data, map_location="cpu", weights_only=True)
            stopped.newest_train, stopped.newest_ranks = state["train"], len(state["rng"])
        except Exception as error:  # the checks say the newest is unusable
            stopped.output += f"\n[test] newest checkpoint {found[0].data.name} is unusable: {error}"
    return stopped


# ---- checks -----------------------------------------------------------------------------------


def assert_bit_identical(run_dir: Path, reference: dict[str, torch.Tensor]) -> None:
    weights = load_weights(run_dir)
    assert weights.keys() == reference.keys()
    differing = [key for key in reference if not torch.equal(weights[key], reference[key])]
    assert not differing, f"{run_dir}/model.pt differs from the uninterrupted run in {differing}"


def assert_stopped_and_saved(stopped: Stopped, reason: str, signum: int, nprocs: int = 2) -> int:
    """The run saved for `reason` after the signal and mid-run, exited 128+signum and left no
    process behind. Returns the step it saved."""
    assert stopped.returncode == 128 + signum, stopped.describe()
    saved = stopped.checkpoints()
    forced = [c for c in saved if c["reason"] != "periodic"]
    assert [c["reason"] for c in forced] == [reason], f"{saved}\n{stopped.describe()}"
    assert saved[-1] is forced[0], "the forced checkpoint is the run's last"
    step = forced[0]["step"]
    # The ranks' agreement is journaled first: one `stop`, same step and reason, before the save.
    stops = [e for e in stopped.new_events if e.get("event") == "stop"]
    assert [(e["step"], e["reason"]) for e in stops] == [(step, reason)], stopped.new_events
    assert stopped.new_events.index(stops[0]) < stopped.new_events.index(forced[0])
    assert stopped.signalled_at_step < step < MAX_STEPS, f"saved at {step}, signalled at {stopped.signalled_at_step}"
    assert forced[0]["blocking_s"] >= 0 and forced[0]["write_s"] >= 0
    assert not [e for e in stopped.new_events if e.get("event") == "finish"]
    assert not stopped.has_model, "a stopped run has no final weights yet"

    # The newest checkpoint on disk is that one, whole, and knows where in the epoch the run stood.
    assert stopped.checkpoint_steps[:1] == [step], stopped.checkpoint_steps
    assert stopped.newest_meta is not None and stopped.newest_train is not None, stopped.describe()
    assert stopped.newest_meta["reason"] == reason and stopped.newest_meta["step"] == step
    train = stopped.newest_train
    assert train["step"] == step
    assert train["epoch"] * STEPS_PER_EPOCH + train["batch_in_epoch"] == step, train
    assert 0 <= train["batch_in_epoch"] <= STEPS_PER_EPOCH, train
    assert stopped.newest_ranks == nprocs  # every rank's generators

    if nprocs > 1:
        assert len(stopped.workers) == nprocs, f"expected {nprocs} training processes, saw {stopped.workers}"
    assert not stopped.leftovers, f"processes outlived the launcher: {stopped.leftovers}"
    assert not any(_alive(p) for p in stopped.workers)
    return step


def assert_resumed(run_dir: Path, proc: subprocess.CompletedProcess[str], from_steps: list[int]) -> None:
    assert_ok(proc)
    starts = [e["resumed_from_step"] for e in events(run_dir, "start")]
    assert starts == [0, *from_steps], starts
    assert f"resumed from step {from_steps[-1]} " in proc.stdout, describe(proc)
    assert finish(run_dir)["step"] == MAX_STEPS
    last = events(run_dir, "checkpoint")[-1]
    assert (last["step"], last["reason"]) == (MAX_STEPS, "final")
    assert not list(run_dir.rglob("*.tmp"))


def forced_checkpoints(run_dir: Path) -> list[tuple[int, str]]:
    return [(c["step"], c["reason"]) for c in events(run_dir, "checkpoint") if c["reason"] != "periodic"]


# ---- shared runs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def background() -> Iterator[ThreadPoolExecutor]:
    """Runs nobody signals go here, one at a time, beside the run the current test drives."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-run")
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def reference_future(
    background: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Future[subprocess.CompletedProcess[str]]]:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    return run_dir, background.submit(run_train, run_dir, TWO_PROCS)


@pytest.fixture(scope="module")
def reference_run(reference_future: tuple[Path, Future[subprocess.CompletedProcess[str]]]) -> Path:
    """The uninterrupted 2-process run (only a final checkpoint) every stopped run must equal."""
    run_dir, future = reference_future
    assert_ok(future.result())
    assert [e["reason"] for e in events(run_dir, "checkpoint")] == ["final"]
    return run_dir


@pytest.fixture(scope="module")
def reference(reference_run: Path) -> dict[str, torch.Tensor]:
    return load_weights(reference_run)


@dataclass
class Preempted:
    """A 2-process run with periodic checkpoints, stopped by SIGTERM to the launcher (a `kill`,
    a preemption), and a copy of its run dir with the newest checkpoint truncated, resumed."""

    stopped: Stopped
    torn_dir: Path  # a copy whose newest .pt was truncated, then resumed:
    torn_resumed: Future[subprocess.CompletedProcess[str]] | None
    torn_step: int = 0  # the newest checkpoint, truncated
    fallback_step: int = 0  # the one before it


@pytest.fixture(scope="module")
def preempted(
    tmp_path_factory: pytest.TempPathFactory,
    background: ThreadPoolExecutor,
    reference_future: tuple[Path, Future[subprocess.CompletedProcess[str]]],  # trains meanwhile
) -> Preempted:
    run_dir = tmp_path_factory.mktemp("preempted") / "run"
    stopped = run_and_signal(run_dir, TWO_PROCS_PERIODIC, signal.SIGTERM, after=STOP_AFTER)
    torn_dir = tmp_path_factory.mktemp("torn") / "run"
    shutil.copytree(run_dir, torn_dir, symlinks=True)
    result = Preempted(stopped, torn_dir, None)
    if stopped.returncode != 128 + signal.SIGTERM or len(stopped.checkpoint_steps) < 2:
        return result  # the tests say what went wrong; nothing to resume
    newest, older = store.entries(torn_dir / "checkpoints")[:2]
    with open(newest.data, "r+b") as file:  # as if the newest's write had been cut short
        file.truncate(newest.data.stat().st_size // 2)
    result.torn_step, result.fallback_step = newest.step, older.step
    result.torn_resumed = background.submit(run_train, torn_dir, TWO_PROCS_PERIODIC)
    return result


@dataclass
class Stopped3:
    """The preempted run resumed in place and stopped again, twice, then trained to the end."""

    first: int  # the step the SIGTERM saved
    ctrl_c: Stopped  # resumed, stopped by SIGINT to its whole process group
    usr2: Stopped | None  # resumed again, stopped by SIGUSR2 to the launcher (the time limit)
    final: Future[subprocess.CompletedProcess[str]] | None  # resumed a third time, to the end


@pytest.fixture(scope="module")
def stopped3(preempted: Preempted, background: ThreadPoolExecutor) -> Stopped3:
    run_dir = preempted.stopped.run_dir
    first = preempted.stopped.forced_step()
    result = Stopped3(
        first,
        run_and_signal(run_dir, TWO_PROCS_PERIODIC, signal.SIGINT, after=first + STOP_AFTER, whole_group=True),
        None,
        None,
    )
    if result.ctrl_c.returncode != 128 + signal.SIGINT:
        return result
    second = result.ctrl_c.forced_step()
    result.usr2 = run_and_signal(run_dir, TWO_PROCS_PERIODIC, signal.SIGUSR2, after=second + STOP_AFTER)
    if result.usr2.returncode == 128 + signal.SIGUSR2:
        result.final = background.submit(run_train, run_dir, TWO_PROCS_PERIODIC)
    return result


# The tests that drive a run of their own come first, those that read background runs last: the
# runs in `background` train meanwhile.

# ---- Ctrl-C ------------------------------------------------------------------------------------


def test_ctrl_c_saves_as_interrupt_and_leaves_no_process(stopped3: Stopped3) -> None:
    stopped = stopped3.ctrl_c
    assert stopped.returncode != 0, stopped.describe()
    k2 = assert_stopped_and_saved(stopped, "interrupt", signal.SIGINT)
    assert k2 > stopped3.first > 0
    starts = [e for e in stopped.new_events if e.get("event") == "start"]
    assert [e["resumed_from_step"] for e in starts] == [stopped3.first]


def test_a_killed_launcher_takes_its_ranks_down_saving_as_an_interrupt(tmp_path: Path) -> None:
    """SIGKILL to the launcher alone (an OOM kill, a closed terminal's last resort): nobody
    forwards anything, yet no rank trains on orphaned. Its rank server sees the launcher gone and
    leaves, and each rank's parent-death signal (SIGINT) makes it save as an interrupt."""
    stopped = run_and_signal(tmp_path / "run", TWO_PROCS, signal.SIGKILL, after=STOP_AFTER)
    assert stopped.returncode == -signal.SIGKILL, stopped.describe()
    assert not stopped.leftovers, f"processes outlived the launcher: {stopped.leftovers}"
    assert len(stopped.workers) == 2, stopped.workers
    forced = [c for c in stopped.checkpoints() if c["reason"] != "periodic"]
    assert [c["reason"] for c in forced] == ["interrupt"], stopped.new_events
    assert stopped.signalled_at_step < forced[0]["step"] < MAX_STEPS
    assert stopped.checkpoint_steps[:1] == [forced[0]["step"]] and stopped.newest_ranks == 2, stopped.describe()


# ---- SIGUSR2: the time limit ---------------------------------------------------------------


def test_the_time_limit_signal_stops_a_single_process_run(tmp_path: Path) -> None:
    """One process: no launcher in between, the training process itself gets the signal."""
    stopped = run_and_signal(tmp_path / "run", ONE_PROC, signal.SIGUSR2, after=STOP_AFTER, nprocs=1)
    assert stopped.returncode == 128 + signal.SIGUSR2, stopped.describe()
    assert [c["reason"] for c in stopped.checkpoints()] == ["timelimit"], stopped.describe()
    assert [e["event"] for e in stopped.new_events if e["event"] in ("stop", "checkpoint", "forced_save")] == [
        "stop",
        "checkpoint",
        "forced_save",
    ]
    assert not stopped.leftovers


def test_sigusr2_saves_as_timelimit_exits_140_and_resumes_bit_identically(
    stopped3: Stopped3, reference: dict[str, torch.Tensor]
) -> None:
    assert stopped3.usr2 is not None, f"the Ctrl-C stage failed:\n{stopped3.ctrl_c.describe()}"
    k3 = assert_stopped_and_saved(stopped3.usr2, "timelimit", signal.SIGUSR2)
    k2 = stopped3.ctrl_c.forced_step()
    assert [e["resumed_from_step"] for e in stopped3.usr2.new_events if e.get("event") == "start"] == [k2]
    assert stopped3.final is not None

    resumed = stopped3.final.result()  # the very same command again

    assert_resumed(stopped3.usr2.run_dir, resumed, [stopped3.first, k2, k3])
    assert_bit_identical(stopped3.usr2.run_dir, reference)


# ---- SIGTERM: preemption -------------------------------------------------------------------


def test_sigterm_saves_mid_epoch_and_the_resume_is_bit_identical(
    preempted: Preempted, stopped3: Stopped3, reference: dict[str, torch.Tensor]
) -> None:
    stopped, run_dir = preempted.stopped, preempted.stopped.run_dir
    k = assert_stopped_and_saved(stopped, "preempt", signal.SIGTERM)
    periodic = [c["step"] for c in stopped.checkpoints() if c["reason"] == "periodic"]
    # Every 10 steps until the signal came; one falling due between the signal and the step the
    # ranks agree to stop at is skipped (the forced save follows and must meet its deadline).
    assert periodic and periodic == list(range(10, periodic[-1] + 1, 10)) and STOP_AFTER - 10 <= periodic[-1] < k, (
        periodic,
        k,
    )
    assert f"hydra.run.dir={run_dir}" in stopped.output  # the launcher says how to resume

    # The very same command again resumed from that step (and was stopped by the Ctrl-C test).
    assert f"resumed from step {k} " in stopped3.ctrl_c.output, stopped3.ctrl_c.describe()
    assert stopped3.final is not None, "a later stage failed (see the Ctrl-C and SIGUSR2 tests)"
    assert_ok(stopped3.final.result())
    assert_bit_identical(run_dir, reference)


# ---- a run stopped three times -------------------------------------------------------------


def test_stopped_three_times_then_resumed_is_still_bit_identical(
    stopped3: Stopped3, reference: dict[str, torch.Tensor]
) -> None:
    assert stopped3.usr2 is not None and stopped3.final is not None, "a stage failed (see the other tests)"
    run_dir = stopped3.ctrl_c.run_dir
    k2, k3 = stopped3.ctrl_c.forced_step(), stopped3.usr2.forced_step()

    assert_resumed(run_dir, stopped3.final.result(), [stopped3.first, k2, k3])
    assert forced_checkpoints(run_dir) == [
        (stopped3.first, "preempt"),
        (k2, "interrupt"),
        (k3, "timelimit"),
        (MAX_STEPS, "final"),
    ]
    assert_bit_identical(run_dir, reference)


# ---- a torn newest checkpoint ----------------------------------------------------------------


def test_a_torn_newest_checkpoint_resumes_from_the_one_before_bit_identically(
    preempted: Preempted, reference: dict[str, torch.Tensor]
) -> None:
    k = assert_stopped_and_saved(preempted.stopped, "preempt", signal.SIGTERM)
    assert preempted.torn_resumed is not None
    assert preempted.torn_step == k
    periodic = [c["step"] for c in preempted.stopped.checkpoints() if c["reason"] == "periodic"]
    assert preempted.fallback_step == periodic[-1]  # the last periodic checkpoint

    resumed = preempted.torn_resumed.result()

    output = resumed.stdout + resumed.stderr
    assert f"checkpoint step_{k:08d}.pt is not usable" in output, describe(resumed)
    assert "WARNING" in output
    assert_resumed(preempted.torn_dir, resumed, [preempted.fallback_step])
    assert_bit_identical(preempted.torn_dir, reference)  # periodic checkpoints change nothing either


# ---- an existing run dir with another config -------------------------------------------------


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run dir but Hydra's own .hydra/, with its bytes and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".hydra" not in p.relative_to(root).parts
    }


def test_a_different_config_in_an_existing_run_dir_is_refused_and_touches_nothing(
    tmp_path: Path, reference_run: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir, symlinks=True)  # the shared run stays as it is
    before = _files(run_dir)
    assert any(name.startswith("checkpoints/") for name in before)

    proc = run_train(run_dir, (*TWO_PROCS, "optim.lr=0.002"))

    assert proc.returncode == 2, describe(proc)
    assert "optim.lr" in proc.stderr, describe(proc)
    assert "error" in proc.stderr
    assert _files(run_dir) == before, "refusing a run must not touch its run dir"


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ("25:00", "25 minutes (Slurm reads one colon as minutes:seconds; hours are HH:MM:SS)"),
        ("25:00:00", "1 day, 1 hour"),
        ("90", "1 hour, 30 minutes"),
        ("2-12", "2 days, 12 hours"),
        ("00:30:00", "30 minutes"),
        ("UNLIMITED", "no limit"),
    ],
)
def test_the_time_limit_as_slurm_reads_it(limit: str, said: str) -> None:
    from hpctrain.slurm.times import as_slurm_reads_it

    assert as_slurm_reads_it(limit) == said
