"""Exactness under torch.compile with gradient accumulation: DDP's all-reduces counted in two
spawned gloo processes (only the last micro-batch communicates, compiled or not), then a real
compiled `hpctrain-train` run (one process) stopped by SIGTERM mid-epoch and resumed
bit-identically.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import assert_ok, run_train
from test_exact_resume import BASE, _ctx, _stop_resume_compare

from hpctrain.config import TrainerConfig
from hpctrain.models.mlp import MLP
from hpctrain.trainer import components

# One process of 16, the global batch of BASE's two of 8: DDP under compile is counted above in
# two real processes; here the compiled training, its stop and its resume. A compiled launch costs
# 5 s of CPU in one process against 8 in two, from a warm inductor cache (16 against 19 cold).
COMPILED = (
    *(o for o in BASE if not o.startswith(("trainer.nprocs=", "data.batch_size="))),
    "trainer.nprocs=1",
    "data.batch_size=16",
    "trainer.compile=true",
    "trainer.grad_accum=2",
)


# ---- no_sync under torch.compile (2 gloo processes) ---------------------------------------------


def _all_reduces_per_micro_batch(rank: int, store: str, out: str) -> None:
    """Eager then compiled, in one process group: four micro-batches each, the last synced."""
    ctx = _ctx(rank, 2, f"file://{store}")
    dist.init_process_group("gloo", init_method=ctx.init_method, rank=rank, world_size=2)
    records = {}
    for compile_model in (False, True):
        torch.manual_seed(0)
        model, ddp = components.wrap(MLP(hidden=(16,)), TrainerConfig(compile=compile_model), ctx)
        assert ddp is not None
        calls: list[int] = []

        # No annotations: DDP checks them against dist.GradBucket, and postponed ones are strings.
        def counting_all_reduce(state, bucket, calls=calls):  # type: ignore[no-untyped-def]
            calls.append(bucket.index())
            work = dist.all_reduce(bucket.buffer().div_(2), async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        ddp.register_comm_hook(None, counting_all_reduce)
        torch.manual_seed(100 + rank)  # every rank its own micro-batches
        record = []
        for micro in range(4):
            with components.grad_sync(ddp, last=micro == 3):
                model(torch.randn(8, 1, 8, 8)).square().mean().backward()
            grads = torch.cat([p.grad.flatten() for p in ddp.module.parameters()])
            everyone = [torch.empty_like(grads) for _ in range(2)]
            dist.all_gather(everyone, grads)
            record.append({"all_reduces": len(calls), "ranks_agree": torch.equal(everyone[0], everyone[1])})
        records[compile_model] = record
        # A DDP model still alive when its process group goes can abort the process at exit
        # ("terminate called without an active exception"): the trainer frees it first, and so here.
        del model, ddp, counting_all_reduce
        gc.collect()
    if rank == 0:
        torch.save(records, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_compiled_ddp_all_reduces_on_the_last_micro_batch_only(tmp_path: Path) -> None:
    out = tmp_path / "records.pt"
    mp.spawn(_all_reduces_per_micro_batch, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    results = torch.load(out, weights_only=True)
    for compiled, record in results.items():
        # Three micro-batches under no_sync: no communication, each rank's own gradients.
        assert [r["all_reduces"] for r in record[:3]] == [0, 0, 0], (compiled, record)
        assert not any(r["ranks_agree"] for r in record[:3]), (compiled, record)
        # The last: the buckets all-reduce once, and every rank holds the same gradients.
        assert record[3]["all_reduces"] >= 1 and record[3]["ranks_agree"], (compiled, record)
    assert results[True][3]["all_reduces"] == results[False][3]["all_reduces"]


# ---- a real compiled run: stopped mid-epoch by SIGTERM, resumed, bit-identical -------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted compiled run."""
    run_dir = tmp_path_factory.mktemp("reference") / "compiled"
    assert_ok(run_train(run_dir, COMPILED))
    return run_dir


@pytest.mark.slow
def test_compiled_run_with_grad_accum_resumes_bit_identically(reference: Path, tmp_path: Path) -> None:
    _stop_resume_compare(tmp_path / "run", COMPILED, reference, grad_accum=2)
