"""A small GPT-2 style causal language model (in the spirit of nanoGPT).

Token + learned position embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention,
then a 4x GELU MLP, each added to the residual stream), a final LayerNorm and an output head
tied to the token embedding. Attention goes through `F.scaled_dot_product_attention`, which picks
a fused (flash / memory-efficient) kernel when one is available.

Nothing is hard-coded to a size: GPT-2 small (12 layers, 768 wide, vocab 50257) is ~124M
parameters and GPT-2 medium (24 layers, 1024 wide) ~350M with the same code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.models.checks import check_int, check_prob


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        # [B, T, C] -> [B, heads, T, head_dim]
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Causal transformer LM. `forward(idx [B, T] int64) -> logits [B, T, vocab_size]`."""

    def __init__(
        self,
        vocab_size: int = 512,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, 1)
        check_int("block_size", block_size, 1)
        check_int("n_layer", n_layer, 1)
        check_int("n_head", n_head, 1)
        check_int("n_embd", n_embd, 1)
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd (got {n_embd}) must be divisible by n_head (got {n_head})")
        check_prob("dropout", dropout)
        if not isinstance(bias, bool):
            # ValueError like every other bad config value, so callers need catch only one type.
            raise ValueError(f"bias (got {bias!r}) must be true or false")  # noqa: TRY004

        self.vocab_size = vocab_size
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        # Weight tying (as in GPT-2): the input and output token embeddings are one matrix,
        # which saves vocab_size * n_embd parameters (38M at GPT-2 small) and trains better.
        self.lm_head.weight = self.wte.weight

        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2*n_layer):
        # each block adds two such terms, and this keeps the residual's variance from growing
        # with depth.
        resid_std = 0.02 / math.sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=resid_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Total parameter count; the tied embedding/head matrix is counted once."""
        # parameters() already de-duplicates shared tensors.
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError(f"GPT expects token ids [B, T], got shape {list(idx.shape)}")
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length (got {t}) must be <= block_size ({self.block_size})")
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
