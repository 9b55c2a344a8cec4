"""Resuming by run dir keeps the run's own plan and config (hpctrain.cli.resume): the bare
same-run-dir command no longer re-plans a run to the defaults of the keys it leaves out, and
`--resume RUN_DIR` is the run's own command line plus what is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.cli.resume import with_the_runs_own

BIN = Path(sys.executable).parent
QUICK = ["trainer.eval_every=0", "trainer.log_every=2", "trainer.ckpt_every=2"]


def train(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([str(BIN / "hpctrain-train"), *args], env=env, capture_output=True, text=True, timeout=300)


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def last_step(run_dir: Path) -> int:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]


def test_the_same_run_dir_without_its_plan_keeps_the_runs_plan(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = train(f"hydra.run.dir={run_dir}", "model=mlp", "trainer.max_steps=6", *QUICK)
    assert first.returncode == 0, first.stderr[-2000:]
    # Before: without trainer.max_steps=6 the run was re-planned to the default (440 steps).
    again = train(f"hydra.run.dir={run_dir}", "model=mlp", "trainer.eval_every=0")
    assert again.returncode == 0, again.stderr[-2000:]
    assert events(run_dir, "replanned") == [] and last_step(run_dir) == 6
    # --resume: the run's own command line (model=mlp included), a new max_steps given.
    longer = train("--resume", str(run_dir), "trainer.max_steps=8")
    assert longer.returncode == 0, longer.stderr[-2000:]
    (replanned,) = events(run_dir, "replanned")
    assert replanned["changes"]["trainer.max_steps"] == [6, 8]
    assert last_step(run_dir) == 8


def test_resume_of_no_run_is_refused_naming_it(tmp_path: Path) -> None:
    done = train("--resume", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "no run there" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "expected_tail"),
    [
        (["-m", "optim.lr=1,2"], ["-m", "optim.lr=1,2"]),  # a sweep is left alone
        (["model=mlp"], ["model=mlp"]),  # a new run dir (no hydra.run.dir holding a run)
    ],
)
def test_lines_that_name_no_run_are_left_alone(argv: list[str], expected_tail: list[str]) -> None:
    assert with_the_runs_own(argv) == expected_tail


def test_elastic_may_be_turned_on_at_the_resume_that_resizes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = train(f"hydra.run.dir={run_dir}", "model=mlp", "trainer.max_steps=4", "data.batch_size=8", *QUICK)
    assert first.returncode == 0, first.stderr[-2000:]
    # Before: refused, "another size needs trainer.elastic=true", given as it was.
    resized = train("--resume", str(run_dir), "trainer.elastic=true", "trainer.nprocs=2", "trainer.max_steps=8")
    assert resized.returncode == 0, resized.stderr[-2000:]
    starts = events(run_dir, "start")
    assert [s["world_size"] for s in starts] == [1, 2]
    assert starts[1]["layout"]["global_batch"] == starts[0]["layout"]["global_batch"] == 8
    assert last_step(run_dir) == 8
    # Turned off again at another size: refused, naming the key.
    back = train("--resume", str(run_dir), "trainer.elastic=false", "trainer.nprocs=1", "trainer.max_steps=10")
    assert back.returncode == 2 and "trainer.elastic=true" in back.stderr, back.stderr[-2000:]


def test_resume_finds_the_runs_own_config_dir(tmp_path: Path) -> None:
    """A run started with `--config-dir myconf model=mynet` resumes by `--resume RUN_DIR` alone,
    from another folder: its options are found in its config dir again (.hydra/config_dirs.yaml)."""
    (tmp_path / "myconf" / "model").mkdir(parents=True)
    (tmp_path / "myconf" / "model" / "mynet.yaml").write_text("_target_: hpctrain.models.mlp.MLP\nhidden: [16]\n")
    run_dir = tmp_path / "run"
    first = train(
        "--config-dir",
        str(tmp_path / "myconf"),
        "model=mynet",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=4",
        *QUICK,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert (run_dir / ".hydra" / "config_dirs.yaml").read_text() == f"- {tmp_path / 'myconf'}\n"
    longer = train("--resume", str(run_dir), "trainer.max_steps=6")
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert last_step(run_dir) == 6
    assert [e["resumed_from_step"] for e in events(run_dir, "start")] == [0, 4]
    # A run started without one has no such file.
    plain = tmp_path / "plain"
    assert train(f"hydra.run.dir={plain}", "model=mlp", "trainer.max_steps=2", *QUICK).returncode == 0
    assert not (plain / ".hydra" / "config_dirs.yaml").exists()
