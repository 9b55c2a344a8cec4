"""scripts/bench_checkpoint.py runs end to end at a tiny size and cleans up after itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_checkpoint.py"


def test_bench_checkpoint_tiny(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--size-gb",
            "0.01",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--step-ms",
            "5",
            "--settle-s",
            "0.1",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for needed in (
        "hpctrain blocking / plain copy",
        "torch.save / hpctrain blocking",
        "during-write step / normal step",
        "re-hashed and verified",
        "writer on the training's core",
        "forced save with a write under way",
        "p90/p90",
        "step_00000006.pt",
    ):
        assert needed in proc.stdout, proc.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone
