#!/usr/bin/env python
"""What recording collectives costs (trainer.collective_records: torch's Flight Recorder), per
collective and per training step.

Two processes in a gloo group train a small model with DDP (the ConvNet's gradients: one bucket
a step) for `--steps` steps, with the recorder on and off, in rotated rounds (this machine is
noisy): the recorder's ring is read when each process group forms, so every round starts its
processes afresh. Printed: each case's seconds per step (median and p90 over rounds), and the
ratio on / off of the medians (target <= 1.01: the overhead within noise).

    python scripts/bench_collective_records.py [--rounds 6] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_RUN = """
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from hpctrain.models.convnet import ConvNet
rank, port, steps, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=2)
torch.manual_seed(0)
model = DistributedDataParallel(ConvNet())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs, target = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
def step():
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), target).backward()
    optimizer.step()
for _ in range(20):
    step()
dist.barrier()
began = time.perf_counter()
for _ in range(steps):
    step()
dist.barrier()
took = time.perf_counter() - began
if rank == 0:
    open(out, "w").write(str(took / steps))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(recorded: bool, steps: int, folder: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    if recorded:
        env["TORCH_FR_BUFFER_SIZE"] = "64"  # trainer.collective_records' default
    out, port = folder / "took.txt", str(free_port())
    ranks = [
        subprocess.Popen([sys.executable, "-c", ONE_RUN, str(rank), port, str(steps), str(out)], env=env)
        for rank in (0, 1)
    ]
    for proc in ranks:
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"a rank failed (exit {proc.returncode})")
    return float(out.read_text())


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-fr-") as tmp:
        for round_ in range(args.rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)  # rotated: drift hits both
            for recorded in order:
                times[recorded].append(one_run(recorded, args.steps, Path(tmp)))
            print(f"round {round_}: on {times[True][-1] * 1e3:.3f} ms/step, off {times[False][-1] * 1e3:.3f}")
    on, off = statistics.median(times[True]), statistics.median(times[False])
    paired = [a / b for a, b in zip(times[True], times[False])]
    print(f"recorder on:  median {on * 1e3:.3f} ms/step, p90 {p90(times[True]) * 1e3:.3f}")
    print(f"recorder off: median {off * 1e3:.3f} ms/step, p90 {p90(times[False]) * 1e3:.3f}")
    print(f"ratio on / off = {on / off:.3f} (paired median {statistics.median(paired):.3f}; target <= 1.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
