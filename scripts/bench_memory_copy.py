#!/usr/bin/env python
"""What training waits for when the in-memory tier copies its state, against a plain copy.

    python scripts/bench_memory_copy.py [--size-gb 0.3] [--rounds 9]

One process (DistContext.single()), a GPT's model and AdamW state sized to --size-gb
(bench_checkpoint.py's), and one real memory holder (hpctrain.recovery.memory_holder). Each round
times, in rotated order:

    copy_s      a plain copy of every tensor of the state into buffers allocated (and touched)
                before timing: the floor for any copy to host memory (on a GPU, the plain
                device-to-host copy)
    tier_s      MemoryTier.stepped's blocking part (the state dicts taken, the rank's shards
                where the model is sharded, the copy into the tier's reused buffers, the RNG):
                what training waits for. Its background send to the holder is waited for
                before the next timing, and not timed.

The first copy of each (buffers allocated) is warm-up. Printed: medians and p90, and the ratio
tier / plain copy (the issue's target: within 1.1x).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_checkpoint sits beside this file

from bench_checkpoint import all_tensors, build_training, gpt_shape, trainer_state  # noqa: E402

from hpctrain.checkpoint.memory_client import HolderClient, holder_addresses  # noqa: E402
from hpctrain.checkpoint.memory_tier import MemoryTier  # noqa: E402
from hpctrain.dist.context import DistContext  # noqa: E402
from hpctrain.run.memory_wire import TOKEN_ENV  # noqa: E402

TOKEN = "bench"


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer = build_training(gpt_shape(args.size_gb, 1024, 48828, 256))
    state = trainer_state(model, optimizer, step=1)
    tensors = [t.detach() for t in all_tensors(state)]
    buffers = [torch.empty_like(t).fill_(0) for t in tensors]
    size = sum(t.numel() * t.element_size() for t in tensors)
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-memory-") as tmp:
        run_dir = Path(tmp)
        env = {**os.environ, TOKEN_ENV: TOKEN, "SLURMD_NODENAME": socket.gethostname()}
        holder = subprocess.Popen([sys.executable, "-m", "hpctrain.recovery.memory_holder", str(run_dir)], env=env)
        try:
            while not holder_addresses(run_dir / "memory"):
                time.sleep(0.05)
            clients = [HolderClient(a, TOKEN, timeout_s=60) for a in holder_addresses(run_dir / "memory").values()]
            tier = MemoryTier(DistContext.single(), 1, clients, model, optimizer, fingerprint="bench")
            rest = {"scheduler": None, "scaler": None, "train": state["train"]}

            def plain() -> float:
                started = time.perf_counter()
                for source, target in zip(tensors, buffers):
                    target.copy_(source)
                return time.perf_counter() - started

            def tiered(step: int) -> float:
                tier.stepped(step, lambda: rest)
                took = tier.counts.blocking_s
                tier.wait()  # its send, untimed, off the next timing
                return took

            plain()
            tiered(1)  # warm-up: the tier's buffers allocated
            times: dict[str, list[float]] = {"copy_s": [], "tier_s": []}
            for round_ in range(args.rounds):
                sides = ["copy_s", "tier_s"] if round_ % 2 == 0 else ["tier_s", "copy_s"]
                for side in sides:
                    times[side].append(plain() if side == "copy_s" else tiered(round_ + 2))
            tier.close()
            sent = tier.counts.sent
        finally:
            holder.kill()
            holder.wait()
    copy_s, tier_s = statistics.median(times["copy_s"]), statistics.median(times["tier_s"])
    print(f"state {size / 1e9:.2f} GB ({len(tensors)} tensors), {args.rounds} rounds, {sent} copies sent whole")
    for side in ("copy_s", "tier_s"):
        print(f"  {side:<7} median {statistics.median(times[side]):.4f}  p90 {p90(times[side]):.4f}")
    ratios = [t / c for t, c in zip(times["tier_s"], times["copy_s"])]
    print(
        f"tier / plain copy = {tier_s / copy_s:.3f} (paired per round: median {statistics.median(ratios):.3f},"
        f" p90 {p90(ratios):.3f}; target <= 1.1)"
    )


if __name__ == "__main__":
    main()
