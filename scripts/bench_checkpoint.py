#!/usr/bin/env python
"""How long training waits for a checkpoint, and how much the background write slows it down.

One process, no process group (DistContext.single()). The state is a GPT's model + AdamW state
(two moments, after one real optimizer step) sized to --size-gb, saved the way the Trainer's
`_save` builds it (model / optimizer / scheduler / scaler / train). Measured in rounds (this
machine is noisy); within a round the three blocking measurements (torch.save, the plain copy,
hpctrain's save) run in rotated order, and before each of them and before every series of steps
the machine settles: os.sync() writes back the dirty pages of the last large write, then a pause
of --settle-s, so that nothing is timed right after (or during the writeback of) a large write.
Medians are reported, and p90 for the steps:

    torch_save_s         blocking time of torch.save(state, path) into the same temporary folder
                         (the naive baseline; the file is deleted right after, so its dirty pages
                         are dropped and never compete with the next write)
    copy_s               a plain copy of every distinct tensor into buffers allocated (and touched)
                         before timing: the floor for any snapshot
    hpctrain_blocking_s  PlainCheckpointer.save(step, state, "periodic", background=True) until it
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
    pinned_*_step_s      normal and during-write steps again with the whole process (training and
                         writer thread) pinned to one core (sched_setaffinity, as `taskset -c`):
                         the writer competes for the training's core, as on a node with no core
                         to spare. At most --steps steps during that write: at the lowest
                         priority on a busy core it crawls, and then finishes without training
    forced_s             a forced save (PlainCheckpointer.forced_save, deadline 30 s, reason preempt)
                         issued 0.5 s into a background write: the time from the signal's step to
                         every byte on disk, and what it chose (waited / abandoned_inflight ...).
                         Target: inside a 30 s GraceTime
    spare_core_step_s    the same step while another process spins on a CPU: a machine check.
                         On a machine with a core to spare it equals normal_step_s; when it does
                         not (a small VM, other jobs), no writer thread can meet the step target
                         and the step ratio says more about the machine than about the writer.
                         The load average is printed for the same reason.

Ratios, with PASS/FAIL against the targets:
    hpctrain_blocking / copy            target <= 1.5
    torch_save / hpctrain_blocking      the speed-up over the naive baseline
    during_write_step / normal_step     target <= 1.2 (median; p90 / p90 printed beside it)
    pinned during / pinned normal       the same with the writer on the training's core
    forced_s                            target <= 30 s

All tensor work runs with torch.set_num_threads(--threads) (default 1): on a 2-core machine that
leaves the writer thread a core of its own, as a training process with one thread per core would
have to. Sizes are decimal GB (1e9 bytes). The temporary folder is removed at the end.

The default size is the issue's 2.4 GB (a 202M-parameter GPT, 12 x 1024, vocabulary 48828). It
fits: the run keeps three copies of the state (live state, the Snapshotter's buffers, the copy
floor's buffers) and peaks at ~7.7 GB resident, and writes ~2.5 GB six times per round. On a
2-CPU machine it took about a minute (62 s, before the settling pauses and the pinned and forced
measurements were added); --size-gb 0.3 --rounds 2 --steps 10 took 235 s on a loaded one.

The state tree holds the GPT's tied embedding/head weight twice (state_dict lists it under both
names). It is one tensor: the floor and the reported state size count it once, and so does the
Snapshotter (it copies a tensor seen under another name once), so the checkpoint file is the
state's size; "aliases counted again" is what a naive per-name copy would move.

    python scripts/bench_checkpoint.py [--size-gb 2.4] [--rounds 3] [--steps 20] [--step-ms 75] [--settle-s 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpctrain.checkpoint import PlainCheckpointer, snapshot, store
from hpctrain.dist.context import DistContext
from hpctrain.models.gpt import GPT
from hpctrain.run.causes import CheckpointReason, StopReason
from hpctrain.run.events import Checkpoint, ForcedSave

GB = 1e9
BLOCKING_TARGET = 1.5  # hpctrain blocking / plain copy
STEP_TARGET = 1.2  # step during a background write / normal step
FORCED_DEADLINE_S = 30.0  # the GraceTime a forced save must fit in


@dataclass
class TrainState:  # the same fields as the Trainer's, so the pickled part is the same size
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


# ---- the state ---------------------------------------------------------------------------------


def gpt_shape(size_gb: float, n_embd: int, vocab: int, block_size: int) -> dict[str, int]:
    """A GPT whose parameters plus two AdamW moments (3 x 4 bytes per parameter) come to ~size_gb."""
    params = size_gb * GB / 12
    # Narrow the model until four blocks fit, then the embeddings to at most a quarter of it.
    while n_embd > 64 and 4 * 12 * n_embd * n_embd > params:
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
    model = GPT(**shape)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    one_step(model, optimizer, batch=1, seq=8)  # creates AdamW's exp_avg / exp_avg_sq
    return model, optimizer


def trainer_state(model: GPT, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    """What a Trainer's plain checkpoint holds (no scheduler, no fp16 scaler on CPU): the
    PlainCheckpointer adds the model's and the optimizer's state to what the Trainer hands it."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": None,
        "scaler": None,
        "train": asdict(TrainState(step=step)),
    }


def distinct_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in the tree once, detached (what torch.save writes)."""
    return [t.detach() for t in snapshot.distinct_tensors(tree)]


def all_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor leaf, aliases included: what a per-path snapshot copies."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for node in tree for t in all_tensors(node)]
    return []


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def writer_running() -> bool:
    """The checkpoint writer is the only thread besides this one (a failed write ends it without
    calling on_written)."""
    return any(t is not threading.main_thread() and t.is_alive() for t in threading.enumerate())


# ---- the measurements --------------------------------------------------------------------------


class Written:
    """on_written callback: keeps the records and signals the end of each write."""

    def __init__(self) -> None:
        self.records: list[Checkpoint] = []
        self.done = threading.Event()

    def __call__(self, record: Checkpoint) -> None:
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
        state = trainer_state(self.model, self.optimizer, 0)
        self.tensors = distinct_tensors(state)
        self.state_bytes = nbytes(self.tensors)
        self.leaf_bytes = nbytes(all_tensors(state))  # > state_bytes when tensors are shared (tied weights)
        self.floor = [torch.empty_like(t) for t in self.tensors]
        self.written = Written()
        self.forced: list[ForcedSave] = []
        self.checkpointer = PlainCheckpointer(
            folder / "checkpoints",
            DistContext.single(),
            keep=2,
            fingerprint="bench",
            on_written=self.written,
            on_forced=self.forced.append,
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
        self.checkpointer.save(self.ckpt_step, state, CheckpointReason.PERIODIC, background=True)
        return time.perf_counter() - started

    def save_and_wait(self) -> tuple[float, float]:
        blocking = self.save()
        self.checkpointer.wait()  # re-raises a failed write
        return blocking, self.written.records[-1].write_s or 0.0

    def forced_with_inflight(self) -> float:
        """A forced save 0.5 s into a background write, as a preemption would issue it."""
        self.save()
        time.sleep(0.5)
        self.ckpt_step += 1
        started = time.perf_counter()
        state = trainer_state(self.model, self.optimizer, self.ckpt_step)
        self.checkpointer.forced_save(self.ckpt_step, state, StopReason.PREEMPT, deadline_s=FORCED_DEADLINE_S)
        return time.perf_counter() - started

    def settle(self) -> None:
        """Nothing timed right after a large write: its dirty pages written back, then a pause."""
        os.sync()
        time.sleep(self.args.settle_s)

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

    def steps_beside_spinner(self) -> list[float]:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)  # let it start
            return self.normal_steps()
        finally:
            spinner.kill()
            spinner.wait()

    def steps_during_write(self, max_steps: int | None = None) -> tuple[float, list[float], float]:
        """A background save, then steps until its write is done (or `max_steps` were taken).
        Only steps that ended before the write did count (the last one straddles the end)."""
        blocking = self.save()
        times: list[float] = []
        while not self.written.done.is_set() and writer_running() and len(times) < (max_steps or math.inf):
            elapsed = self.step()
            if not self.written.done.is_set():
                times.append(elapsed)
        self.checkpointer.wait()  # re-raises a failed write (which never sets `done`)
        return blocking, times, self.written.records[-1].write_s or 0.0


# ---- the report --------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


@contextlib.contextmanager
def one_core() -> Iterator[int]:
    """The calling thread (and threads it starts, such as the writer) on one CPU, as `taskset -c`."""
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, before)


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "FAIL"


def show_files(folder: Path) -> int:
    """Print the checkpoint files and verify the newest against its sha256 marker; its size."""
    print(f"checkpoint files left by the last saves (keep=2) in {folder.name}/:")
    for path in sorted(folder.iterdir()):
        size = path.stat().st_size
        print(f"  {path.name:24s} " + (f"{size / GB:8.3f} GB" if path.suffix == ".pt" else f"{size:8d} bytes"))
    newest = store.entries(folder)[0]
    started = time.perf_counter()
    meta = store.verify(newest)
    print(
        f"  {newest.meta.name}: step {meta['step']}, size {meta['size']} bytes, sha256 {meta['sha256'][:16]}..., "
        f"reason {meta['reason']}, blocking_s {meta['blocking_s']}; re-hashed and verified in "
        f"{time.perf_counter() - started:.2f} s"
    )
    return int(meta["size"])


def measure(bench: Bench, rounds: int) -> tuple[list[dict[str, float]], dict[str, list[float]]]:
    step_s = bench.calibrate_step()
    print(f"timed step: GPT 4 x 256, batch {bench.step_batch} x 128 tokens, ~{step_s * 1000:.0f} ms", flush=True)
    # Warm-up (not counted): the first save allocates the Snapshotter's buffers, the first copy
    # faults in the floor's pages.
    first_blocking, first_write = bench.save_and_wait()
    bench.copy()
    bench.normal_steps()
    print(
        f"warm-up: first hpctrain save (allocates its buffers) blocked {first_blocking:.3f} s, "
        f"write {first_write:.3f} s (not counted)",
        flush=True,
    )
    rows: list[dict[str, float]] = []
    steps: dict[str, list[float]] = {key: [] for key in ("normal", "during", "pinned_normal", "pinned_during", "spare")}
    blocking: dict[str, Callable[[], float | tuple[float, float]]] = {
        "torch_save_s": bench.torch_save,
        "copy_s": bench.copy,
        "hpctrain_blocking_s": bench.save_and_wait,
    }
    names = list(blocking)
    for round_ in range(rounds):
        row: dict[str, float] = {}
        for name in names[round_ % 3 :] + names[: round_ % 3]:  # rotated: none always first or last
            bench.settle()
            result = blocking[name]()
            if isinstance(result, tuple):
                row[name], row["write_s"] = result
            else:
                row[name] = result
        bench.settle()
        normal = bench.normal_steps()
        row["after_steps_blocking_s"], during, row["write_busy_s"] = bench.steps_during_write()
        bench.settle()
        with one_core():
            pinned_normal = bench.normal_steps()
            # The writer at the lowest priority on a busy core crawls: --steps steps, then the
            # write finishes on its own (its time is not a throughput figure).
            _, pinned_during, row["write_pinned_s"] = bench.steps_during_write(bench.args.steps)
        bench.settle()
        spare = bench.steps_beside_spinner()
        bench.settle()
        row["forced_s"] = bench.forced_with_inflight()
        series = {
            "normal": normal,
            "during": during,
            "pinned_normal": pinned_normal,
            "pinned_during": pinned_during,
            "spare": spare,
        }
        for key, values in series.items():
            row[f"{key}_step_s"] = median(values)
            steps[key] += values
        row["steps_during"] = len(during)
        rows.append(row)
        print(
            f"round {round_}: "
            + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
            + f" forced_save={bench.forced[-1].forced_save}",
            flush=True,
        )
    return rows, steps


def report(
    rows: list[dict[str, float]], steps: dict[str, list[float]], bench: Bench, file_bytes: int, start_load: float
) -> None:
    def col(key: str) -> float:
        return median([r[key] for r in rows])

    size = bench.state_bytes / GB
    torch_save_s, copy_s, blocking_s = col("torch_save_s"), col("copy_s"), col("hpctrain_blocking_s")
    after_steps_s, write_s, write_busy_s = col("after_steps_blocking_s"), col("write_s"), col("write_busy_s")
    normal_s, during_s, spare_s = median(steps["normal"]), median(steps["during"]), median(steps["spare"])
    blocking_ratio, step_ratio, spare_ratio = blocking_s / copy_s, during_s / normal_s, spare_s / normal_s
    pinned_ratio = median(steps["pinned_during"]) / median(steps["pinned_normal"])
    forced_s = col("forced_s")
    print()
    print(
        f"medians over {len(rows)} rounds; state {size:.3f} GB (distinct tensors; the state tree's leaves, "
        f"aliases counted again, {bench.leaf_bytes / GB:.3f} GB); checkpoint file {file_bytes / GB:.3f} GB"
    )
    lines = [
        ("torch.save (blocking)", torch_save_s, size, ""),
        ("plain copy into buffers (floor)", copy_s, size, ""),
        ("hpctrain save, blocking", blocking_s, size, "steady state: buffers reused"),
        ("hpctrain save after steps, blocking", after_steps_s, size, "the saves the during-write steps follow"),
        ("hpctrain background write, idle", write_s, file_bytes / GB, "write throughput"),
        ("hpctrain background write, training", write_busy_s, file_bytes / GB, "write throughput"),
    ]
    for label, seconds, gb, note in lines:
        print(f"  {label:36s} {seconds:8.3f} s   {gb / seconds:6.2f} GB/s  {note}")
    print(f"  {'training step':36s} {'median':>8s}  {'p90':>8s}")
    for label, key in (
        ("no write", "normal"),
        ("during a write", "during"),
        ("one core, no write", "pinned_normal"),
        ("one core, during a write", "pinned_during"),
        ("another CPU busy (machine check)", "spare"),
    ):
        values = steps[key]
        print(f"  {label:36s} {median(values) * 1000:6.1f} ms {p90(values) * 1000:6.1f} ms  ({len(values)} steps)")
    choices = sorted({record.forced_save for record in bench.forced})
    print(
        f"  {'forced save, a write under way':36s} {forced_s:8.3f} s   (max {max(r['forced_s'] for r in rows):.3f} s;"
        f" chose {', '.join(choices)})"
    )
    print("ratios:")
    print(
        f"  hpctrain blocking / plain copy     = {blocking_ratio:6.2f}  (target <= {BLOCKING_TARGET})  "
        f"{verdict(blocking_ratio, BLOCKING_TARGET)}"
    )
    print(f"  torch.save / hpctrain blocking     = {torch_save_s / blocking_s:6.2f}  (speed-up)")
    print(
        f"  during-write step / normal step    = {step_ratio:6.2f}  (target <= {STEP_TARGET})  "
        f"{verdict(step_ratio, STEP_TARGET)}; p90/p90 {p90(steps['during']) / p90(steps['normal']):.2f}"
    )
    print(
        f"  the same, writer on the training's core = {pinned_ratio:6.2f}; p90/p90 "
        f"{p90(steps['pinned_during']) / p90(steps['pinned_normal']):.2f}"
    )
    print(
        f"  forced save with a write under way = {forced_s:6.2f} s (target <= {FORCED_DEADLINE_S:.0f} s)  "
        f"{verdict(forced_s, FORCED_DEADLINE_S)}"
    )
    print(
        f"  per round: blocking ratios {[round(r['hpctrain_blocking_s'] / r['copy_s'], 3) for r in rows]}, "
        f"step ratios {[round(r['during_step_s'] / r['normal_step_s'], 3) for r in rows]}"
    )
    print(
        f"  machine check: step beside a spinning process / normal step = {spare_ratio:.2f} "
        "(1.00 when a core is free for the writer)"
    )
    cpus = os.cpu_count() or 1
    if spare_ratio > STEP_TARGET or start_load > cpus / 2:
        print(
            f"  WARNING: no spare core here (load average {start_load:.2f} on {cpus} CPUs before this run, "
            f"a spinning process slows a step {spare_ratio:.2f}x): any concurrent writer slows training on "
            "this machine, so the step ratio measures the machine as much as the writer; rerun on a quiet node"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size-gb",
        type=float,
        default=2.4,
        help="model + AdamW state to save, in GB (default 2.4; 0.3 for a quick run)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, after a warm-up (default 3)")
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        help="training steps timed per round with no write, and beside the spinner (default 20)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=75.0,
        help="the timed step's batch is chosen so that one step takes about this long (default 75)",
    )
    parser.add_argument(
        "--settle-s", type=float, default=2.0, help="pause after os.sync() before each measurement (default 2)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for all tensor work (default 1)")
    parser.add_argument("--n-embd", type=int, default=1024, help="width of the saved GPT (narrowed for small sizes)")
    parser.add_argument(
        "--vocab",
        type=int,
        default=50257,
        help="vocabulary of the saved GPT (reduced so embeddings are <= 1/4 of the parameters)",
    )
    parser.add_argument("--block-size", type=int, default=1024, help="context length of the saved GPT")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the temporary folder goes (default: the system's temporary directory); "
        "put it on the file system checkpoints will be written to",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.size_gb <= 0 or args.settle_s < 0:
        parser.error("--rounds and --steps must be >= 1, --size-gb > 0 and --settle-s >= 0")
    torch.set_num_threads(args.threads)
    run_started = time.perf_counter()
    start_load = os.getloadavg()[0]  # before this run adds to it: other jobs on the machine
    print(f"machine: {os.cpu_count()} CPUs, load average {start_load:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-ckpt-", dir=args.dir) as tmp:
        bench = Bench(args, Path(tmp))
        print(
            f"state: GPT {json.dumps(bench.shape)}, {bench.model.num_params() / 1e6:.1f}M parameters + AdamW "
            f"(2 moments) = {bench.state_bytes / GB:.3f} GB in {len(bench.tensors)} tensors "
            f"(built in {bench.build_s:.1f} s); torch threads {torch.get_num_threads()}",
            flush=True,
        )
        rows, steps = measure(bench, args.rounds)
        file_bytes = show_files(bench.checkpointer.folder)
    report(rows, steps, bench, file_bytes, start_load)
    print(f"total run time {time.perf_counter() - run_started:.0f} s")


if __name__ == "__main__":
    main()
