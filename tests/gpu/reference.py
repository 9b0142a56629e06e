"""Reference attention for the GPU tests: plain torch, one sequence at a time.

Semantics follow FlashAttention (and upstream's ``attention_ref`` in hopper/test_util.py):

* scores = (q @ k^T) * softmax_scale, then softcap: ``softcap * tanh(scores / softcap)``
  (before masking);
* GQA/MQA: q head ``h`` reads k/v head ``h // (num_heads // num_heads_k)``;
* the causal mask is aligned bottom-right: query ``i`` of a sequence with ``sq`` queries and
  ``sk`` keys sees keys ``j <= i + sk - sq``; a sliding window ``(left, right)`` is relative to
  that same diagonal (``i + sk - sq - left <= j <= i + sk - sq + right``, -1 = unbounded on
  that side); ``causal`` means ``right = 0``;
* a row that sees no key gives output 0 and LSE -inf;
* LSE is the natural-log logsumexp of the (capped, masked) scaled scores, laid out as the
  varlen kernels return it: ``(num_heads, total_q)``;
* ``qv`` (FA3's ``q_v``, the MLA decode call: Q/K head 64, V head 512): a second query of
  V's head size, whose product with V adds to the scores before scaling, i.e. the scores
  of the concatenated query ``[q, qv]`` against the keys ``[k, v]`` (upstream's
  ``attention_ref`` in hopper/test_util.py: ``scores += (qv * softmax_scale) @ v^T``).

Inputs are the values the kernel should see, already in float32 (FP8 tests pass the
dequantised values ``fp8.float() * descale``). The arithmetic runs in float64 so no TF32 or
reduction-order setting of the process can leak into the reference; results come back
as float32.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch


def local_mask(sq: int, sk: int, causal: bool, window: Tuple[int, int], device) -> Optional[torch.Tensor]:
    """Boolean (sq, sk) mask, True where a key is hidden; None when nothing is hidden."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    diag = i + (sk - sq)
    masked = torch.zeros(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        masked |= j > diag + right
    if left >= 0:
        masked |= j < diag - left
    return masked


def attention_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
                  causal: bool = False, window: Tuple[int, int] = (-1, -1),
                  softcap: float = 0.0, qv: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q (sq, H, D), k (sk, Hk, D), v (sk, Hk, Dv), qv (sq, H, Dv) or None
    -> out (sq, H, Dv), lse (H, sq)."""
    sq, num_heads, _ = q.shape
    sk, num_heads_k, _ = k.shape
    assert num_heads % num_heads_k == 0, (num_heads, num_heads_k)
    group = num_heads // num_heads_k
    q64 = q.double()
    k64 = k.double().repeat_interleave(group, dim=1)  # head h -> kv head h // group
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q64, k64)
    if qv is not None:
        scores = scores + torch.einsum("qhd,khd->hqk", qv.double(), v64)
    scores = scores * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    mask = local_mask(sq, sk, causal, window, q.device)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (H, sq); -inf where a row sees no key
    probs = torch.exp(scores - lse.unsqueeze(-1))
    probs = torch.nan_to_num(probs, nan=0.0)  # rows without keys: (-inf) - (-inf)
    out = torch.einsum("hqk,khd->qhd", probs, v64)
    return out.float(), lse.float()


def attention_ref(q_seqs: Sequence[torch.Tensor], k_seqs: Sequence[torch.Tensor],
                  v_seqs: Sequence[torch.Tensor], *, softmax_scale: Optional[float] = None,
                  causal: bool = False, window: Optional[Tuple[int, int]] = None,
                  softcap: float = 0.0, qv_seqs: Optional[Sequence[torch.Tensor]] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """A batch given per sequence -> (out (total_q, H, Dv), lse (H, total_q)), float32.
    The default scale is Q's head size ** -0.5, as the package's default (with ``qv_seqs``
    pass the scale the caller passes: vLLM's MLA passes its own)."""
    window = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    head_size = q_seqs[0].shape[-1]
    scale = head_size ** -0.5 if softmax_scale is None else softmax_scale
    outs, lses = [], []
    qv_seqs = [None] * len(q_seqs) if qv_seqs is None else qv_seqs
    for q, k, v, qv in zip(q_seqs, k_seqs, v_seqs, qv_seqs, strict=True):
        out, lse = attention_one(q, k, v, softmax_scale=scale, causal=causal, window=window,
                                 softcap=softcap, qv=qv)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| over all elements, in float64."""
    a = actual.double()
    e = expected.double()
    denom = torch.linalg.vector_norm(e).item()
    num = torch.linalg.vector_norm(a - e).item()
    return num / denom if denom > 0 else (0.0 if num == 0 else math.inf)
