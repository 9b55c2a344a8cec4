"""A user's mistakes, as a new user makes them: told plainly, non-zero, nothing left behind.

Every case runs the real command (`python -m hpctrain.cli.train` / `.submit`, a sweep with -m)
from a fresh folder with Hydra's default run dir, and checks the exit code, the words of the
message, that no traceback is printed, that the folder is still empty and that no sbatch ran
(a stand-in sbatch on PATH records every call). The Slurm dev cluster's own refusals are in
tests/test_hostile_strings.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from clitools import assert_refused, describe, fake_slurm, files, lines, run_cli, world_writable
from helpers.disks import small_tmpfs

from hpctrain.checkpoint import CheckpointMismatch, PlainCheckpointer, store
from hpctrain.dist.context import DistContext
from hpctrain.recovery.control import Controller
from hpctrain.run.causes import Action
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.submit import sbatch

TOOLS = ["train", "submit"]
SHORT = ("trainer.max_steps=4", "trainer.ckpt_every=2", "trainer.eval_every=0", "model=mlp")

BAD_INPUT = {
    "negative-nodes": (
        ["slurm.nodes=-1"],
        2,
        ["error: slurm.nodes: must be a count of nodes >= 1 (4) or a range min-max (2-4), min <= max (got -1)"],
    ),
    "time-four-parts": (["slurm.time=1:2:3:4"], 2, ["slurm.time: '1:2:3:4' is not a Slurm time limit"]),
    "time-word": (["slurm.time=abc"], 2, ["slurm.time: 'abc' is not a Slurm time limit"]),
    "negative-memory": (["slurm.mem=-5G"], 2, ["slurm.mem: '-5G' is not a Slurm memory size"]),
    "run-dir-cannot-be-made": (
        ["hydra.run.dir=/proc/nope/run"],
        2,
        ["error: hydra.run.dir: cannot make /proc/nope/run"],
    ),
    "sweep-dir-cannot-be-made": (
        ["-m", "hydra.sweep.dir=/proc/nope/sweep", "optim.lr=0.1,0.2"],
        2,
        ["error: hydra.sweep.dir: cannot make /proc/nope/sweep"],
    ),
    "unknown-model": (["model=nope"], 2, ["error: model=nope: no such option; model has convnet, gpt, mlp"]),
    "unknown-key": (["trainer.nope=1"], 2, ["error: trainer.nope: no such key; did you mean"]),
    "wrong-type": (["data.batch_size=abc"], 2, ["error: data.batch_size=abc: must be an integer"]),
    "negative-batch": (["data.batch_size=-3"], 2, ["error: data.batch_size: must be >= 1 (got -3)"]),
    "unknown-argument": (["+model.foo=1"], 2, ["error: model.foo:", "takes no argument 'foo'"]),
    "mistyped-argument": (["+model.hiden=1"], 2, ["takes no argument 'hiden'", "did you mean model.hidden?"]),
    # A key of the new class, set plainly on a line that swaps the class: + adds it (the group's
    # keys are the old class's, so none of them is offered).
    "key-of-a-swapped-class": (
        ["model._target_=torch.nn.Linear", "model.in_features=4"],
        2,
        [
            "error: model.in_features: no such key in model=convnet, whose class this line replaces with "
            "torch.nn.Linear: an argument of torch.nn.Linear is added with +model.in_features=4"
        ],
    ),
    "newline": (["slurm.job_name='a\nb'"], 2, ["error: slurm.job_name: must be a single line"]),
    "no-dataset-path": (["data=token_file"], 2, ["error: data.dataset.path: no value"]),
    "missing-dataset": (
        ["model=gpt", "data=token_file", "data.dataset.path=no/such/train.bin"],
        2,
        ["error: data.dataset.path: no such file:", "no/such/train.bin (relative to "],
    ),
    "dataset-is-a-device": (
        ["model=gpt", "data=token_file", "data.dataset.path=/dev/null"],
        2,
        ["error: data.dataset.path: /dev/null is not a file of token ids"],
    ),
    "dataset-is-a-folder": (
        ["model=gpt", "data=token_file", "data.dataset.path=."],
        2,
        ["error: data.dataset.path:", "is not a file of token ids"],
    ),
    "sweep-value-into-setup": (
        ["slurm.setup=['echo ${slurm.job_name}']", "slurm.job_name='x; touch pwned'"],
        2,
        ["error: slurm.setup[0]: ${slurm.job_name} brings 'x; touch pwned' into a shell line"],
    ),
}


@dataclass
class Refused:
    done: subprocess.CompletedProcess[str]
    cwd: Path
    sbatch_calls: list[str]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Refused]:
    """Every (tool, case) of BAD_INPUT, run once, a few at a time (each is mostly start-up)."""

    def attempt(tool: str, case: str, root: Path) -> Refused:
        env, log = fake_slurm(root / "slurm")
        done = run_cli(tool, *BAD_INPUT[case][0], cwd=root / "project", env=env)
        return Refused(done, root / "project", lines(log / "sbatch.calls"))

    base = tmp_path_factory.mktemp("refusals")
    keys = [(tool, case) for tool in TOOLS for case in BAD_INPUT]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(keys, pool.map(lambda key: attempt(*key, base / "-".join(key)), keys)))


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
@pytest.mark.parametrize("tool", TOOLS)
def test_bad_input_is_refused_naming_it_and_nothing_is_written(
    refusals: dict[tuple[str, str], Refused], tool: str, case: str
) -> None:
    _, code, words = BAD_INPUT[case]
    refused = refusals[tool, case]
    assert_refused(refused.done, code, *words)
    assert not list(refused.cwd.iterdir()), f"left behind: {list(refused.cwd.rglob('*'))}"  # not even runs/<date>/
    assert refused.sbatch_calls == []


@pytest.mark.parametrize(
    "sweep",
    ["slurm.nodes=1,-1", "model=mlp,nope", "trainer.nope=1,2", "data=digits,token_file", "+model.foo=1,2"],
)
def test_a_sweep_with_one_bad_point_submits_nothing_and_leaves_nothing(tmp_path: Path, sweep: str) -> None:
    env, log = fake_slurm(tmp_path / "slurm")
    cwd = tmp_path / "project"

    done = run_cli("submit", "-m", sweep, cwd=cwd, env=env)

    assert done.returncode != 0, describe(done)
    assert "Traceback" not in done.stderr + done.stdout, describe(done)
    assert not list(cwd.iterdir()), f"left behind: {list(cwd.rglob('*'))}"
    assert not lines(log / "sbatch.calls")


def test_an_account_sbatch_refuses_is_shown_in_its_words_and_nothing_is_left(tmp_path: Path) -> None:
    env, log = fake_slurm(tmp_path / "slurm", refuse="--account=nope")
    cwd = tmp_path / "project"

    done = run_cli("submit", "slurm.account=nope", cwd=cwd, env=env)

    assert_refused(done, 1, "Invalid account or account/partition combination specified", "nothing was queued")
    assert "Submitted batch job" not in done.stdout
    assert not list(cwd.iterdir())


def test_a_sweep_refused_at_a_later_point_cancels_every_job_it_queued(tmp_path: Path) -> None:
    env, log = fake_slurm(tmp_path / "slurm", refuse="--account=nope")
    cwd = tmp_path / "project"

    done = run_cli("submit", "-m", "slurm.account=a,b,nope,c,d,e", "slurm.submit_parallelism=4", cwd=cwd, env=env)

    assert_refused(done, 1, "Invalid account or account/partition combination specified")
    assert len(lines(log / "sbatch.calls")) >= 2  # it did queue some before the refusal...
    assert sorted(lines(log / "cancelled")) == sorted(lines(log / "queued"))  # ...and cancelled every one
    assert "Submitted batch job" not in done.stdout
    assert not list(cwd.iterdir()), f"left behind: {list(cwd.rglob('*'))}"


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "sweep"])
def test_no_sbatch_on_path_is_said_plainly(tmp_path: Path, multirun: bool) -> None:
    env = dict(fake_slurm(tmp_path / "slurm")[0], PATH=str(Path(sys.executable).parent))
    cwd = tmp_path / "project"

    done = run_cli("submit", *(["-m", "optim.lr=0.1,0.2"] if multirun else []), cwd=cwd, env=env)

    assert_refused(done, 1, "sbatch: not found on PATH", "run hpctrain-train")
    assert not list(cwd.iterdir())


def test_an_sbatch_without_an_answer_keeps_the_run_dir_it_may_have_queued(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nsleep 30\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    script = tmp_path / "run" / "job.sbatch"
    script.parent.mkdir()
    script.write_text("#!/bin/bash\n")

    # hpctrain-submit's sbatch waits 120 s: here half a second (the table's row, patched).
    monkeypatch.setitem(client.POLICIES, Purpose.SUBMIT, replace(client.POLICIES[Purpose.SUBMIT], timeout_s=0.5))
    with pytest.raises(sbatch.SbatchError, match="may have been queued") as raised:
        sbatch.submit(script)

    assert raised.value.maybe_queued and raised.value.script == script


@pytest.mark.parametrize("tool", TOOLS)
def test_a_run_dir_whose_job_has_not_ended_is_refused(tmp_path: Path, tool: str) -> None:
    env, log = fake_slurm(tmp_path / "slurm", squeue_state="RUNNING")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "submission.json").write_text(json.dumps({"job_id": "4242"}))

    done = run_cli(tool, f"hydra.run.dir={run_dir}", cwd=tmp_path / "project", env=env)

    assert_refused(done, 2, f"{run_dir} belongs to job 4242 (RUNNING), which has not ended")
    # Nothing written: not even Hydra's .hydra/ (it overwrote the run's own before).
    assert sorted(p.name for p in run_dir.iterdir()) == ["submission.json"]
    assert not lines(log / "sbatch.calls")


# ---- checkpoints of another model ------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 1-process MLP run with checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    done = run_cli("train", f"hydra.run.dir={run_dir}", *SHORT, cwd=run_dir.parent)
    assert done.returncode == 0, describe(done)
    return run_dir


@pytest.mark.parametrize("tool", TOOLS)
def test_checkpoints_of_another_model_are_refused_before_anything_starts(
    tmp_path: Path, trained: Path, tool: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "config.yaml").unlink()  # the config is gone; its checkpoints still say what they are
    before = files(run_dir)
    env, log = fake_slurm(tmp_path / "slurm")

    done = run_cli(tool, f"hydra.run.dir={run_dir}", *SHORT, "model.hidden=[64]", cwd=tmp_path, env=env)

    assert_refused(
        done,
        2,
        f"error: {run_dir / 'checkpoints'} holds checkpoints of another model",
        "model.hidden: [128, 128] -> [64]",
        "Train it in a new run dir (hydra.run.dir=...)",
    )
    assert files(run_dir) == before, "a refused start must not touch the run dir"
    assert not lines(log / "sbatch.calls")


def test_the_trainer_refuses_checkpoints_of_another_model_saying_what_differs(tmp_path: Path, trained: Path) -> None:
    """A config.yaml edited by hand, then the job's own command (what srun runs on every task)."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("num_classes: 10", "num_classes: 12"))
    checkpoints = files(run_dir / "checkpoints")

    done = run_cli("hpctrain.worker", str(run_dir), cwd=tmp_path)

    assert_refused(
        done, 78, "error:", "different model, data or optimizer (model.num_classes: 10 -> 12)", "refusing to resume it"
    )
    assert files(run_dir / "checkpoints") == checkpoints, "never silently start over"
    failure = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()][-1]
    assert failure["event"] == "failure" and failure["cause"] == "user_error"
    assert "model.num_classes: 10 -> 12" in failure["message"]


def test_saved_weights_of_other_names_or_shapes_are_refused_by_name(tmp_path: Path) -> None:
    """Same config, but the model's code changed: the fingerprint agrees, the weights do not."""
    folder = tmp_path / "checkpoints"
    ctx = DistContext.single(cuda_devices=0)
    old = {"fc.weight": torch.zeros(10, 64), "fc.bias": torch.zeros(10), "gone.weight": torch.zeros(2)}
    PlainCheckpointer(folder, ctx, 2, "fp", lambda record: None).save(3, {"model": old}, "periodic", background=False)
    new = torch.nn.Module()  # fc.weight [10, 32], fc.bias [10], added.weight [2]
    new.fc = torch.nn.Linear(32, 10)
    new.added = torch.nn.Module()
    new.added.register_parameter("weight", torch.nn.Parameter(torch.zeros(2)))

    with pytest.raises(CheckpointMismatch) as raised:
        PlainCheckpointer(folder, ctx, 2, "fp", lambda record: None, model=new).load()

    message = str(raised.value)
    assert "not in the checkpoint: added.weight" in message and "not in this model: gone.weight" in message
    assert "fc.weight [10, 64] -> [10, 32]" in message and "move" in message


def test_the_batch_script_stops_instead_of_requeueing_after_a_user_error(tmp_path: Path, trained: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    launched_at = time.time()  # the step judged is the one launched now, not the trained run's
    refused = {"event": "failure", "time": launched_at + 1, "cause": "user_error", "job_id": "7", "restart": 0}
    with open(run_dir / "events.jsonl", "a") as journal:
        journal.write(json.dumps(refused) + "\n")
    controller = Controller(run_dir, env={"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"})

    # 143: what srun says when --kill-on-bad-exit ended the other tasks of a refused start.
    action = controller.after_step(143, terminated=False, excluded=[], launched_at=launched_at)
    assert action == Action.FAIL.value


# ---- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: room for one checkpoint of the MLP (~330 KB), not two."""
    with small_tmpfs(tmp_path / "disk", "512k") as mount:
        yield mount


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_says_so(small_disk: Path) -> None:
    run_dir = small_disk / "run"

    done = run_cli("train", f"hydra.run.dir={run_dir}", *SHORT, "trainer.max_steps=6", cwd=small_disk.parent)

    assert_refused(
        done, 2, "error: checkpoint at step 4: No space left on device", "the checkpoint of step 2 is intact"
    )
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002.json", "step_00000002.pt"]
    found = store.load_newest(folder)
    assert found is not None and found[0].step == 2 and found[1]["train"]["step"] == 2
    assert [
        e["cause"]
        for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
        if e["event"] == "failure"
    ] == ["user_error"]


# ---- permissions ------------------------------------------------------------------------------


def test_nothing_a_run_writes_is_world_writable_even_with_umask_000(tmp_path: Path) -> None:
    trained_dir, submitted_dir = tmp_path / "trained", tmp_path / "submitted"

    done = run_cli("train", f"hydra.run.dir={trained_dir}", *SHORT, cwd=tmp_path, umask=0)
    assert done.returncode == 0, describe(done)
    done = run_cli("submit", f"hydra.run.dir={submitted_dir}", "dry_run=true", cwd=tmp_path, umask=0)
    assert done.returncode == 0, describe(done)

    assert {"config.yaml", "events.jsonl", "metrics.jsonl", "model.pt", "checkpoints"} <= {
        p.name for p in trained_dir.iterdir()
    }
    assert (submitted_dir / "job.sbatch").is_file()
    assert world_writable(trained_dir) == [] and world_writable(submitted_dir) == []


def test_a_refused_resubmission_keeps_the_run_dir_that_was_there(tmp_path: Path) -> None:
    env, log = fake_slurm(tmp_path / "slurm", refuse="--account=nope")
    run_dir = tmp_path / "run"
    done = run_cli("submit", f"hydra.run.dir={run_dir}", "slurm.account=nope", "dry_run=true", cwd=tmp_path, env=env)
    assert done.returncode == 0, describe(done)

    done = run_cli("submit", f"hydra.run.dir={run_dir}", "slurm.account=nope", cwd=tmp_path, env=env)

    # A dry run, then the real one: the same run (dry_run is no part of it), refused by sbatch.
    assert_refused(done, 1, "Invalid account", "nothing was queued; run dirs that held a run before are kept")
    kept = files(run_dir)
    assert sorted(name for name in kept if not name.startswith("code/")) == [
        ".hydra/overrides.yaml",  # the dry run's accepted command line (hpctrain.cli.resume reads it)
        ".run.lock",  # who wrote it last (hpctrain.run.lock)
        "config.yaml",
        "guardian.sbatch",
        "job.sbatch",
    ]
    assert "code/snapshot.json" in kept  # the dry run's code snapshot, which its job.sbatch names


def test_a_models_own_refusal_in_every_process_is_one_error_line(tmp_path: Path) -> None:
    done = run_cli(
        "train",
        f"hydra.run.dir={tmp_path / 'run'}",
        "model=gpt",
        "data=tokens",
        "model.n_head=3",
        "trainer.nprocs=2",
        cwd=tmp_path,
    )
    assert_refused(done, 2, "error: hpctrain.models.gpt.GPT: n_embd (got 128) must be divisible by n_head (got 3)")


@pytest.mark.slurm
def test_a_user_error_in_a_slurm_job_ends_it_at_once_without_a_requeue(tmp_path: Path) -> None:
    """The data file is there at submission, gone when the job starts: the job says why in its
    output and journal, and stops (FAILED) instead of requeueing into the same error."""
    from slurmtools import job_output, job_restarts, start_cluster, wait_finished

    env = start_cluster()
    data = tmp_path / "train.bin"
    (torch.arange(2000) % 32).to(torch.int16).numpy().tofile(data)
    run_dir = tmp_path / "run"
    done = run_cli(
        "submit",
        "cluster=devcluster",
        f"hydra.run.dir={run_dir}",
        "model=gpt",
        "data=token_file",
        f"data.dataset.path={data}",
        "data.dataset.seq_len=8",
        "data.dataset.vocab_size=32",
        "model.n_layer=1",
        "slurm.extra=[--hold]",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, describe(done)
    job_id = done.stdout.split()[3]
    data.unlink()
    subprocess.run(["scontrol", "release", job_id], env=env, check=True, capture_output=True)

    assert wait_finished(env, job_id, timeout_s=300) == "FAILED", job_output(run_dir)
    assert job_restarts(env, job_id) == 0
    assert f"error: hpctrain.data.token_file.token_file: path: no such file: {data}" in job_output(run_dir)
    causes = [e.get("cause") for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())]
    assert causes == ["user_error"], causes


def test_slurm_time_and_memory_take_slurms_own_forms() -> None:
    from hpctrain.config.schema import SlurmConfig

    for time_limit in ("30", "30:00", "12:00:00", "2-00:00:00", "2-12", "UNLIMITED"):
        SlurmConfig(time=time_limit)
    for memory in ("0", "64G", "500M", "1T", "64000"):
        SlurmConfig(mem=memory)
    for time_limit in ("1:2:3:4", "abc", "-5", "1-"):
        with pytest.raises(ValueError, match="slurm.time"):
            SlurmConfig(time=time_limit)
    for memory in ("-5G", "1.5G", "64 G", "lots"):
        with pytest.raises(ValueError, match="slurm.mem"):
            SlurmConfig(mem=memory)
