"""Run dirs never collide: the default name differs per command (two in one second), and two live
commands never write one run dir (hpctrain.run.lock): the second is refused, saying who holds it."""

from __future__ import annotations

import json
import os
import re
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
