"""Metrics beyond metrics.jsonl: TensorBoard, MLflow and W&B (offline) from real `hpctrain-train`
runs, read back with TensorBoard's EventAccumulator, MLflow's client and W&B's own records.

The resume test kills a run with SIGKILL between two checkpoints (a node failure, an OOM kill:
nothing is saved at the stop), so the run has logged steps past the checkpoint it resumes from.
The next life logs them again; every sink must still show each step once. A paced model (a
floor on each training step's time) lets the test catch the run mid-way on any machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import assert_ok, describe, events, train_command, train_env
from omegaconf import OmegaConf

from hpctrain.config import Config
from hpctrain.metrics import jsonl, params, wandb_files, wandb_sink
from hpctrain.run.jsonlines import read_jsonl

# Looked up, not imported: importing mlflow, tensorboard and wandb costs about 1.7 CPU-s, paid by
# every pytest worker at collection; the readers below import them when a test reads a run.
_MISSING = [name for name in ("mlflow", "tensorboard", "wandb") if importlib.util.find_spec(name) is None]
if _MISSING:
    pytest.skip(f"the metrics extras are not installed: {', '.join(_MISSING)}", allow_module_level=True)
if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.fixture(scope="module", autouse=True)
def sink_readers() -> None:
    """The readers imported once the module runs, before any run is started and polled: a first
    import inside a poll takes seconds of a loaded machine, long enough for a paced run to end
    before the test sees the step it waits for."""
    import mlflow.tracking  # noqa: F401
    import tensorboard.backend.event_processing.event_accumulator  # noqa: F401


PACED_MODULE = '''
import os
import time

from hpctrain.models.convnet import ConvNet


class PacedConvNet(ConvNet):
    """The built-in ConvNet, no training step faster than PACE_S."""

    def forward(self, x):
        if self.training:
            time.sleep(float(os.environ.get("PACE_S", "0")))
        return super().forward(x)
'''

MAX_STEPS = 80
LOG_EVERY = 2
RESUMED = (
    "model._target_=pacedmod.PacedConvNet",
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.log_every={LOG_EVERY}",
    "trainer.eval_every=40",
    "trainer.ckpt_every=20",
    "metrics.tensorboard=true",
    "metrics.mlflow=true",
    "metrics.wandb=true",
    "metrics.wandb_tags=[paced,resume]",
)
LOGGED_STEPS = list(range(LOG_EVERY, MAX_STEPS + 1, LOG_EVERY))
DEADLINE_S = 120


@pytest.fixture(scope="module")
def paced_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("paced")
    (folder / "pacedmod.py").write_text(PACED_MODULE)
    return folder


@pytest.fixture(scope="module", autouse=True)
def _read_file_stores() -> Iterator[None]:
    # The runs keep MLflow in a file store in the run dir; MLflow 3 reads one only when asked to.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        yield


def _env(paced_dir: Path, pace_s: float) -> dict[str, str]:
    env = train_env(paced_dir)
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store: the run dir's own
    for key in [k for k in env if k.startswith("WANDB_")]:
        env.pop(key)  # the default, offline mode: no network, no login
    env["PACE_S"] = str(pace_s)
    return env


def _start(run_dir: Path, overrides: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[str]:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}-{time.monotonic_ns()}.log", "w") as log:
        return subprocess.Popen(
            train_command(run_dir, overrides),
            cwd=run_dir.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _wait_for(popen: subprocess.Popen[str], what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        if popen.poll() is not None:
            pytest.fail(f"the run ended (exit {popen.returncode}) before {what}")
        if time.monotonic() > deadline:
            os.killpg(popen.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {DEADLINE_S}s")
        time.sleep(0.02)


def _mlflow_run(run_dir: Path) -> tuple[MlflowClient, str]:
    from mlflow.tracking import MlflowClient

    saved = json.loads((run_dir / "mlflow_run.json").read_text())
    return MlflowClient((run_dir / "mlruns").absolute().as_uri()), saved["run_id"]


def _mlflow_steps(run_dir: Path, key: str = "loss") -> list[int]:
    if not (run_dir / "mlflow_run.json").exists():
        return []
    client, run_id = _mlflow_run(run_dir)
    return [m.step for m in client.get_metric_history(run_id, key)]


def _tensorboard(run_dir: Path) -> EventAccumulator:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / "tensorboard"))
    accumulator.Reload()
    return accumulator


def _wandb_lives(run_dir: Path) -> list[list[int]]:
    """The steps each life's offline W&B file holds, oldest life first."""
    if not (run_dir / "wandb_run.json").exists():
        return []
    run_id = json.loads((run_dir / "wandb_run.json").read_text())["run_id"]
    return [wandb_files.logged_steps(path) for path in wandb_files.run_files(run_dir / "wandb", run_id)]


def _wandb_run_record(path: Path) -> Any:
    from wandb.proto import wandb_internal_pb2

    for raw in wandb_files.records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "run":
            return record.run
    raise AssertionError(f"{path}: no run record")


def _saved(run_dir: Path) -> int:
    """The newest checkpoint's step (at least 25: past the first one, step 20)."""
    return max([25] + [e["step"] for e in events(run_dir, "checkpoint")])


def _jsonl_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]


# ---- a run killed between checkpoints, then resumed ----------------------------------------------


@pytest.fixture(scope="module")
def killed_and_resumed(paced_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Life 1 is SIGKILLed once every sink shows steps past the checkpoint at step 20; life 2 is
    the same command again. Returns what life 1 left and the resumed run."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    env = _env(paced_dir, pace_s=0.05)
    life1 = _start(run_dir, RESUMED, env)
    _wait_for(life1, "the checkpoint at step 20", lambda: bool(events(run_dir, "checkpoint")))
    # Every sink past the newest checkpoint (and step 26): the next life logs those steps again.
    # (Not W&B: offline, it writes its file in 32 KiB blocks; what the kill loses, life 2 sends.)
    sinks = {"metrics.jsonl": _jsonl_steps, "MLflow": _mlflow_steps}
    _wait_for(
        life1,
        f"{', '.join(sinks)} past the newest checkpoint",
        lambda: all(max(steps(run_dir), default=0) > _saved(run_dir) for steps in sinks.values()),
    )
    os.killpg(life1.pid, signal.SIGKILL)
    life1.wait(timeout=30)
    before = {
        "jsonl": _jsonl_steps(run_dir),
        "tensorboard": [e.step for e in _tensorboard(run_dir).Scalars("loss")],
        "mlflow": _mlflow_steps(run_dir),
        "run_file": (run_dir / "mlflow_run.json").read_text(),
        "wandb": sum(_wandb_lives(run_dir), []),
        "wandb_run_file": (run_dir / "wandb_run.json").read_text(),
    }
    resumed = subprocess.run(
        train_command(run_dir, RESUMED),
        cwd=run_dir.parent,
        env=_env(paced_dir, pace_s=0),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    return {"run_dir": run_dir, "before": before, "resumed": resumed}


def test_the_killed_run_logged_past_its_checkpoint_in_every_sink(killed_and_resumed: dict) -> None:
    """The premise: the steps the resumed life logs again were in every sink already."""
    assert_ok(killed_and_resumed["resumed"])
    run_dir, before = killed_and_resumed["run_dir"], killed_and_resumed["before"]
    resumed_from = events(run_dir, "start")[-1]["resumed_from_step"]
    assert resumed_from > 0
    for sink in ("jsonl", "tensorboard", "mlflow"):
        assert max(before[sink]) > resumed_from, f"{sink}: {before[sink]} (resumed from {resumed_from})"


def test_metrics_jsonl_has_each_step_once_after_the_resume(killed_and_resumed: dict) -> None:
    resumed = killed_and_resumed["resumed"]
    assert_ok(resumed)
    assert _jsonl_steps(killed_and_resumed["run_dir"]) == LOGGED_STEPS
    assert "metrics.jsonl: dropped" in resumed.stdout, describe(resumed)


def test_tensorboard_has_each_step_once_in_the_same_folder(killed_and_resumed: dict) -> None:
    run_dir = killed_and_resumed["run_dir"]
    board = _tensorboard(run_dir)
    assert set(board.Tags()["scalars"]) == {"loss", "lr", "samples_per_s", "eval_loss", "eval_accuracy"}
    assert [e.step for e in board.Scalars("loss")] == LOGGED_STEPS
    assert [e.step for e in board.Scalars("eval_accuracy")] == [40, 80]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one file per life
    lines = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    for event in board.Scalars("loss"):
        assert event.value == pytest.approx(lines[event.step]["loss"], rel=1e-6)


def test_mlflow_goes_on_in_the_same_run_with_each_step_once(killed_and_resumed: dict) -> None:
    run_dir, before = killed_and_resumed["run_dir"], killed_and_resumed["before"]
    assert (run_dir / "mlflow_run.json").read_text() == before["run_file"]
    client, run_id = _mlflow_run(run_dir)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run"  # the run dir, relative to where the command ran
    experiment = client.get_experiment_by_name("hpctrain")
    assert experiment is not None and run.info.experiment_id == experiment.experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in history] == LOGGED_STEPS
    assert [m.step for m in client.get_metric_history(run_id, "eval_loss")] == [40, 80]
    # Steps logged before the kill keep their first values: an exact resume computes the same.
    lines = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert {m.step: m.value for m in history} == {step: lines[step]["loss"] for step in LOGGED_STEPS}
    assert run.data.params["trainer.max_steps"] == str(MAX_STEPS)
    assert run.data.params["model._target_"] == "pacedmod.PacedConvNet"
    assert json.loads(run.data.params["model.channels"]) == [32, 64]
    assert run.data.tags["hpctrain.run_dir"] == str(run_dir.resolve())


def test_wandb_goes_on_in_the_same_run_with_each_step_once(killed_and_resumed: dict) -> None:
    """Offline: one folder per life under <run dir>/wandb, one run id, every step in one of them
    (`wandb sync` uploads them in order into the one run)."""
    run_dir, before = killed_and_resumed["run_dir"], killed_and_resumed["before"]
    assert (run_dir / "wandb_run.json").read_text() == before["wandb_run_file"]
    run_id = json.loads(before["wandb_run_file"])["run_id"]
    lives = _wandb_lives(run_dir)
    assert len(lives) == 2, lives
    assert lives[0] == before["wandb"]  # what life 1 wrote (maybe nothing: killed) stays as it was
    assert sum(lives, []) == LOGGED_STEPS  # each step once, in increasing order
    # Both lives' folders are named by the run id; life 1's file may hold only its header.
    run = _wandb_run_record(wandb_files.run_files(run_dir / "wandb", run_id)[-1])
    assert (run.run_id, run.project, run.display_name) == (run_id, "hpctrain", "run")
    assert list(run.tags) == ["paced", "resume"] and run.run_group == ""  # not a sweep's point


def test_a_sweep_point_is_grouped_by_its_sweep_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra writes multirun.yaml into a sweep's folder; the points are the folders beside it."""
    config = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(Config), {"model": {}, "optim": {}, "data": {"dataset": {}}})
    )
    sweep = tmp_path / "multirun" / "12-00-00"
    (sweep / "3").mkdir(parents=True)
    (tmp_path / "single").mkdir()
    monkeypatch.chdir(tmp_path)
    assert wandb_sink.group(config, sweep / "3") is None
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    assert wandb_sink.group(config, sweep / "3") == "multirun/12-00-00"
    assert wandb_sink.group(config, tmp_path / "single") is None
    config.metrics.wandb_group = "mine"
    assert wandb_sink.group(config, sweep / "3") == "mine"


@pytest.mark.parametrize(
    ("step", "logged_through", "sent"),
    [
        (10, -1, {"loss": 0.5, "lr": 0.1}),  # a fresh run
        (10, 9, {"loss": 0.5, "lr": 0.1}),
        (10, 10, {}),  # W&B has it: an earlier life logged it after its checkpoint
        (10, 12, {}),
    ],
)
def test_wandb_is_sent_only_steps_it_lacks(step: int, logged_through: int, sent: dict) -> None:
    record = {"step": step, "loss": 0.5, "lr": 0.1, "note": "not a number"}
    assert wandb_sink.to_send(record, logged_through) == sent


# ---- a sink that fails mid-run -------------------------------------------------------------------


def test_mlflow_gone_mid_run_warns_once_and_training_finishes(paced_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = (
        "model._target_=pacedmod.PacedConvNet",
        "trainer.max_steps=150",
        "trainer.log_every=5",
        "trainer.eval_every=0",
        "metrics.mlflow=true",
    )
    run = _start(run_dir, overrides, _env(paced_dir, pace_s=0.02))
    _wait_for(run, "a metric in MLflow", lambda: bool(_mlflow_steps(run_dir)))
    # The tracking store is gone, as a server that went down. Moved away in one rename, not removed
    # file by file: the trainer keeps appending metrics while it runs, and a removal that races it
    # finds a folder refilled under it.
    (run_dir / "mlruns").rename(tmp_path / "mlruns-gone")
    assert run.wait(timeout=DEADLINE_S) == 0
    output = next(run_dir.parent.glob("run-*.log")).read_text()
    warnings = [line for line in output.splitlines() if "MLflow failed" in line]
    assert len(warnings) == 1, output
    assert warnings[0].startswith("[rank0] ") and "training goes on" in warnings[0]
    # Told while training went on, not at the end.
    assert output.index("MLflow failed") < output.index("step 150/150"), output
    assert _jsonl_steps(run_dir) == list(range(5, 151, 5))
    assert (run_dir / "model.pt").exists()
    assert "Traceback" not in output


# ---- an integration that is not installed ----------------------------------------------------------

BROKEN = {
    "tensorboard": {"tensorboard.py": "raise ImportError('No module named tensorboard')\n"},
    "mlflow": {"mlflow/__init__.py": "raise ImportError('No module named mlflow')\n"},
    "wandb": {"wandb/__init__.py": "raise ImportError('No module named wandb')\n"},
}


def test_a_missing_extra_fails_before_any_process_naming_the_pip_command(tmp_path: Path) -> None:
    started = {}
    for extra, fakes in BROKEN.items():
        fake_dir = tmp_path / f"fake-{extra}"
        for name, text in fakes.items():
            (fake_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (fake_dir / name).write_text(text)
        cwd = tmp_path / f"cwd-{extra}"
        cwd.mkdir()
        # W&B through hpctrain-submit (a dry run: no Slurm needed to reach the check): refused on the
        # login node before anything is written, not in the job.
        entry = ["hpctrain.cli.submit", "dry_run=true"] if extra == "wandb" else ["hpctrain.cli.train"]
        command = [sys.executable, "-m", *entry, f"metrics.{extra}=true", "hydra.run.dir=run"]
        started[extra] = (
            cwd,
            subprocess.Popen(
                command, cwd=cwd, env=train_env(fake_dir), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            ),
        )
    for extra, (cwd, popen) in started.items():
        stdout, stderr = popen.communicate(timeout=DEADLINE_S)
        done = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
        assert done.returncode == 2, describe(done)
        assert stderr.strip().splitlines() == [stderr.strip()], "one line"
        assert stderr.startswith(f"error: metrics.{extra}=true needs "), describe(done)
        assert f"pip install 'hpctrain[{extra}]'" in stderr, describe(done)
        assert "Traceback" not in stdout + stderr
        assert list(cwd.iterdir()) == [], "nothing written"


# ---- pure logic -----------------------------------------------------------------------------------


def test_drop_steps_after_cuts_at_the_first_later_step_and_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    kept = '{"step": 10}\n{"step": 2' + '\n{"step": 20}\n'  # a fragment an earlier life closed
    path.write_text(kept + '{"step": 30}\n{"step": 40}\n{"step": 5')
    assert jsonl.drop_steps_after(path, 20) == 3
    assert path.read_text() == kept
    assert jsonl.drop_steps_after(path, 20) == 0
    assert jsonl.drop_steps_after(tmp_path / "none.jsonl", 0) == 0


def test_params_are_the_flattened_resolved_config() -> None:
    chosen = {"model": {"_target_": "m.Net"}, "optim": {"lr": 0.1}, "data": {"dataset": {"_target_": "d.D"}}}
    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), chosen))
    flat = params.flatten(config)
    assert flat["model._target_"] == "m.Net"
    assert flat["optim.lr"] == "0.1"
    assert flat["slurm.setup"] == "[]"
    assert flat["slurm.restart_budget.crash"] == "1"
    assert flat["metrics.mlflow"] == "False"
    assert params.flatten({"a": "x" * 7000})["a"].endswith("...")
