"""Run hpctrain's command-line tools the way a user does, and check what they leave behind."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

TOOLS = {"train": "hpctrain.cli.train", "submit": "hpctrain.cli.submit"}


def cli_env(extra_path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env["OMP_NUM_THREADS"] = "1"
    if extra_path is not None:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_cli(
    tool: str,
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    umask: int | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`hpctrain-<tool> ARGS` in `cwd`, optionally under another umask."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", TOOLS.get(tool, tool), *args],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


def describe(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"


def assert_refused(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """Exit `code`, every word in stderr, and no traceback anywhere: a user's mistake is told, not dumped."""
    assert done.returncode == code, describe(done)
    for word in words:
        assert word in done.stderr, f"{word!r} not in stderr\n{describe(done)}"
    assert "Traceback" not in done.stderr + done.stdout, describe(done)


def files(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes, .hydra/ included: a refused command writes nothing
    there either (Hydra's own copies are off; hpctrain writes overrides.yaml once accepted)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def world_writable(root: Path) -> list[str]:
    found = [root, *root.rglob("*")]
    return [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in found if p.lstat().st_mode & stat.S_IWOTH]


FAKE_SBATCH = """#!/bin/sh
# A stand-in sbatch: records every call, refuses scripts holding $FAKE_REFUSE the way Slurm
# words it, queues the rest under its own pid as the job id.
for last; do :; done
echo "$last" >> "$FAKE_SLURM_LOG/sbatch.calls"
if [ -n "$FAKE_REFUSE" ] && grep -qF -- "$FAKE_REFUSE" "$last"; then
  echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2
  exit 1
fi
echo $$ >> "$FAKE_SLURM_LOG/queued"
echo $$
"""
FAKE_SCANCEL = """#!/bin/sh
for id; do echo "$id" >> "$FAKE_SLURM_LOG/cancelled"; done
"""
FAKE_SQUEUE = """#!/bin/sh
echo "${FAKE_SQUEUE_STATE:-}"
"""


def fake_slurm(folder: Path, refuse: str = "", squeue_state: str = "") -> tuple[dict[str, str], Path]:
    """(env with stand-ins for sbatch, scancel and squeue first on PATH, their log folder)."""
    bin_dir, log = folder / "bin", folder / "log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log.mkdir(exist_ok=True)
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = cli_env(bin_dir)
    env.update(FAKE_SLURM_LOG=str(log), FAKE_REFUSE=refuse, FAKE_SQUEUE_STATE=squeue_state)
    return env, log


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []
