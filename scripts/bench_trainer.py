#!/usr/bin/env python
"""Steady-state throughput of hpctrain's Trainer against a hand-written DDP loop.

The baseline is the classic tutorial pattern: spawn + gloo + DistributedSampler + DDP, with a
loss print every `log_every` steps. Both sides train the same model on the same data, batch and
process count, in the same process group, in interleaved rounds (this machine is noisy).

Steady state = time(long run) - time(short run): start-up, the final evaluation and the weights
save appear in both and cancel. Printed: per-round times, medians and the ratio
hpctrain samples/s / baseline samples/s (target >= 0.98).

    python scripts/bench_trainer.py [--nprocs 2] [--rounds 7] [--short 20] [--long 620] [--memory-tier]
        [--versus OVERRIDE ...] [overrides...]

--memory-tier: the hpctrain side copies its whole state every step to a memory holder (the
in-memory tier at trainer.memory_ckpt_every=1): its ratio against a run without is the tier's cost.

--versus OVERRIDE: a third side, hpctrain with these overrides too, timed in the same rounds; the
ratio variant/hpctrain is then what the overrides change, each round's three sides in rotated order
(`--versus trainer.straggler_threshold=0`: the straggler watch's cost, as hpctrain/variant).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from hpctrain import config as hconfig
from hpctrain.config import Config, load_run_config, save_resolved, targets
from hpctrain.dist.context import DistContext
from hpctrain.process.signals import StopFlag
from hpctrain.process.watchdog import start_watchdog
from hpctrain.run.memory_wire import TOKEN_ENV
from hpctrain.trainer.hooks import ProcessHooks
from hpctrain.trainer.trainer import Trainer

# Same arithmetic on both sides: no clipping, no schedule, no mid-run evaluation.
# Periodic checkpoints are off (the baseline has none); the final one is in both runs and cancels.
FAIRNESS = [
    "trainer.grad_clip=0",
    "sched=constant",
    "trainer.eval_every=0",
    "trainer.threads=1",
    "trainer.ckpt_every=0",
]


def baseline(config: Config, ctx: DistContext, steps: int) -> None:
    """The tutorial loop, written the way most DDP examples write it."""
    torch.manual_seed(config.trainer.seed)
    splits = targets.build(config.data.dataset)
    model = targets.build(config.model)
    ddp = DistributedDataParallel(model)
    optimizer = targets.build(config.optim, ddp.parameters())
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        splits.train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True
    )
    loader = DataLoader(splits.train, batch_size=config.data.batch_size, sampler=sampler, drop_last=True)
    step, epoch = 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for inputs, target in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(inputs), target)
            loss.backward()
            optimizer.step()
            step += 1
            if step % config.trainer.log_every == 0:
                loss.item()  # the tutorial's periodic loss print: one host sync
            if step == steps:
                break
        epoch += 1


# With --memory-tier: this round's memory holder (rank 0's child), as the batch script starts one per node.
_holder: list[subprocess.Popen[bytes]] = []


def fresh_holder(run_dir: Path) -> None:
    """A new memory holder for the round (the last round's copies would be resumed from), named
    after this machine, where every rank runs: its start-up is in the short and the long run alike."""
    for old in _holder:
        old.kill()
        old.wait()
    _holder.clear()
    shutil.rmtree(run_dir / "memory", ignore_errors=True)
    env = {**os.environ, "SLURMD_NODENAME": socket.gethostname()}
    _holder.append(subprocess.Popen([sys.executable, "-m", "hpctrain.recovery.memory_holder", str(run_dir)], env=env))
    while not (run_dir / "memory" / f"{socket.gethostname()}.addr").exists():
        time.sleep(0.01)


def hpctrain_run(run_dir: Path, ctx: DistContext) -> None:
    # Every round starts fresh: a checkpoint left by the last round would resume at its end.
    if ctx.rank == 0:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        if os.environ.get(TOKEN_ENV):
            fresh_holder(run_dir)
    dist.barrier()
    config = load_run_config(run_dir)
    # What a training process lends its trainer: an uninstalled stop flag (no signal stops a
    # round), a watchdog as trainer.hang_timeout_s says, and no start-up clock.
    hooks = ProcessHooks(StopFlag(config.slurm.signal), start_watchdog(config, ctx, run_dir), ready=dict)
    Trainer(config, ctx, run_dir, hooks).train()


def timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    dist.barrier()
    started = time.perf_counter()
    fn(*args)
    dist.barrier()
    return time.perf_counter() - started


def worker(rank: int, nprocs: int, store: str, runs: dict[str, str], rounds: int, out: str) -> None:
    torch.set_num_threads(1)
    ctx = DistContext.for_spawn(rank, nprocs, store)
    dist.init_process_group("gloo", init_method=ctx.init_method, rank=rank, world_size=nprocs)
    configs = {name: load_run_config(Path(path)) for name, path in runs.items()}
    lines = []
    # Round -1 warms allocators, kernels and page caches for both sides and is not counted.
    sides = ["baseline", "hpctrain", *(["variant"] if "variant_short" in runs else [])]
    for round_ in range(-1, rounds):
        times = {}
        # Each round starts with the next side: no side always runs first (or always after another).
        turn = sides[round_ % len(sides) :] + sides[: round_ % len(sides)]
        for length in ("short", "long"):
            for side in turn:
                key = f"{side}_{length}"
                if side == "baseline":
                    times[key] = timed(baseline, configs[length], ctx, configs[length].trainer.max_steps)
                else:
                    times[key] = timed(hpctrain_run, Path(runs[length if side == "hpctrain" else key]), ctx)
        if round_ < 0:
            continue
        lines.append(" ".join(f"{k}={v:.4f}" for k, v in times.items()))
        for holder in _holder:  # the round's copies gone with it
            holder.kill()
        if rank == 0:
            print(f"round {round_}: " + lines[-1], flush=True)
    if rank == 0:
        Path(out).write_text("\n".join(lines))
    dist.destroy_process_group()


def make_run_dir(root: Path, name: str, overrides: list[str]) -> Path:
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    _, resolved = hconfig.to_typed(cfg, overrides)
    run_dir = root / name
    run_dir.mkdir()
    save_resolved(resolved, run_dir / "config.yaml")
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--short", type=int, default=20, help="steps of the short run")
    parser.add_argument("--long", type=int, default=620, help="steps of the long run")
    parser.add_argument(
        "--memory-tier",
        action="store_true",
        help="hpctrain copies its state to a memory holder every step (trainer.memory_ckpt_every=1)",
    )
    parser.add_argument(
        "--versus",
        nargs="+",
        default=[],
        metavar="OVERRIDE",
        help="a third side: hpctrain with these overrides too (its ratio against hpctrain is printed)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both sides, e.g. model=mlp")
    args = parser.parse_args()
    if args.memory_tier:
        os.environ[TOKEN_ENV] = "bench"  # inherited by the ranks and their holder
        args.overrides = [*args.overrides, "trainer.memory_ckpt_every=1"]
    hconfig.register()
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-") as tmp:
        root = Path(tmp)
        common = [*FAIRNESS, *args.overrides]
        runs = {
            "short": str(make_run_dir(root, "short", [*common, f"trainer.max_steps={args.short}"])),
            "long": str(make_run_dir(root, "long", [*common, f"trainer.max_steps={args.long}"])),
        }
        if args.versus:
            for length, steps in (("short", args.short), ("long", args.long)):
                name = f"variant_{length}"
                runs[name] = str(make_run_dir(root, name, [*common, *args.versus, f"trainer.max_steps={steps}"]))
        out = root / "times.txt"
        mp.start_processes(
            worker,
            args=(args.nprocs, str(root / "store"), runs, args.rounds, str(out)),
            nprocs=args.nprocs,
            start_method="spawn",
        )
        rows = [dict(kv.split("=") for kv in line.split()) for line in out.read_text().splitlines()]
    sides = ("baseline", "hpctrain", "variant") if args.versus else ("baseline", "hpctrain")
    steady = {side: [float(r[f"{side}_long"]) - float(r[f"{side}_short"]) for r in rows] for side in sides}
    steps = args.long - args.short
    base, ours = statistics.median(steady["baseline"]), statistics.median(steady["hpctrain"])
    # Paired per-round ratios show how much of the spread is machine noise.
    paired = [b / h for b, h in zip(steady["baseline"], steady["hpctrain"])]
    print(f"steady-state seconds for {steps} steps, {args.nprocs} processes, overrides {args.overrides or 'none'}")
    print(f"  baseline: median {base:.3f}  all {[round(x, 3) for x in steady['baseline']]}")
    print(f"  hpctrain: median {ours:.3f}  all {[round(x, 3) for x in steady['hpctrain']]}")
    print(f"  paired ratios: {[round(x, 3) for x in paired]} (median {statistics.median(paired):.3f})")
    print(f"throughput ratio hpctrain/baseline = {base / ours:.3f} (target >= 0.98)")
    if args.versus:
        variant = steady["variant"]
        against = sorted(v / h for v, h in zip(variant, steady["hpctrain"]))  # > 1: the variant is slower
        p90 = against[min(len(against) - 1, round(0.9 * (len(against) - 1)))]
        shown = [round(x, 3) for x in variant]
        print(f"  variant ({' '.join(args.versus)}): median {statistics.median(variant):.3f}  all {shown}")
        print(
            f"throughput ratio hpctrain/variant = {statistics.median(variant) / ours:.3f}"
            f" (paired per round: median {statistics.median(against):.3f}, p90 {p90:.3f})"
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
