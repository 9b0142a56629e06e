"""FA4's adapter: vLLM's ``flash_attn_varlen_func`` call mapped onto upstream's CuTe DSL kernels.

FA4 is upstream's ``flash_attn/cute`` at the pin, shipped in the wheel as
``vendored_flash_attn._fa4.cute`` (imports rewritten at build time, cmake/fa4_precompile.py)
and run with the ``[fa4]`` extra installed. Nothing here is imported by
``import vendored_flash_attn``; ``load()`` runs at the first FA4 call: dependency check
(``fa4_deps.check``, no cutlass import), then the import (seconds: cutlass, torch, the
sources), then the two-level AOT kernel cache (fa4_cache).

The entry point is ``flash_attn_varlen_func`` with vLLM's signature (less ``fa_version``).
It calls upstream's ``_flash_attn_fwd`` — the function the pin's own
``vllm_flash_attn/flash_attn_interface.py`` probes for, and the only one that takes the
FP8 descales and ``fp8_kv_dequant`` — with every argument by name. What FA4 cannot do is
refused before any kernel with ``FA4Unsupported``, naming the family that can.

What FA4 does at the pin, read off ``flash_attn/cute/interface.py`` (617264c1):

* sm90: varlen, paged KV (``page_table`` + ``seqused_k``; TMA loads when the page size is
  the kernel's tile_n, else cp.async), causal, local window, softcap, sinks
  (``learnable_sink``, bf16, one per q head), split-KV, GQA packing, LSE; FP8 **KV** with a
  bf16/fp16 q (``fp8_kv_dequant``: paged only, page size == tile_n, head_dim == head_dim_v);
  no FP8 q (``assert arch // 10 == 10``).
* sm100/sm110: the same plus FP8 q/k/v with descales; no FP8-KV-only path.
* sm120: no paged KV, no split-KV, no FP8.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from . import fa4_cache, fa4_deps
from .debug_checks import debug_checks_enabled, run_debug_checks
from .environment import current_environment
from .errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError
from .families import registry
from .kernels import dtype_name, head_size_problem
from .validation import _is_local, check_varlen_call, window_tuple

SUBPACKAGE = "vendored_flash_attn._fa4.cute"
# FA4's family declaration (cmake/knobs.json): its dtypes, features and call rules, which
# the shared checks read, and the GPU generations (compute capability major) it runs on.
FAMILY = registry().by_name("fa4")
GENERATIONS = FAMILY.generations
_E4M3 = torch.float8_e4m3fn


class FA4Unsupported(FlashAttnInputError):
    """A call FA4 cannot run; the message names the family of this package that can."""


@dataclass(frozen=True)
class Loaded:
    interface: object
    cache_layout: dict


_loaded: Optional[Loaded] = None
_load_lock = threading.Lock()


def load() -> Loaded:
    """Import FA4 once per process: dependency check, sources, AOT cache."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _load_lock:
        if _loaded is None:
            fa4_deps.check()
            try:
                interface = importlib.import_module(f"{SUBPACKAGE}.interface")
            except ModuleNotFoundError as exc:
                if exc.name and (SUBPACKAGE.startswith(exc.name) or exc.name.startswith(SUBPACKAGE)):
                    raise FlashAttnUnavailableError(
                        "FA4 is not in this wheel (built with VFA_BUILD_FA4=off, or from a source tree "
                        f"without the staged {SUBPACKAGE}): rebuild with VFA_BUILD_FA4=on, or use FA3/FA2."
                    ) from exc
                raise
            cache_utils = importlib.import_module(f"{SUBPACKAGE}.cache_utils")
            import cutlass

            _loaded = Loaded(interface, fa4_cache.install(interface, cache_utils, cutlass))
    return _loaded


def _refuse(message: str):
    raise FA4Unsupported(message)


# (generation, head size, V head size, K/V dtype) that FA4's declared head sizes take: asked
# on every call, answered from here after the first (FAMILY, and so its rules, is fixed).
_HEAD_SIZES_TAKEN: set = set()


def _or_fallback() -> str:
    """"; use FA2 (fa_version=2)": the declared fallback, for a refusal's message."""
    fallback = registry().by_name(FAMILY.fallback) if FAMILY.fallback else None
    return f"; use {fallback.title} (fa_version={fallback.version})" if fallback else ""


def device_arch(q: torch.Tensor) -> int:
    """Compute capability of q's GPU as upstream numbers it (90, 100, 120 ...)."""
    env = current_environment()
    index = q.get_device()
    major, minor = env.capability(index if index >= 0 else env.current_device())
    return major * 10 + minor


def _window(window_size, causal) -> tuple[Optional[int], Optional[int]]:
    """vLLM's (left, right) with -1 = unbounded, as FA4's window_size_left/right (None = unbounded)."""
    if window_size is None:
        return None, None
    left, right = (int(w) for w in window_size)
    return (left if left >= 0 else None), (right if right >= 0 else None)


def check_call(arch: int, *, q, k, v, cu_seqlens_k, seqused_k, q_v, dropout_p, alibi_slopes,
               block_table, scheduler_metadata, num_splits, s_aux, cp_world_size, cp_rank,
               cp_tot_seqused_k, softcap=0.0, window=(-1, -1), causal=False) -> bool:
    """Refuse what FA4 cannot run on ``arch``; True when the call is FP8 KV with a 16-bit q
    (upstream's ``fp8_kv_dequant``). What every family refuses (shapes, dtypes, index
    tensors, out=, and the arguments of features FA4 does not declare: ALiBi, q_v,
    scheduler_metadata, context parallelism) the shared checks
    (validation.check_varlen_call) refused before. What is FA4's own is checked here, each
    rule one of upstream's ``assert``s that the call would reach (interface.py and the kernel
    classes at the pin): ``python -O`` removes those, so none is left to them (docs/runtime.md
    lists each). The paged page-size rules that need upstream's tile choice are in ``run``."""
    del cu_seqlens_k, q_v, dropout_p, alibi_slopes, scheduler_metadata
    del cp_world_size, cp_rank, cp_tot_seqused_k
    generation = GENERATIONS.get(arch // 10)
    if generation is None:  # the declaration's words: where it runs, or why not here
        problem = FAMILY.capability_problem(arch // 10, arch % 10, max(q.get_device(), 0))
        _refuse(f"{problem or f'FA4 does not run on sm{arch}'}{_or_fallback()}")
    if block_table is not None:
        if generation == "sm120":
            _refuse("a paged KV cache (block_table) on sm120 needs FA2 (fa_version=2): FA4's sm120 kernel "
                    "has no paged KV at the pin")
    if generation == "sm120" and num_splits > 1:
        _refuse(f"num_splits={num_splits} on sm120 needs FA2 (fa_version=2): FA4's sm120 kernel has no "
                "split-KV at the pin")
    head_size, head_size_v = q.shape[-1], v.shape[-1]
    # _validate_head_dims, with the alignment of K/V's element (16 bytes), per generation.
    shape_key = (generation, head_size, head_size_v, v.dtype)
    if shape_key not in _HEAD_SIZES_TAKEN:
        problem = head_size_problem(FAMILY, None, head_size, head_size_v, dtype_name(v.dtype), generation=generation)
        if problem is not None:
            _refuse(problem + _or_fallback())
        _HEAD_SIZES_TAKEN.add(shape_key)
    kv_fp8 = k.dtype == _E4M3 or v.dtype == _E4M3
    fp8_kv_dequant = False
    if q.dtype == _E4M3:
        if generation == "sm90":
            _refuse("FP8 q needs FA3 (fa_version=3) on sm90: FA4's FP8 attention is sm100-only at the pin "
                    "(FA4 on sm90 takes FP8 KV with a bf16/fp16 q)")
        if arch // 10 != 10:  # upstream: assert arch // 10 == 10 (sm110 and sm120 included)
            _refuse(f"FP8 attention on sm{arch}: FA4's FP8 kernels are sm100's (compute capability 10.x) at the "
                    "pin; use bf16/fp16")
        if not (k.dtype == v.dtype == _E4M3):
            raise FlashAttnTypeError(f"FP8 q needs FP8 (float8_e4m3fn) k and v, got {k.dtype} / {v.dtype}")
    elif kv_fp8:
        if generation != "sm90":
            _refuse(f"FP8 KV with a {q.dtype} q is FA4's sm90 path only; on {generation} quantize q too "
                    "(float8_e4m3fn q, k, v)")
        if not (k.dtype == v.dtype == _E4M3):
            raise FlashAttnTypeError(f"FP8 KV needs float8_e4m3fn k and v, got {k.dtype} / {v.dtype}")
        if block_table is None:
            _refuse("FP8 KV with a bf16/fp16 q needs a paged KV cache (block_table) in FA4; "
                    "or FP8 q, k and v with FA3 (fa_version=3)")
        if head_size != head_size_v:
            _refuse("FP8 KV with a bf16/fp16 q needs equal q/k and v head sizes in FA4")
        allowed = FAMILY.call.fp8_kv_head_dims
        if allowed is not None and head_size not in allowed:
            _refuse(f"FP8 KV with a bf16/fp16 q at head size {head_size}: FA4 takes it at head size "
                    f"{', '.join(map(str, allowed))} only ({FAMILY.call.fp8_kv_why}). Use FP8 q, k and v with "
                    "FA3 (fa_version=3), or a bf16/fp16 KV cache")
        fp8_kv_dequant = True
    if generation == "sm100" and head_size == head_size_v == 256:
        # Blackwell's dedicated hd256 kernel (sm100_hd256_2cta_fmha_forward.py) asserts each of these.
        for asked, what in ((softcap > 0, "softcap"), (s_aux is not None, "attention sinks (s_aux)"),
                            (seqused_k is not None, "seqused_k (a paged or batched KV cache)"),
                            (_is_local(window, causal), "a sliding window"), (q.dtype == _E4M3, "FP8"),
                            (num_splits > 1, f"num_splits={num_splits}")):
            if asked:
                _refuse(f"FA4's head-size-256 kernel on {generation} does not take {what} at the pin{_or_fallback()}")
    if single_split(generation, head_size, head_size_v) and num_splits > 1:
        # flash_fwd_sm100.py: no split-KV with a V head size of 192 or more
        _refuse(f"num_splits={num_splits} at V head size {head_size_v}: FA4 on {generation} has no split-KV there "
                "at the pin; pass 0")
    return fp8_kv_dequant


def single_split(generation: Optional[str], head_size: int, head_size_v: int) -> bool:
    """Shapes whose kernel takes no split-KV, so upstream's split heuristic (num_splits < 1)
    must not pick one either: on sm100, equal Q/K and V head sizes with V padded to 192 or more
    (flash_fwd_sm100.py asserts it; the hd256 kernel has no split at all). Upstream itself
    forces one split for unequal head sizes with V 512 (interface.py)."""
    return generation == "sm100" and head_size == head_size_v and -(-head_size_v // 16) * 16 >= 192


def flash_attn_varlen_func(
    q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
    q_v=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=None, softcap=0.0,
    alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
    return_softmax_lse=False, out=None, scheduler_metadata=None, q_descale=None, k_descale=None,
    v_descale=None, num_splits: int = 0, s_aux=None, cp_world_size=1, cp_rank=0,
    cp_tot_seqused_k=None,
):
    """vLLM's ``flash_attn_varlen_func`` on FA4 (the family refactor routes ``fa_version=4``
    here). Returns ``out``, or ``(out, softmax_lse)`` with ``return_softmax_lse=True``;
    LSE is (num_heads, total_q), float32, as FA3's. The call passes the checks every family's
    call passes (validation.check_varlen_call, against FA4's declaration) before FA4's own."""
    del deterministic, return_attn_probs  # forward only
    check_varlen_call(
        FAMILY, None, current_environment().device_type, q=q, k=k, v=v, max_seqlen_q=max_seqlen_q,
        cu_seqlens_q=cu_seqlens_q, max_seqlen_k=max_seqlen_k, cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k, q_v=q_v, dropout_p=dropout_p, causal=causal, window=window_tuple(window_size),
        softcap=softcap, alibi_slopes=alibi_slopes, block_table=block_table, out=out,
        scheduler_metadata=scheduler_metadata, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, num_splits=num_splits, s_aux=s_aux, cp_world_size=cp_world_size,
        cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k)
    if debug_checks_enabled():
        # VFA_DEBUG_CHECKS, as for every family: index values checked against the tensors they
        # index (a host copy; off by default), before any kernel reads through them.
        run_debug_checks(q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                         block_table=block_table, max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k))
    return run(
        device_arch(q), q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k, q_v=q_v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, block_table=block_table,
        return_softmax_lse=return_softmax_lse, out=out, scheduler_metadata=scheduler_metadata,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, num_splits=num_splits, s_aux=s_aux,
        cp_world_size=cp_world_size, cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k)


def run(
    arch: int, q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, *, cu_seqlens_k, seqused_k, q_v,
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, block_table,
    return_softmax_lse, out, scheduler_metadata, q_descale, k_descale, v_descale, num_splits, s_aux,
    cp_world_size, cp_rank, cp_tot_seqused_k,
):
    """``flash_attn_varlen_func`` for a given ``arch`` (90, 100, 120): the one mapping of a
    call onto upstream's kernels. The build's precompile step (cmake/fa4_precompile.py)
    calls this on fake tensors with the target's arch, so the kernels it ships have the
    very compile keys these calls reach at run time."""
    fp8_kv_dequant = check_call(
        arch, q=q, k=k, v=v, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, q_v=q_v,
        dropout_p=dropout_p, alibi_slopes=alibi_slopes, block_table=block_table,
        scheduler_metadata=scheduler_metadata, num_splits=num_splits, s_aux=s_aux,
        cp_world_size=cp_world_size, cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k,
        softcap=softcap, window=window_tuple(window_size), causal=causal)
    interface = load().interface
    left, right = _window(window_size, causal)
    generation = GENERATIONS.get(arch // 10)
    head_size, head_size_v = q.shape[-1], v.shape[-1]
    irregular = head_size % 16 or head_size_v % 16
    if block_table is not None and (fp8_kv_dequant or irregular):
        # A page size other than the kernel's tile reads K/V without TMA, which neither the FP8
        # KV path nor head sizes off a multiple of 16 have (upstream asserts both): its own
        # rules say which tile.
        if generation == "sm90":
            is_causal, is_local, _, _ = interface._resolve_causal_local_window(bool(causal), left, right)
            tile_n = interface._tile_size_fwd_sm90(head_size, head_size_v, is_causal, is_local).n_block_size
        else:
            tile_n = 128  # sm100's, unless a split with unequal head sizes halves it: refused below
            if head_size != head_size_v:
                _refuse(f"a paged KV cache at head sizes {head_size} x {head_size_v} (not multiples of 16) "
                        f"on {generation}: FA4 needs equal head sizes there at the pin; pad them to a multiple "
                        "of 16")
        if k.shape[1] != tile_n:
            what = ("FP8 KV with a bf16/fp16 q" if fp8_kv_dequant
                    else f"a paged KV cache at head size {head_size if head_size % 16 else head_size_v} "
                         "(not a multiple of 16)")
            alternative = ("or FP8 q, k and v with FA3 (fa_version=3)" if fp8_kv_dequant
                           else "or pad the head size to a multiple of 16")
            _refuse(f"{what} needs a page size of {tile_n} (FA4's tile for head size {head_size}) on "
                    f"{generation}, got {k.shape[1]}; {alternative}")
    fp8 = q.dtype == _E4M3 or fp8_kv_dequant
    if not fp8:
        # vLLM passes descales on every call; FA4 asserts they are None for 16-bit data.
        q_descale = k_descale = v_descale = None
    if num_splits < 1 and (arch // 10 == 12 or single_split(generation, head_size, head_size_v)):
        # upstream's sm120 path asserts num_splits == 1 (no heuristic there); on sm100 its
        # heuristic could pick a split that the kernel for these head sizes asserts against.
        num_splits = 1
    try:
        result = interface._flash_attn_fwd(
            q, k, v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            seqused_k=seqused_k,
            max_seqlen_q=int(max_seqlen_q),
            max_seqlen_k=int(max_seqlen_k),
            page_table=block_table,
            softmax_scale=softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5,
            causal=bool(causal),
            softcap=float(softcap),
            window_size_left=left,
            window_size_right=right,
            learnable_sink=s_aux,
            num_splits=int(num_splits),  # < 1: upstream's heuristic, as 0 means for vLLM
            return_lse=bool(return_softmax_lse),
            out=out,
            q_descale=q_descale,
            k_descale=k_descale,
            v_descale=v_descale,
            fp8_kv_dequant=fp8_kv_dequant,
            _arch=arch,
        )
    except AssertionError as exc:
        # Upstream checks shapes with assert, before compiling or launching: a clear error type.
        raise FA4Unsupported(f"FA4 refused the call: {exc}") from exc
    out, lse = result[0], result[1]
    return (out, lse) if return_softmax_lse else out
