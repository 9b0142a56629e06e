"""FP8 (e4m3) helpers for FA3: descale tensors from checkpoint scales.

FA3 takes ``q_descale``/``k_descale``/``v_descale`` as float32 tensors of shape
``(num_seqs, num_kv_heads)`` with any strides, so a per-tensor scale is best passed as a
stride-0 expansion (no copy, and it stays valid when the batch size changes under a
CUDA graph, as long as the expansion is redone per batch).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .errors import FlashAttnInputError, FlashAttnTypeError

Scale = Union[float, torch.Tensor]


def _descale(name: str, scale: Scale, num_seqs: int, num_kv_heads: int, device) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float32, device=device)
    if scale.dtype != torch.float32:
        raise FlashAttnTypeError(f"{name} must be float32, got {scale.dtype}")
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(num_seqs, num_kv_heads)
    if tuple(scale.shape) in ((num_kv_heads,), (1, num_kv_heads)):
        return scale.reshape(1, num_kv_heads).expand(num_seqs, num_kv_heads)
    if tuple(scale.shape) == (num_seqs, num_kv_heads):
        return scale
    raise FlashAttnInputError(
        f"{name} must be a scalar, per-KV-head ({num_kv_heads},) or ({num_seqs}, {num_kv_heads}), "
        f"got shape {tuple(scale.shape)}")


def make_fp8_descales(
    q_scale: Optional[Scale],
    k_scale: Scale,
    v_scale: Scale,
    num_seqs: int,
    num_kv_heads: int,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_descale, k_descale, v_descale) for ``flash_attn_varlen_func`` on FP8 inputs.

    Each scale is the factor that turns the stored e4m3 values back into real values
    (what checkpoints call ``k_scale``/``v_scale``): a Python float, a 0-d/1-element
    float32 tensor, a per-KV-head tensor ``(num_kv_heads,)``, or already
    ``(num_seqs, num_kv_heads)``. Scalars and per-head scales come back as stride-0
    expansions, not copies. A checkpoint without a q scale (``q_scale=None``) reuses the
    k scale, which is how such checkpoints quantise the query.
    """
    if num_seqs < 1 or num_kv_heads < 1:
        raise FlashAttnInputError(
            f"num_seqs and num_kv_heads must be >= 1, got {num_seqs} and {num_kv_heads}")
    if device is None:
        device = next((s.device for s in (q_scale, k_scale, v_scale)
                       if isinstance(s, torch.Tensor)), "cuda")
    k_descale = _descale("k_scale", k_scale, num_seqs, num_kv_heads, device)
    v_descale = _descale("v_scale", v_scale, num_seqs, num_kv_heads, device)
    q_descale = (k_descale if q_scale is None
                 else _descale("q_scale", q_scale, num_seqs, num_kv_heads, device))
    return q_descale, k_descale, v_descale
