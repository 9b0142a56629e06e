"""Small, valid flash_attn_varlen_func calls on CPU tensors, for tests to break."""

from __future__ import annotations

import torch


def _t(values):
    return torch.tensor(values, dtype=torch.int32)


def varlen_call(dtype=torch.bfloat16, heads=8, kv_heads=2, d=128, dv=None):
    """Packed K/V: two sequences, q lengths 2 and 4, k lengths 5 and 7."""
    dv = d if dv is None else dv
    return dict(
        q=torch.randn(6, heads, d).to(dtype),
        k=torch.randn(12, kv_heads, d).to(dtype),
        v=torch.randn(12, kv_heads, dv).to(dtype),
        max_seqlen_q=4, cu_seqlens_q=_t([0, 2, 6]), max_seqlen_k=7, cu_seqlens_k=_t([0, 5, 12]),
    )


def paged_call(dtype=torch.bfloat16, heads=8, kv_heads=2, d=128, dv=None, block_size=16, num_blocks=10):
    """Paged cache: two sequences using 5 and 20 KV entries, 4 blocks per row of block_table."""
    dv = d if dv is None else dv
    return dict(
        q=torch.randn(6, heads, d).to(dtype),
        k=torch.randn(num_blocks, block_size, kv_heads, d).to(dtype),
        v=torch.randn(num_blocks, block_size, kv_heads, dv).to(dtype),
        max_seqlen_q=4, cu_seqlens_q=_t([0, 2, 6]), max_seqlen_k=20, seqused_k=_t([5, 20]),
        block_table=_t([[0, 1, 2, 3], [4, 5, 6, 7]]),
    )


def descales(batch=2, kv_heads=2, scale=0.5):
    one = torch.tensor([[scale]], dtype=torch.float32)
    return {name: one.expand(batch, kv_heads) for name in ("q_descale", "k_descale", "v_descale")}
