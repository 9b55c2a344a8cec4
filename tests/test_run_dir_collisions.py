"""Run dirs never collide: the default name differs per command (two in one second), and two live
commands never write one run dir (hpctrain.run.lock): the second is refused, saying who holds it."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

from helpers.lock_holder import holding

from hpctrain.run.exitcodes import CLI_USER_ERROR

BIN = Path(sys.executable).parent
QUICK = ["trainer.max_steps=20", "trainer.eval_every=0", "trainer.log_every=1", "trainer.ckpt_every=0"]


def env_without_slurm() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def test_two_submissions_in_the_same_second_get_two_run_dirs(tmp_path: Path) -> None:
    # The default name with its time fixed, as two commands in the same second see it: only the
    # token drawn per command tells them apart.
    named = "hydra.run.dir=runs/2026-11-26/10-04-31-${hpctrain_token:}"
    command = [str(BIN / "hpctrain-submit"), "dry_run=true", "trainer.max_steps=5", named]
    started = [
        subprocess.Popen(
            command, cwd=tmp_path, env=env_without_slurm(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in started]
    assert [p.returncode for p in started] == [0, 0], outputs
    run_dirs = sorted(p.parent for p in (tmp_path / "runs").glob("*/*/config.yaml"))
    assert len(run_dirs) == 2, (run_dirs, outputs)
    for run_dir in run_dirs:  # runs/<date>/<time>-<6 hex digits drawn per command>
        assert re.fullmatch(r"\d{2}-\d{2}-\d{2}-[0-9a-f]{6}", run_dir.name), run_dir


def train_in(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", *QUICK],
        env=env_without_slurm(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_dir_in_use_by_a_live_command_is_refused_naming_who(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with holding(run_dir) as holder:
        refused = train_in(run_dir)
        assert refused.returncode == CLI_USER_ERROR, refused.stderr
        assert f"pid {holder.pid} on" in refused.stderr and "hydra.run.dir" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()
    # Its holder gone (killed: the kernel let go of the lock), the run dir is free again.
    done = train_in(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_trainings_of_one_run_dir_started_together_train_it_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [str(BIN / "hpctrain-train"), f"hydra.run.dir={run_dir}", *QUICK]
    started = [
        subprocess.Popen(command, env=env_without_slurm(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in started]
    codes = sorted(p.returncode for p in started)
    assert codes == [0, CLI_USER_ERROR], outputs
    assert any("is in use by a live hpctrain command" in out for out in outputs), outputs
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    assert steps == sorted(set(steps)) and steps[-1] == 20, steps  # every step once


def submit_sweep(sweep_dir: Path, values: list[str], limit_files: int | None = None) -> subprocess.CompletedProcess:
    def lower_the_open_file_limit() -> None:
        if limit_files is not None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit_files, hard))

    return subprocess.run(
        [
            str(BIN / "hpctrain-submit"),
            "-m",
            f"optim.lr={','.join(values)}",
            f"hydra.sweep.dir={sweep_dir}",
            "dry_run=true",
        ],
        env=env_without_slurm(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lower_the_open_file_limit,
    )


def test_a_sweep_of_more_points_than_the_open_file_limit_is_submitted(tmp_path: Path) -> None:
    # 1024 open files is the usual soft limit on a login node; a lock held per point ended any
    # sweep past about 1,000 points with "Too many open files". The sweep holds one lock.
    values = [f"{1e-4 + i * 1e-7:.7g}" for i in range(1100)]
    assert len(set(values)) == 1100
    done = submit_sweep(tmp_path / "sweep", values, limit_files=1024)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Too many open files" not in done.stderr
    written = [p for p in (tmp_path / "sweep").iterdir() if (p / "job.sbatch").is_file()]
    assert len(written) == 1100


def test_a_sweep_point_in_use_refuses_the_sweep_and_leaves_nothing(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "1").mkdir(parents=True)
    with holding(sweep_dir / "1") as holder:
        refused = submit_sweep(sweep_dir, ["1e-3", "2e-3"])
        assert refused.returncode == CLI_USER_ERROR, refused.stderr
        assert f"pid {holder.pid} on" in refused.stderr and "in use" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert not (sweep_dir / "0").exists()  # the point written before the refusal was removed
    assert not (sweep_dir / "1" / "config.yaml").exists()


def test_a_run_dir_in_a_sweep_being_submitted_is_refused_naming_the_sweep(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    with holding(sweep_dir, sweep=True) as holder:
        refused = train_in(sweep_dir / "3")
        assert refused.returncode == CLI_USER_ERROR, refused.stderr
        assert f"pid {holder.pid} on" in refused.stderr, refused.stderr
        assert f"submitting the sweep in {sweep_dir}" in refused.stderr, refused.stderr
        assert not (sweep_dir / "3" / "config.yaml").exists()
        # A second submission into the same sweep dir is refused too, writing nothing.
        again = submit_sweep(sweep_dir, ["1e-3", "2e-3"])
        assert again.returncode == CLI_USER_ERROR and "hydra.sweep.dir" in again.stderr, again.stderr
        assert not (sweep_dir / "0").exists()
