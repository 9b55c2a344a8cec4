"""scripts/bench_memory_copy.py runs end to end at a tiny size, its copies reaching a real holder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_memory_copy.py"


def test_bench_memory_copy_tiny() -> None:
    command = [sys.executable, str(SCRIPT), "--size-gb", "0.005", "--rounds", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The warm-up copy and one a round, each sent whole to the holder.
    assert re.search(r"2 rounds, 3 copies sent whole", done.stdout), done.stdout
    assert re.search(r"tier / plain copy = \d+\.\d+ \(paired per round", done.stdout), done.stdout
