#!/usr/bin/env python
"""DDP against FSDP on 2 processes (CPU, gloo): memory per rank, step time, checkpoint blocking
time and size, for the GPT at two sizes.

Each measurement is a fresh pair of processes (spawned, a file:// rendezvous) building the model
with hpctrain's own code (hpctrain.trainer.components.wrap, hpctrain.trainer.sharding.shard), an
AdamW, and the checkpointer the trainer would use (PlainCheckpointer for ddp, ShardedCheckpointer for
fsdp). Strategies run in rotated order within each round (this machine is noisy); medians over the
rounds, and the p90 of the step times, are printed, with fsdp's ratios to ddp's measured in the
same rounds.

    state_mb       parameters + gradients + optimizer state this rank holds (a DTensor counts its
                   local shard), after one step
    step_s         one optimizer step (forward, backward, the gradients' reduction, AdamW)
    blocking_s     the save's blocking part (background save: the copy to host memory)
    ckpt_mb        the checkpoint's bytes on disk (all files)

    python scripts/bench_fsdp.py --rounds 3 --steps 20
    python scripts/bench_fsdp.py --rounds 3 --steps 10 --batch 16 --seq 128   # 2,048 tokens a step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {
    "gpt-small": {"n_layer": 4, "n_embd": 128, "n_head": 4},
    "gpt-medium": {"n_layer": 8, "n_embd": 256, "n_head": 8},
}
VOCAB = 512


def _rank(
    rank: int, nprocs: int, store: str, strategy: str, size: str, steps: int, out: str, batch: int, seq: int
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    from hpctrain.checkpoint import Checkpointer, PlainCheckpointer, ShardedCheckpointer
    from hpctrain.config import TrainerConfig
    from hpctrain.dist.context import DistContext
    from hpctrain.models.gpt import GPT
    from hpctrain.run.causes import CheckpointReason
    from hpctrain.trainer import components, sharding

    ctx = DistContext.for_spawn(rank, nprocs, store, cuda_devices=0)
    dist.init_process_group("gloo", init_method=ctx.init_method, rank=rank, world_size=nprocs)
    torch.manual_seed(0)
    raw = GPT(vocab_size=VOCAB, block_size=seq, dropout=0.0, bias=True, **SIZES[size])
    trainer = TrainerConfig(strategy=strategy, max_steps=1)
    if strategy == "fsdp":
        model = sharding.shard(raw, trainer, ctx)
    else:
        model, _ = components.wrap(raw, trainer, ctx)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(VOCAB, (batch, seq + 1), generator=generator)

    def step() -> float:
        started = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        took = time.perf_counter() - started
        # Counted outside the timed step (walking DTensors is no part of training).
        step.state_bytes = sharding.local_bytes(  # type: ignore[attr-defined]
            [*raw.parameters(), *[p.grad for p in raw.parameters() if p.grad is not None]]
            + [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        )
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        return took + time.perf_counter() - started

    step()  # warm-up (and the optimizer's state)
    times = [step() for _ in range(steps)]
    folder = Path(out) / "checkpoints"

    def ignore(record: Any) -> None:
        pass

    # Both kinds save the model and the optimizer they were given, and the rest of the state handed over.
    kind = ShardedCheckpointer if strategy == "fsdp" else PlainCheckpointer
    checkpointer: Checkpointer = kind(folder, ctx, 2, "bench", ignore, model=raw, optimizer=optimizer)
    tree: dict[str, Any] = {"train": {"step": 1}}
    checkpointer.save(1, tree, CheckpointReason.PERIODIC, background=True)  # warm-up: buffers
    checkpointer.wait()
    dist.barrier()
    blocking_s = checkpointer.save(2, tree, CheckpointReason.PERIODIC, background=True)
    checkpointer.wait()
    dist.barrier()
    if rank == 0:
        step2 = [p for p in folder.iterdir() if p.name.startswith("step_00000002")]
        ckpt_bytes = sum(f.stat().st_size for p in step2 for f in ([p] if p.is_file() else p.iterdir()))
        result = {
            "state_mb": step.state_bytes / 2**20,  # type: ignore[attr-defined]
            "step_s": times,
            "blocking_s": blocking_s,
            "ckpt_mb": ckpt_bytes / 2**20,
        }
        (Path(out) / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(strategy: str, size: str, steps: int, batch: int, seq: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        store = os.path.join(out, "store")
        options = (2, store, strategy, size, steps, out, batch, seq)
        mp.start_processes(_rank, args=options, nprocs=2, start_method="spawn")
        return json.loads((Path(out) / "result.json").read_text())


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main() -> None:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--rounds", type=int, default=3)
    parse.add_argument("--steps", type=int, default=20)
    parse.add_argument("--batch", type=int, default=4, help="sequences a step on each process")
    parse.add_argument("--seq", type=int, default=64, help="tokens a sequence")
    args = parse.parse_args()
    strategies = ["ddp", "fsdp"]
    for size in SIZES:
        got: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
        for round_ in range(args.rounds):
            order = strategies[round_ % 2 :] + strategies[: round_ % 2]  # rotated
            for strategy in order:
                got[strategy].append(measure(strategy, size, args.steps, args.batch, args.seq))
        shape = f"{args.batch} x {args.seq} tokens a step on each"
        print(f"{size} ({SIZES[size]}), 2 processes, {shape}, {args.rounds} rounds x {args.steps} steps:")
        medians: dict[str, dict[str, float]] = {}
        for strategy in strategies:
            runs = got[strategy]
            steps_all = [t for r in runs for t in r["step_s"]]
            medians[strategy] = {
                "state_mb": statistics.median(r["state_mb"] for r in runs),
                "step_s": statistics.median(steps_all),
                "step_p90_s": p90(steps_all),
                "blocking_s": statistics.median(r["blocking_s"] for r in runs),
                "ckpt_mb": statistics.median(r["ckpt_mb"] for r in runs),
            }
            m = medians[strategy]
            print(
                f"  {strategy:4s}  state {m['state_mb']:7.2f} MB/rank  step {m['step_s'] * 1000:7.1f} ms "
                f"(p90 {m['step_p90_s'] * 1000:.1f})  save blocks {m['blocking_s'] * 1000:6.1f} ms  "
                f"checkpoint {m['ckpt_mb']:6.2f} MB"
            )
        ratio = {k: medians["fsdp"][k] / medians["ddp"][k] for k in medians["ddp"]}
        print(
            f"  fsdp/ddp: state {ratio['state_mb']:.2f}x, step {ratio['step_s']:.2f}x "
            f"(p90 {ratio['step_p90_s']:.2f}x), save blocking {ratio['blocking_s']:.2f}x, "
            f"checkpoint size {ratio['ckpt_mb']:.2f}x"
        )


if __name__ == "__main__":
    main()
