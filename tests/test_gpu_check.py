"""scripts/gpu_check.py's CPU half, so that the command a lent GPU runs cannot rot unseen: every
check runs and passes on CPU (the GPU half is the same code on `--device cuda`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = ["binding", "ddp bf16", "checkpoint", "fsdp bf16", "resume", "step time"]


def test_the_gpu_checks_cpu_half_passes_and_prints_its_table(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick", "--out", str(out)]
        + ["--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ROWS, text  # the header row first
    assert text.count("| PASS |") == len(ROWS), text
    assert "0 tensors differ" in text and "rank 0 on cpu" in text
