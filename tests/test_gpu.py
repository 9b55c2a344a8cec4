"""On a CUDA GPU (scripts/gpu_check.py runs these where one is lent): each rank bound to its own
device, and a bf16 step of the GPT that trains."""

from __future__ import annotations

import pytest
import torch

from hpctrain.dist.context import select_device
from hpctrain.models.gpt import GPT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)"),
]


def test_ranks_are_bound_to_their_own_gpu() -> None:
    count = torch.cuda.device_count()
    for local_rank in range(count):
        assert select_device(local_rank, count, count) == torch.device("cuda", local_rank)


def test_a_bf16_step_of_the_gpt_learns() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model = GPT(vocab_size=128, block_size=32, n_layer=2, n_head=2, n_embd=64).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(128, (8, 32), device=device)
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 128), x.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] and all(loss == loss for loss in losses)
