"""Ranks agree on a stop request at the same step, voting about every interval_s of training
(real gloo process groups, a real signal handler's flag)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from hpctrain.dist.context import DistContext
from hpctrain.process.signals import StopFlag
from hpctrain.trainer.stop_vote import StopVote

STEPS = 400
STEP_S = 0.002
SIGNAL_AT = {0: 120, 1: 10**9}  # only rank 0 is signalled


def _ranks(rank: int, nprocs: int, store: str, out: str, interval_s: float) -> None:
    ctx = DistContext.for_spawn(rank, nprocs, store)
    dist.init_process_group("gloo", init_method=ctx.init_method, rank=rank, world_size=nprocs)
    stop = StopFlag()
    vote = StopVote(stop, ctx, interval_s=interval_s)
    vote.start(0)
    polls, stopped_at, reason = [], None, None
    for step in range(1, STEPS + 1):
        time.sleep(STEP_S * (1 + rank))  # rank 1 is slower: its proposal should win
        if step == SIGNAL_AT[rank]:
            stop._handle(signal.SIGTERM, None)  # what the installed handler does on preemption
        if step >= vote.due_step:
            polls.append(step)
        reason = vote.poll(step)
        if reason:
            stopped_at = step
            break
    Path(out, f"{rank}.json").write_text(json.dumps({"stopped_at": stopped_at, "reason": reason, "polls": polls}))
    dist.destroy_process_group()


def _run(tmp_path: Path, interval_s: float) -> list[dict]:
    mp.spawn(_ranks, args=(2, str(tmp_path / "store"), str(tmp_path), interval_s), nprocs=2, join=True)
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]


def test_every_rank_stops_at_the_same_step_soon_after_the_signal(tmp_path: Path) -> None:
    ranks = _run(tmp_path, interval_s=0.05)
    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] is not None
    assert ranks[0]["reason"] == ranks[1]["reason"] == "preempt"
    assert ranks[0]["polls"] == ranks[1]["polls"]  # both voted at the same boundaries
    # Acted on within about two intervals: rank 1's steps take ~4 ms, so ~12 steps an interval.
    assert 120 < ranks[0]["stopped_at"] <= 120 + 2 * 13 + 2, ranks[0]


def test_short_steps_vote_far_less_often_than_every_step(tmp_path: Path) -> None:
    ranks = _run(tmp_path, interval_s=0.05)
    polls = ranks[0]["polls"]
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    # After the first vote (no timing yet) the slower rank's ~4 ms steps set ~12 steps a vote.
    assert gaps and max(gaps) <= 13 and sum(gaps[1:]) / len(gaps[1:]) >= 3, gaps
