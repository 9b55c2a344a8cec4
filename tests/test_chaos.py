"""The chaos soak (scripts/chaos.py): its seeded schedule, and its end checks.

The soak on the dev cluster runs in tests/test_chaos_overlap.py: an overlap soak runs every kind
of this catalogue (and two more), most of its faults alone as this mode runs them all, so a
classic soak beside it would spend four minutes of the suite on nothing more."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from slurmtools import REPO

sys.path.insert(0, str(REPO / "scripts"))
import chaos  # noqa: E402

SHORT_SOAK_MINUTES = 6


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert chaos.schedule(3, 30) == chaos.schedule(3, 30)
    assert chaos.schedule(3, 30) != chaos.schedule(4, 30)


def test_every_kind_of_fault_comes_in_each_round_of_the_catalogue() -> None:
    for seed in range(20):
        plan = chaos.schedule(seed, 30)
        kinds = [fault.kind for fault in plan]
        for first in range(0, len(kinds) - len(chaos.KINDS) + 1, len(chaos.KINDS)):
            assert sorted(kinds[first : first + len(chaos.KINDS)]) == sorted(chaos.KINDS), seed
        assert {fault.rank for fault in plan} <= {0, 1}


def test_fault_times_rise_inside_the_training_window() -> None:
    for minutes in (SHORT_SOAK_MINUTES, 30):
        plan = chaos.schedule(11, minutes)
        times = [fault.at_s for fault in plan]
        assert times == sorted(times) and times[0] == chaos.WARMUP_S
        assert times[-1] <= chaos.training_seconds(minutes, len(plan))
    assert len(chaos.schedule(11, SHORT_SOAK_MINUTES)) >= 8
    # A 30-minute soak: a fault every few minutes at most, the catalogue several times over.
    assert len(chaos.schedule(11, 30)) >= 2 * len(chaos.KINDS)


def test_a_count_of_faults_can_be_asked_for() -> None:
    assert len(chaos.schedule(5, 30, count=6)) == 6
    assert [f.kind for f in chaos.schedule(5, 30, count=6)] == [f.kind for f in chaos.schedule(5, 30, count=6)]


def _run_dir(root: Path, steps: list[int], weights: dict) -> Path:
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text(
        json.dumps({"event": "start", "time": 100.0, "job_id": "5", "resumed_from_step": 0})
        + "\n"
        + json.dumps({"event": "finish", "time": 110.0, "job_id": "5", "step": steps[-1]})
        + "\n"
    )
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": 100.0 + s}) + "\n" for s in steps))
    torch.save(weights, root / "model.pt")
    return root


def test_the_end_checks_fail_on_a_step_twice_other_weights_or_a_job_left(tmp_path: Path) -> None:
    import chaos_report
    import chaos_soak

    weights = {"w": torch.arange(4.0)}
    reference = _run_dir(tmp_path / "reference", [1, 2, 3], weights)
    good = chaos_soak.Soak(1, 6, _run_dir(tmp_path / "good", [1, 2, 3], weights), reference, job_ids=["5"])
    good.final_state = "COMPLETED"
    result = chaos_report.report(good, max_steps=3)
    assert result["passed"], result["checks"]
    assert "PASS  every step once in metrics.jsonl" in chaos_report.render(result)

    bad = chaos_soak.Soak(1, 6, _run_dir(tmp_path / "bad", [1, 2, 2, 3], {"w": torch.arange(4.0) + 1e-7}), reference)
    bad.final_state, bad.jobs_left = "COMPLETED", ["5"]
    bad.skipped = ["#3 torn_checkpoint and later: job 5 stuck: PENDING with Reason=BadConstraints for 60 s"]
    failed = {name for name, check in chaos_report.report(bad, max_steps=3)["checks"].items() if not check["passed"]}
    assert failed == {
        "model.pt bit-identical to the uninterrupted run",
        "every step once in metrics.jsonl",
        "every fault applied",
        "no job left",
    }


def test_the_overlap_soak_draws_its_overlaps_from_the_seed_and_keeps_the_rest() -> None:
    plan = chaos.schedule(9, 30, overlap=0.5)
    assert plan == chaos.schedule(9, 30, overlap=0.5)
    assert {fault.kind for fault in plan} == set(chaos.FULL_KINDS)  # the batch host and admin requeue too
    overlapping = [fault for fault in plan if fault.overlap_s is not None]
    assert plan[0].overlap_s is None and 0.25 * len(plan) <= len(overlapping) <= 0.75 * len(plan)
    assert all(chaos.OVERLAP_DELAY_S[0] <= f.overlap_s <= chaos.OVERLAP_DELAY_S[1] for f in overlapping)  # type: ignore[operator]
    # Another chance changes which faults overlap, not the faults themselves.
    others = chaos.schedule(9, 30, overlap=0.9)
    assert [(f.kind, f.at_s, f.rank) for f in others] == [(f.kind, f.at_s, f.rank) for f in plan]
    assert sum(f.overlap_s is not None for f in others) > len(overlapping)
    # Without overlap, the classic catalogue and no overlapping fault.
    assert all(f.overlap_s is None and f.kind in chaos.KINDS for f in chaos.schedule(9, 30))


def test_on_a_site_that_blocks_udp_a_silent_node_or_a_keeper_that_never_said_so_fails(tmp_path: Path) -> None:
    """--udp-blocked: the watcher hears no one, so a `silent` event is a false alarm; and the
    keeper, never armed, must have said so in its own output."""
    import chaos_report
    import chaos_soak

    weights = {"w": torch.arange(4.0)}
    reference = _run_dir(tmp_path / "reference", [1, 2, 3], weights)
    quiet = _run_dir(tmp_path / "quiet", [1, 2, 3], weights)
    (quiet / "keeper-5.out").write_text(
        "hpctrain keeper: no answer from the batch host's watcher at node1:40000 in 60 s (UDP between the nodes "
        "blocked?): the batch host is not watched\n"
    )
    soak = chaos_soak.Soak(1, 6, quiet, reference, job_ids=["5"], udp_blocked=True)
    soak.final_state = "COMPLETED"
    result = chaos_report.report(soak, max_steps=3)
    assert result["passed"] and "the keeper said it is not armed" in result["checks"], result["checks"]

    heard = _run_dir(tmp_path / "heard", [1, 2, 3], weights)
    with open(heard / "events.jsonl", "a") as journal:
        journal.write(
            json.dumps(
                {
                    "event": "silent",
                    "time": 101.5,
                    "nodes": ["node2"],
                    "ranks": [1],
                    "silent_s": 10.2,
                    "timeout_s": 10.0,
                }
            )
            + "\n"
        )
    loud = chaos_soak.Soak(1, 6, heard, reference, job_ids=["5"], udp_blocked=True)
    loud.final_state = "COMPLETED"
    failed = {name for name, check in chaos_report.report(loud, max_steps=3)["checks"].items() if not check["passed"]}
    assert failed == {"no silent node heard (UDP blocked)", "the keeper said it is not armed"}


def test_udp_blocked_and_the_batch_hosts_freeze_are_refused_together() -> None:
    import pytest

    with pytest.raises(SystemExit):
        chaos.parse(["--minutes", "6", "--seed", "1", "--udp-blocked", "--batch-freeze"])
    assert chaos.parse(["--minutes", "6", "--seed", "1", "--udp-blocked"]).udp_blocked


def test_each_fault_is_charged_the_start_up_it_caused_and_the_steps_its_life_redid() -> None:
    import chaos_report

    def life(began: float, ended: float, startup: float, redone: float, detection: float = 0.0) -> dict:
        return {"began": began, "ended": ended, "startup_s": startup, "redone_s": redone, "detection_s": detection}

    lives = [
        life(0, 100, startup=5, redone=10),  # the job's own start; ended by the fault at 90
        life(130, 300, startup=20, redone=2, detection=8),  # drained at 200 (trained on), ended at 280
        life(290, 500, startup=10, redone=0),  # to the finish, no fault within it
    ]
    assert chaos_report.lost_by_fault(lives, [90, 200, 280]) == [30, 0, 20]
    assert chaos_report.lost_by_fault(lives, []) == []
    rows = [{"kind": "kill_rank", "lost_s": s} for s in (30.0, 10.0, 20.0)] + [{"kind": "node_drain", "lost_s": 0.0}]
    assert chaos_report.lost_by_kind(rows) == {
        "kill_rank": {"faults": 3, "p50_s": 20.0, "p95_s": 30.0},
        "node_drain": {"faults": 1, "p50_s": 0.0, "p95_s": 0.0},
    }


def test_kinds_narrow_the_catalogue_and_a_wrong_kind_is_refused_naming_the_kinds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = chaos.parse(["--minutes", "12", "--seed", "3", "--faults", "6", "--kinds", "kill_rank,stop_rank"])
    plan = chaos.schedule(args.seed, args.minutes, args.faults, args.overlap, (), args.kinds)
    assert sorted(f.kind for f in plan) == ["kill_rank"] * 3 + ["stop_rank"] * 3  # whole rounds of the two
    with pytest.raises(SystemExit):
        chaos.parse(["--minutes", "6", "--seed", "1", "--kinds", "kill_rank,kill_node"])
    said = capsys.readouterr().err
    assert "--kinds: no such kind kill_node" in said and "batch_freeze" in said, said


# The relaunch's `start` of a soak here (seed 33), its time set by each case.
RELAUNCH_START = {
    "event": "start",
    "job_id": "16817000",
    "restart": 0,
    "world_size": 2,
    "nodes": ["node1", "node3"],
    "resumed_from_step": 155,
    "resumed_from": "memory",
    "total_steps": 17050,
    "ranks": [{"node": "node1", "gpu": None, "device": "cpu", "cpus": [0]}] * 2,
    "allocated_at": 1796387800.73,
    "startup": {"launch_s": 0.216, "imports_s": 0.085, "rendezvous_s": 0.647, "resume_s": 0.333},
    "job_nodes": 3,
}


def test_a_drained_node_stays_drained_until_the_job_left_it_or_the_watch_had_time(tmp_path: Path) -> None:
    """Resumed after 1 to 10 s, as the soak once did, a drain was gone before the drain watch's
    next look (every 30 s): the soak measured no drain at all."""
    import time

    import chaos_soak

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    soak = chaos_soak.Soak(34, 30, run_dir, tmp_path / "reference", job_ids=["16817000"])
    drain = chaos_soak.Fault(1, 20.0, "node_drain", 0, 0)
    now = time.time()
    soak.injected = [chaos_soak.Injected(drain, now - 20, "node2", "16817000", 161)]
    assert chaos_soak.drain_held(soak) == {"node2"}  # the watch may not have looked yet
    assert chaos_soak.recovered_after(soak) is None

    (run_dir / "events.jsonl").write_text(json.dumps({**RELAUNCH_START, "time": now - 5}) + "\n")
    assert chaos_soak.drain_held(soak) == set()  # left for the spare: maintenance may end
    assert chaos_soak.recovered_after(soak) == pytest.approx(now - 5)

    (run_dir / "events.jsonl").write_text("")
    soak.injected[0].at = now - chaos_soak.DRAIN_NOTICE_S - 1  # no free spare: ridden out
    assert chaos_soak.drain_held(soak) == set()
    assert chaos_soak.recovered_after(soak, settle_s=10) == pytest.approx(now - 1 + 10)

    down = chaos_soak.Fault(2, 40.0, "node_down", 0, 0)
    soak.injected.append(chaos_soak.Injected(down, now, "node2", "16817000", 300))
    assert chaos_soak.drain_held(soak) == set()  # only a drain is held
