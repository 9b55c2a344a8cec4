#!/usr/bin/env python
"""How long training waits for a checkpoint, and how much the background write slows it down.

One process, no process group (DistContext.single()). The state is a GPT's model + AdamW state
(two moments, after one real optimizer step) sized to --size-gb, saved the way the Trainer's
`_save` builds it (model / optimizer / scheduler / scaler / train). Measured in interleaved rounds
(this machine is noisy); medians are reported:

    torch_save_s         blocking time of torch.save(state, path) into the same temporary folder
                         (the naive baseline; the file is deleted right after, so its dirty pages
                         are dropped and never compete with the next write)
    copy_s               a plain copy of every distinct tensor into buffers allocated (and touched)
                         before timing: the floor for any snapshot
    hpctrain_blocking_s  Checkpointer.save(step, state, "periodic", background=True) until it
                         returns: the in-memory snapshot into the Snapshotter's reused buffers.
                         Steady state: the first save (which allocates the buffers) is warm-up
                         and not counted
    write_s              the background write of that save (store.write: torch.save through the
                         sha256 hasher, fsync, rename, marker, prune), taken from the on_written
                         record, with nothing else running
    normal_step_s        one fixed training step (a small GPT: forward, backward, AdamW), no write
    during_write_step_s  the same step while a background write is under way (a second save per
                         round; only steps that finished before the write did are counted)
    write_busy_s         write_s of that second save, i.e. with training competing

Ratios, with PASS/FAIL against the targets:
    hpctrain_blocking / copy            target <= 1.5
    torch_save / hpctrain_blocking      the speed-up over the naive baseline
    during_write_step / normal_step     target <= 1.2

All tensor work runs with torch.set_num_threads(--threads) (default 1): on a 2-core machine that
leaves the writer thread a core of its own, as a training process with one thread per core would
have to. Sizes are decimal GB (1e9 bytes). The temporary folder is removed at the end.

The default size is the issue's 2.4 GB. At that size the run keeps about three copies of the
state in memory (live state, the Snapshotter's buffers, the copy floor's buffers: ~7.3 GB) and
writes ~2.4 GB three times per round; --size-gb 0.3 gives a quick run.

    python scripts/bench_checkpoint.py [--size-gb 2.4] [--rounds 3] [--steps 20] [--step-ms 75]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpctrain.checkpoint import Checkpointer, store
from hpctrain.dist import DistContext
from hpctrain.models.gpt import GPT

GB = 1e9
BLOCKING_TARGET = 1.5  # hpctrain blocking / plain copy
STEP_TARGET = 1.2  # step during a background write / normal step


@dataclass
class TrainState:  # the same fields as the Trainer's, so the pickled part is the same size
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


# ---- the state ---------------------------------------------------------------------------------


def gpt_shape(size_gb: float, n_embd: int, vocab: int, block_size: int) -> dict[str, int]:
    """A GPT whose parameters plus two AdamW moments (3 x 4 bytes per parameter) come to ~size_gb."""
    params = size_gb * GB / 12
    # Narrow the model until at least one block fits, then the embeddings to at most a quarter.
    while n_embd > 64 and 12 * n_embd * n_embd > params:
        n_embd //= 2
    vocab = max(64, min(vocab, int(params / 4 / n_embd)))
    per_block = 12 * n_embd * n_embd + 13 * n_embd
    n_layer = max(1, round((params - (vocab + block_size) * n_embd) / per_block))
    n_head = max(1, n_embd // 64)
    return {"vocab_size": vocab, "block_size": block_size, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}


def one_step(model: GPT, optimizer: torch.optim.Optimizer, batch: int, seq: int) -> None:
    idx = torch.randint(model.vocab_size, (batch, seq + 1))
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_training(shape: dict[str, int]) -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(**shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    one_step(model, optimizer, batch=1, seq=8)  # creates AdamW's exp_avg / exp_avg_sq
    return model, optimizer


def trainer_state(model: GPT, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    """What Trainer._save hands the Checkpointer (no scheduler, no fp16 scaler on CPU)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": None,
        "scaler": None,
        "train": asdict(TrainState(step=step)),
    }


def distinct_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in the tree once (the tied embedding/head weight appears twice in a GPT's
    state_dict but is one tensor, and torch.save writes it once)."""
    found: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            key = (node.untyped_storage().data_ptr(), node.storage_offset(), tuple(node.shape))
            found.setdefault(key, node.detach())
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    return list(found.values())


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- the measurements --------------------------------------------------------------------------


class Written:
    """on_written callback: keeps the records and signals the end of each write."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.done = threading.Event()

    def __call__(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.done.set()


class Bench:
    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.shape = gpt_shape(args.size_gb, args.n_embd, args.vocab, args.block_size)
        started = time.perf_counter()
        self.model, self.optimizer = build_training(self.shape)
        self.build_s = time.perf_counter() - started
        self.tensors = distinct_tensors(trainer_state(self.model, self.optimizer, 0))
        self.state_bytes = nbytes(self.tensors)
        self.floor = [torch.empty_like(t) for t in self.tensors]
        self.written = Written()
        self.checkpointer = Checkpointer(
            folder / "checkpoints", DistContext.single(), keep=2, fingerprint="bench", on_written=self.written
        )
        self.ckpt_step = 0
        torch.manual_seed(0)
        self.step_model = GPT(vocab_size=512, block_size=128, n_layer=4, n_head=4, n_embd=256)
        self.step_opt = torch.optim.AdamW(self.step_model.parameters(), lr=1e-4)
        self.step_batch = 1

    # -- the naive baseline, the floor and hpctrain's save --

    def torch_save(self) -> float:
        path = self.folder / "torch_save.pt"
        started = time.perf_counter()
        torch.save(trainer_state(self.model, self.optimizer, self.ckpt_step), path)
        elapsed = time.perf_counter() - started
        path.unlink()
        return elapsed

    def copy(self) -> float:
        started = time.perf_counter()
        for buffer, tensor in zip(self.floor, self.tensors):
            buffer.copy_(tensor)
        return time.perf_counter() - started

    def save(self) -> float:
        """Start a background save as the Trainer does; the seconds until training may go on."""
        self.ckpt_step += 1
        self.written.done.clear()
        started = time.perf_counter()
        state = trainer_state(self.model, self.optimizer, self.ckpt_step)
        self.checkpointer.save(self.ckpt_step, state, "periodic", background=True)
        return time.perf_counter() - started

    def save_and_wait(self) -> tuple[float, float]:
        blocking = self.save()
        self.checkpointer.wait()  # re-raises a failed write
        return blocking, self.written.records[-1]["write_s"]

    # -- the training step --

    def step(self) -> float:
        started = time.perf_counter()
        one_step(self.step_model, self.step_opt, self.step_batch, 128)
        return time.perf_counter() - started

    def calibrate_step(self) -> float:
        """Pick the batch size that makes one step take about --step-ms."""
        for _ in range(2):
            self.step()
        self.step_batch = 4
        probe = statistics.median(self.step() for _ in range(3))
        self.step_batch = max(1, round(4 * self.args.step_ms / 1000 / probe))
        return statistics.median(self.step() for _ in range(3))

    def normal_steps(self) -> list[float]:
        return [self.step() for _ in range(self.args.steps)]

    def steps_during_write(self) -> tuple[float, list[float], float]:
        """A background save, then steps until its write is done. Only steps that ended before
        the write did count (the last one straddles the end)."""
        blocking = self.save()
        times = []
        while not self.written.done.is_set():
            elapsed = self.step()
            if not self.written.done.is_set():
                times.append(elapsed)
        self.checkpointer.wait()
        return blocking, times, self.written.records[-1]["write_s"]


# ---- the report --------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "FAIL"


def show_files(folder: Path) -> None:
    print(f"checkpoint files left by the last saves (keep=2) in {folder.name}/:")
    for path in sorted(folder.iterdir()):
        print(f"  {path.name:24s} {path.stat().st_size / GB:8.3f} GB" if path.suffix == ".pt"
              else f"  {path.name:24s} {path.stat().st_size:8d} bytes")
    newest = store.entries(folder)[0]
    started = time.perf_counter()
    meta = store.verify(newest)
    print(
        f"  {newest.meta.name}: step {meta['step']}, size {meta['size']} bytes, sha256 {meta['sha256'][:16]}..., "
        f"reason {meta['reason']}, blocking_s {meta['blocking_s']}; re-hashed and verified in "
        f"{time.perf_counter() - started:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.4,
                        help="model + AdamW state to save, in GB (default 2.4; 0.3 for a quick run)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, after one warm-up round (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="normal training steps timed per round (default 20)")
    parser.add_argument("--step-ms", type=float, default=75.0,
                        help="the timed step's batch is chosen so that one step takes about this long (default 75)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for all tensor work (default 1)")
    parser.add_argument("--n-embd", type=int, default=1024, help="width of the saved GPT (narrowed for small sizes)")
    parser.add_argument("--vocab", type=int, default=50257,
                        help="vocabulary of the saved GPT (reduced so embeddings are <= 1/4 of the parameters)")
    parser.add_argument("--block-size", type=int, default=1024, help="context length of the saved GPT")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the temporary folder goes (default: the system's temporary directory); "
                             "put it on the disk checkpoints will be written to")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.size_gb <= 0:
        parser.error("--rounds and --steps must be >= 1 and --size-gb > 0")
    torch.set_num_threads(args.threads)
    run_started = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-ckpt-", dir=args.dir) as tmp:
        bench = Bench(args, Path(tmp))
        print(
            f"state: GPT {json.dumps(bench.shape)}, {bench.model.num_params() / 1e6:.1f}M parameters + AdamW "
            f"(2 moments) = {bench.state_bytes / GB:.3f} GB in {len(bench.tensors)} tensors "
            f"(built in {bench.build_s:.1f} s); torch threads {torch.get_num_threads()}",
            flush=True,
        )
        step_s = bench.calibrate_step()
        print(f"timed step: GPT 4 x 256, batch {bench.step_batch} x 128 tokens, ~{step_s * 1000:.0f} ms", flush=True)

        # Warm-up (not counted): the first save allocates the Snapshotter's buffers, the first copy
        # faults in the floor's, and both sides see the page cache in the same state afterwards.
        first_blocking, first_write = bench.save_and_wait()
        bench.copy()
        bench.torch_save()
        bench.normal_steps()
        print(f"warm-up: first hpctrain save (allocates its buffers) blocked {first_blocking:.3f} s, "
              f"write {first_write:.3f} s (not counted)", flush=True)

        rows: list[dict[str, float]] = []
        normal_all: list[float] = []
        during_all: list[float] = []
        for round_ in range(args.rounds):
            row: dict[str, float] = {}
            row["torch_save_s"] = bench.torch_save()
            row["copy_s"] = bench.copy()
            row["hpctrain_blocking_s"], row["write_s"] = bench.save_and_wait()
            normal = bench.normal_steps()
            row["busy_blocking_s"], during, row["write_busy_s"] = bench.steps_during_write()
            row["normal_step_s"], row["during_write_step_s"] = median(normal), median(during)
            row["steps_during"] = len(during)
            normal_all += normal
            during_all += during
            rows.append(row)
            print(f"round {round_}: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in row.items()), flush=True)

        show_files(bench.checkpointer.folder)
        size = bench.state_bytes
        file_bytes = max(p.stat().st_size for p in bench.checkpointer.folder.glob("*.pt"))

    def col(key: str) -> list[float]:
        return [r[key] for r in rows]

    torch_save_s, copy_s = median(col("torch_save_s")), median(col("copy_s"))
    blocking_s = median(col("hpctrain_blocking_s") + col("busy_blocking_s"))
    write_s, write_busy_s = median(col("write_s")), median(col("write_busy_s"))
    normal_s, during_s = median(normal_all), median(during_all)
    blocking_ratio = blocking_s / copy_s
    step_ratio = during_s / normal_s
    print()
    print(f"medians over {args.rounds} rounds, state {size / GB:.3f} GB, checkpoint file {file_bytes / GB:.3f} GB")
    print(f"  {'torch.save (blocking)':34s} {torch_save_s:8.3f} s  {size / GB / torch_save_s:6.2f} GB/s")
    print(f"  {'plain copy into buffers (floor)':34s} {copy_s:8.3f} s  {size / GB / copy_s:6.2f} GB/s")
    print(f"  {'hpctrain save, blocking':34s} {blocking_s:8.3f} s  {size / GB / blocking_s:6.2f} GB/s"
          f"  (steady state, {2 * args.rounds} saves)")
    print(f"  {'hpctrain background write, idle':34s} {write_s:8.3f} s  {file_bytes / GB / write_s:6.2f} GB/s")
    print(f"  {'hpctrain background write, training':34s} {write_busy_s:8.3f} s  "
          f"{file_bytes / GB / write_busy_s:6.2f} GB/s")
    print(f"  {'training step, no write':34s} {normal_s * 1000:8.1f} ms  ({len(normal_all)} steps)")
    print(f"  {'training step, during a write':34s} {during_s * 1000:8.1f} ms  ({len(during_all)} steps)")
    print("ratios:")
    print(f"  hpctrain blocking / plain copy     = {blocking_ratio:6.2f}  (target <= {BLOCKING_TARGET}) "
          f"{verdict(blocking_ratio, BLOCKING_TARGET)}")
    print(f"  torch.save / hpctrain blocking     = {torch_save_s / blocking_s:6.2f}  (speed-up)")
    print(f"  during-write step / normal step    = {step_ratio:6.2f}  (target <= {STEP_TARGET}) "
          f"{verdict(step_ratio, STEP_TARGET)}")
    paired = [r["during_write_step_s"] / r["normal_step_s"] for r in rows]
    print(f"  per-round step ratios: {[round(x, 3) for x in paired]}; "
          f"per-round blocking ratios: {[round(r['hpctrain_blocking_s'] / r['copy_s'], 3) for r in rows]}")
    print(f"total run time {time.perf_counter() - run_started:.0f} s")
    sys.exit(0)


if __name__ == "__main__":
    main()
