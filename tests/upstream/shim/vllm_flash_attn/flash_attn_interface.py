"""``vllm_flash_attn.flash_attn_interface`` for upstream's test file: this package's
functions, counted (the runner reports tests that passed without calling any), and
``flash_attn_with_kvcache``.

``flash_attn_with_kvcache`` is imported by upstream's test file but is not defined by
upstream's interface at the pinned commit (upstream removed it in "Remove bindings for
flash_attn_with_kvcache (#107)", leaving the test file, copied from vLLM, importing it: at
the pin the file fails at import against upstream itself). This adapter provides it with
the contract upstream's wrapper had before that removal - batched q
``(batch, seqlen_q, num_heads, head_size)``, a paged cache ``(num_blocks, page_size,
num_heads_k, head_size)`` with ``block_table`` or a batched cache
``(batch_cache, seqlen_cache, num_heads_k, head_size)``, ``cache_seqlens`` (int or int32
``(batch,)``), out ``(batch, seqlen_q, num_heads, head_size)``, LSE
``(batch, num_heads, seqlen_q)`` - implemented over this package's
``flash_attn_varlen_func``: q packed as ``seqlen_q`` tokens per sequence, ``cache_seqlens``
as ``seqused_k``, a batched cache as a paged one with one page per sequence.

Differences from that wrapper, all deliberate: ``fa_version`` defaults to None (the
selector) and is honoured (the last upstream version ran FA2 whatever it said); appending
new keys (``k``/``v``), rotary embeddings and ``cache_leftpad`` are refused (this wheel, like
upstream at the pin, has no append-KV kernels); ``max_seqlen_k`` is read from
``cache_seqlens`` (one device sync: a test adapter, not a serving path).
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import torch

import vendored_flash_attn as _vfa
from vendored_flash_attn.call.arguments import VARLEN

_calls = 0


def api_calls() -> int:
    """Calls of the attention functions since the last reset_api_calls()."""
    return _calls


def reset_api_calls() -> None:
    global _calls
    _calls = 0


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _calls
        _calls += 1
        return fn(*args, **kwargs)

    return wrapper


flash_attn_varlen_func = _counted(_vfa.flash_attn_varlen_func)
get_scheduler_metadata = _counted(_vfa.get_scheduler_metadata)
sparse_attn_func = _counted(_vfa.sparse_attn_func)
sparse_attn_varlen_func = _counted(_vfa.sparse_attn_varlen_func)
is_fa_version_supported = _vfa.is_fa_version_supported
fa_version_unsupported_reason = _vfa.fa_version_unsupported_reason


# What flash_attn_with_kvcache below sets itself when it calls flash_attn_varlen_func; every other
# parameter of the declaration it passes through as given.
_SET_HERE = {"q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k", "seqused_k", "block_table",
             "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "num_splits",
             "return_softmax_lse", "out"}
_PASSED = set(VARLEN.names) - _SET_HERE


@_counted
def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    out=None,
    **passed,
):
    """``passed``: the keyword-only arguments of upstream's wrapper that go to
    ``flash_attn_varlen_func`` as they are (scheduler_metadata, the descales, fa_version,
    s_aux, context parallelism): any parameter of its declaration (vendored_flash_attn.call.arguments)
    that this function does not set itself, so a parameter upstream adds there reaches it."""
    unknown = set(passed) - _PASSED
    if unknown:
        raise TypeError(f"flash_attn_with_kvcache() got unexpected keyword arguments {sorted(unknown)}")
    del rotary_interleaved  # only meaningful with rotary embeddings, refused below
    for name, value in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_leftpad", cache_leftpad)):
        if value is not None:
            raise NotImplementedError(
                f"flash_attn_with_kvcache (test adapter): {name} is not supported; this wheel, "
                "like upstream at the pin, has no append-KV / rotary kernels")
    if cache_seqlens is None:
        raise ValueError("flash_attn_with_kvcache (test adapter): cache_seqlens is required")
    batch, seqlen_q, num_heads, head_size = q.shape
    device = q.device
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    if block_table is None:
        # A batched cache is a paged one with one page (the whole row) per sequence.
        rows = (cache_batch_idx if cache_batch_idx is not None
                else torch.arange(batch, device=device))
        block_table = rows.to(torch.int32).view(batch, 1)
    elif cache_batch_idx is not None:
        raise NotImplementedError("flash_attn_with_kvcache (test adapter): cache_batch_idx with "
                                  "block_table is not supported")
    cu_seqlens_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32,
                                device=device)
    packed_out = None
    if out is not None:
        packed_out = out.view(batch * seqlen_q, num_heads, out.shape[-1])
    result = _vfa.flash_attn_varlen_func(
        q.reshape(batch * seqlen_q, num_heads, head_size), k_cache, v_cache,
        max_seqlen_q=seqlen_q, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_k=int(cache_seqlens.max()), seqused_k=cache_seqlens,
        block_table=block_table, softmax_scale=softmax_scale, causal=causal,
        window_size=list(window_size), softcap=softcap, alibi_slopes=alibi_slopes,
        num_splits=num_splits, return_softmax_lse=return_softmax_lse, out=packed_out, **passed)
    packed, lse = result if return_softmax_lse else (result, None)
    attn = packed.view(batch, seqlen_q, num_heads, packed.shape[-1])
    if not return_softmax_lse:
        return attn
    return attn, batched_lse(lse, batch, seqlen_q)


def batched_lse(lse: torch.Tensor, batch: int, seqlen_q: int) -> torch.Tensor:
    """The varlen LSE (num_heads, batch * seqlen_q) as (batch, num_heads, seqlen_q)."""
    return lse.view(lse.shape[0], batch, seqlen_q).permute(1, 0, 2)
