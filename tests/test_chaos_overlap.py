"""A short seeded overlap soak on the dev cluster (scripts/chaos.py --overlap): faults that come
while the job still recovers from the one before, the node running the batch script and an
administrator's requeue among them, and still one exact result. The suite's one soak on the dev
cluster: it runs every kind of the classic catalogue too, six of its ten faults alone, as the
classic mode runs them all (`python scripts/chaos.py --minutes 6 --seed 1` runs that mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.soak import run_soak
from slurmtools import REPO

sys.path.insert(0, str(REPO / "scripts"))
import chaos  # noqa: E402

SOAK_MINUTES = 6
SEED = 3
OVERLAP = 0.5


def test_the_seed_overlaps_what_the_soak_is_for() -> None:
    """The schedule this test runs: the whole catalogue once, some faults overlapping."""
    plan = chaos.schedule(SEED, SOAK_MINUTES, overlap=OVERLAP)
    assert sorted(f.kind for f in plan) == sorted(chaos.FULL_KINDS)
    assert sum(f.overlap_s is not None for f in plan) >= 3, plan


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.soak
def test_a_short_overlap_soak_ends_exact_with_every_fault_applied(tmp_path: Path) -> None:
    args = ("--minutes", str(SOAK_MINUTES), "--seed", str(SEED), "--overlap", str(OVERLAP))
    result, output, returncode = run_soak(tmp_path, *args)
    assert {row["kind"] for row in result["faults"]} == set(chaos.FULL_KINDS), output
    failed = {name: check["detail"] for name, check in result["checks"].items() if not check["passed"]}
    assert not failed, output
    assert returncode == 0, output
