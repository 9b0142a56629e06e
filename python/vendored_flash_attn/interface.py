"""The attention entry points: ``flash_attn_varlen_func`` and ``get_scheduler_metadata``.

Call-compatible with vLLM's ``vllm_flash_attn`` functions of the same names (same
parameters, order and defaults), except that ``fa_version=None`` asks the selector.
Each call: resolve the family, then its declared adapter (families.py: ``adapter``).
A compiled family's call is checked here by the shared checks (validation.py) and handed
with its forward op to the adapter (fa2.forward, fa3.forward), which calls the op in the
argument order of its schema; a family of Python kernels (FA4) gets the whole call
(fa4.flash_attn_varlen_func), which runs the same shared checks and then its own.
``get_scheduler_metadata`` is the adapter's of the family declaring scheduler_metadata.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

from .build_info import ComponentInfo
from .compiled import component as _component, ops as _ops
from .debug_checks import DEBUG_ENV, debug_checks_enabled, run_debug_checks
from .environment import current_environment, on_environment_change
from .errors import (FlashAttnCaptureError, FlashAttnInputError, FlashAttnTypeError,
                     FlashAttnUnavailableError)
from .fa3 import get_scheduler_metadata, maybe_contiguous  # noqa: F401  (the package's API)
from .families import Family, registry, titles_text
from .kernels import dtype_name
from .selector import ENV_VAR, resolve_device_index, select_flash_attn_version, version_problem
from .validation import (_is_local, check_q_device, check_varlen_call, quick_check_varlen_call,
                         static_verdict, window_tuple)

_E4M3 = torch.float8_e4m3fn

#: FA version -> the torch.ops namespace of its compiled module (tests/gpu/test_sparse_gpu.py
#: reads it here), from the family declaration.
OP_NAMESPACES = {f.version: f.op_namespace for f in registry() if f.compiled}


# version -> the forward op overload (a compiled family) or the adapter function (a family
# of Python kernels, FA4), looked up once: torch.ops attribute lookups cost microseconds on
# every call.
_forward_ops: dict = {}
on_environment_change(_forward_ops.clear)


def _forward_op(version: int):
    op = _forward_ops.get(version)
    if op is None:
        family = registry()[version]
        op = (getattr(_ops(version), family.forward_op).default if family.compiled
              else family.adapter_function())
        _forward_ops[version] = op
    return op


def _device_index(tensor: torch.Tensor) -> int:
    index, problem = resolve_device_index(tensor.device)
    if problem is not None:
        raise FlashAttnUnavailableError(problem)
    return index


# The resolution of a kind of call, one dictionary lookup per call (asking the selector
# costs microseconds on every layer of every step, and the answer does not change within
# one environment). Key: (fa_version, device, signature) for a named version, or (None,
# device, VLLM_FLASH_ATTN_VERSION, ALiBi?, sinks?, signature) for the selector, where the
# signature is (dtype, q heads, head size, KV heads, V head size, bits of _NEEDS). Entry: a
# Resolved.
_resolved: dict = {}
on_environment_change(_resolved.clear)

# Bits of the signature: the kernel features a call needs (the selector falls back to FA2
# when this wheel's FA3 lacks one that FA2 has; the quick check's verdict depends on them).
_NEEDS = ((1, "paged"), (2, "softcap"), (4, "local"), (8, "split"))
_NO_WINDOW = (-1, -1)


class Resolved(NamedTuple):
    version: int
    comp: Optional[ComponentInfo]   # None: a family of Python kernels (FA4), no build record
    op: object                      # the forward op, or the adapter taking the whole call
    debug: bool                     # VFA_DEBUG_CHECKS
    family: Family
    forward: Optional[object]       # a compiled family's adapter forward; None: op takes the call
    quick: bool                     # validation.static_verdict of the signature
    capture_guard: bool             # ask whether the stream is capturing (see _refuse_capture)


def _resolve(key: tuple, tensor: torch.Tensor, fa_version, requires_alibi: bool, has_sinks: bool,
             signature: tuple) -> Resolved:
    """Fill _resolved[key]."""
    dtype, num_heads, head_size, num_heads_k, head_size_v, needs = signature
    features = tuple(name for bit, name in _NEEDS if needs & bit)
    version = _resolve_version(fa_version, tensor, requires_alibi=requires_alibi,
                               head_size=head_size, head_size_v=head_size_v,
                               has_sinks=has_sinks, dtype=dtype, features=features)
    # A family of Python kernels (FA4) gets comp None and no forward: its adapter takes the
    # whole call (families.py: "adapter").
    family = registry()[version]
    comp = _component(version) if family.compiled else None
    forward = family.adapter_function() if family.compiled else None
    quick = comp is not None and isinstance(num_heads, int) and static_verdict(
        family, comp, dtype, num_heads, head_size, num_heads_k, head_size_v, *(
            bool(needs & bit) for bit, _ in _NEEDS))
    debug = debug_checks_enabled()
    hit = _resolved[key] = Resolved(version, comp, _forward_op(version), debug, family, forward, quick,
                                    debug or not family.call.cuda_graphs)
    return hit


def _stream_capturing(q: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream (never for a tensor that
    is not on a CUDA device: no driver is asked then)."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def _refuse_capture(resolved: Resolved, q: torch.Tensor) -> None:
    """Raise before anything is enqueued when this call cannot be part of a CUDA graph being
    captured on the current stream: the debug checks read index tensors on the host (a device
    sync, which capture forbids), and a family declared not capturable would be replayed
    wrongly. Only asked when the resolution says one of the two applies (capture_guard)."""
    if not _stream_capturing(q):
        return
    if resolved.debug:
        raise FlashAttnCaptureError(
            f"{DEBUG_ENV}=1 reads index tensors on the host (a device sync), which a CUDA graph capture "
            f"cannot contain: unset {DEBUG_ENV} for the captured calls (run them once eagerly with it on "
            "to check their inputs)")
    family = resolved.family
    raise FlashAttnCaptureError(
        f"{family.title} cannot be captured in a CUDA graph: {family.call.cuda_graphs_why}; run it eagerly "
        f"or use {titles_text(f for f in registry() if f.call.cuda_graphs)}")


def _resolve_version(fa_version, tensor: torch.Tensor, **traits) -> int:
    if fa_version is None and dtype_name(tensor.dtype) is None:
        # A dtype no FlashAttention kernel takes is the caller's mistake, not a reason for
        # the selector to fall back or to call FA unavailable.
        raise FlashAttnTypeError(f"q has dtype {tensor.dtype}; FlashAttention takes torch.bfloat16, "
                                 "torch.float16 or torch.float8_e4m3fn (FP8 needs "
                                 f"{titles_text(registry().having('fp8'))})")
    if fa_version is None:
        selection = select_flash_attn_version(device=tensor.device, **traits)
        if selection.version is None:
            raise FlashAttnUnavailableError(f"no usable FlashAttention version: {selection.reason}")
        return selection.version
    # A tensor would compare equal to 3 elementwise, but key _resolved by its id: refused.
    families = registry()
    if isinstance(fa_version, torch.Tensor) or families.get(fa_version) is None:
        raise FlashAttnInputError(f"fa_version must be {', '.join(map(str, families.versions))} or None (let the "
                                  f"selector choose), got {fa_version!r}")
    fa_version = int(fa_version)
    problem = version_problem(fa_version, _device_index(tensor))
    if problem is not None:
        raise FlashAttnUnavailableError(f"fa_version={fa_version} cannot run here: {problem}")
    return fa_version


def flash_attn_varlen_func(
    q,
    k,
    v,
    max_seqlen_q,
    cu_seqlens_q,
    max_seqlen_k,
    cu_seqlens_k=None,  # only used for non-paged prefill
    seqused_k=None,
    q_v=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size: Optional[List[int]] = None,
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    return_softmax_lse=False,
    out=None,
    # FA3 Only
    scheduler_metadata=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    num_splits: int = 0,
    # Version selector
    fa_version: Optional[int] = None,
    s_aux=None,
    cp_world_size=1,
    cp_rank=0,
    cp_tot_seqused_k=None,
):
    """Variable-length (and paged-KV) attention forward; see docs/runtime.md.

    q: (total_q, num_heads, head_size); k, v: (total_k, num_heads_k, head_size) with
    cu_seqlens_k, or (num_blocks, block_size, num_heads_k, head_size) with block_table +
    seqused_k. GQA/MQA when num_heads is a multiple of num_heads_k. Returns out, or
    (out, softmax_lse) with return_softmax_lse=True. fa_version=None lets the selector
    choose; FP8 (float8_e4m3fn q/k/v, bf16 out, float32 descales of shape
    (num_seqs, num_kv_heads)) needs FA3 on Hopper. ``deterministic`` and
    ``return_attn_probs`` are accepted for compatibility and have no effect (forward only).
    """
    del deterministic, return_attn_probs  # forward-only kernels: nothing to do
    if not isinstance(q, torch.Tensor):
        raise FlashAttnTypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    env = current_environment()
    device = q.get_device()  # -1 unless a CUDA tensor
    if device < 0 or env.device_type != "cuda":
        if q.is_cuda != (env.device_type == "cuda"):
            check_q_device(q, env.device_type)  # raises before the selector looks at q.device
    window = _NO_WINDOW if window_size is None else window_tuple(window_size)
    q_shape = q.shape
    dtype = q.dtype
    try:
        num_heads, head_size = q_shape[-2], q_shape[-1]
        k_shape, v_shape = k.shape, v.shape
        num_heads_k, head_size_v = k_shape[-2], v_shape[-1]
    except (AttributeError, IndexError):  # not tensors or too few dims: the full check says so
        num_heads = num_heads_k = k_shape = None
        head_size = q_shape[-1] if q_shape else None
        v_shape = v.shape if isinstance(v, torch.Tensor) else None
        head_size_v = v_shape[-1] if v_shape else None
    # The FA3 kernel features the call needs (_NEEDS): part of the resolution key, as the
    # selector's answer and the quick check's verdict depend on them.
    needs = 1 if block_table is not None else 0
    if (window[0] >= 0 or window[1] >= 0) and _is_local(window, causal):
        needs |= 4
    try:
        if softcap > 0:
            needs |= 2
        if num_splits > 1:
            needs |= 8
    except (TypeError, RuntimeError):  # not numbers: validation says so
        pass
    signature = (dtype, num_heads, head_size, num_heads_k, head_size_v, needs)
    if fa_version is not None:
        key = (fa_version, device, signature)
    else:
        key = (None, device, env.getenv(ENV_VAR), alibi_slopes is not None, s_aux is not None, signature)
    resolved = _resolved.get(key) or _resolve(key, q, fa_version, alibi_slopes is not None,
                                              s_aux is not None, signature)
    if resolved.capture_guard:
        _refuse_capture(resolved, q)
    version, comp, op, debug, family, forward, static, _ = resolved
    if forward is None:
        # A family whose adapter takes the whole call (FA4): it runs the shared checks and
        # its own, and refuses what it cannot run before any kernel, naming who can.
        return op(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=cu_seqlens_k,
                  seqused_k=seqused_k, q_v=q_v, dropout_p=dropout_p, softmax_scale=softmax_scale,
                  causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                  block_table=block_table, return_softmax_lse=return_softmax_lse, out=out,
                  scheduler_metadata=scheduler_metadata, q_descale=q_descale, k_descale=k_descale,
                  v_descale=v_descale, num_splits=num_splits, s_aux=s_aux, cp_world_size=cp_world_size,
                  cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k)
    if softmax_scale is None:
        softmax_scale = head_size ** (-0.5)
    # Like upstream: a q/k/v whose last dim is strided is copied (the kernels need stride
    # 1). is_contiguous() first: it is a third of the cost of stride(-1).
    if not q.is_contiguous() and q.stride(-1) != 1:
        q = q.contiguous()
    if isinstance(k, torch.Tensor) and not k.is_contiguous() and k.stride(-1) != 1:
        k = k.contiguous()
    if isinstance(v, torch.Tensor) and not v.is_contiguous() and v.stride(-1) != 1:
        v = v.contiguous()
    # The common call shapes take the quick check (validation.py); the others, and every
    # call it does not accept, the full one, which raises with the precise message.
    quick = (static and q_v is None and alibi_slopes is None and s_aux is None and cp_world_size == 1
             and cp_rank == 0 and cp_tot_seqused_k is None and quick_check_varlen_call(
                 family, comp, device, q_shape, v_shape, dtype, q, k, v, max_seqlen_q,
                 cu_seqlens_q, max_seqlen_k, cu_seqlens_k, seqused_k, dropout_p, causal, window,
                 softcap, block_table, out, scheduler_metadata, q_descale, k_descale, v_descale,
                 num_splits, True, k_shape))
    if quick:
        # Checked to be exact ints (and cp_world_size == 1, cp_rank == 0) on this path;
        # the schema takes Python ints, so nothing to convert.
        fp8 = dtype is _E4M3
        cp_world_size, cp_rank = 1, 0
    else:
        fp8 = check_varlen_call(
            family, comp, env.device_type,
            q=q, k=k, v=v, max_seqlen_q=max_seqlen_q, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_k=max_seqlen_k, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, q_v=q_v,
            dropout_p=dropout_p, causal=causal, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, block_table=block_table, out=out,
            scheduler_metadata=scheduler_metadata, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, num_splits=num_splits, s_aux=s_aux, cp_world_size=cp_world_size,
            cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k).fp8
        max_seqlen_q, max_seqlen_k, num_splits = int(max_seqlen_q), int(max_seqlen_k), int(num_splits)
        cp_world_size, cp_rank = int(cp_world_size), int(cp_rank)
    if debug:
        run_debug_checks(q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_k=seqused_k, block_table=block_table,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    # The family's adapter calls its op in the argument order of the op's schema
    # (positional arguments: this runs on every layer of every step).
    out, softmax_lse = forward(
        op, comp, q, k, v, q_v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, block_table, alibi_slopes, softmax_scale, causal, window, softcap, fp8,
        num_splits, scheduler_metadata, q_descale, k_descale, v_descale, s_aux, cp_world_size,
        cp_rank, cp_tot_seqused_k)
    return (out, softmax_lse) if return_softmax_lse else out
