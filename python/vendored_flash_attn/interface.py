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

from typing import List, Optional, Tuple

import torch

from .compiled import component as _component, ops as _ops
from .debug_checks import debug_checks_enabled, run_debug_checks
from .environment import current_environment, on_environment_change
from .errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError
from .fa3 import get_scheduler_metadata, maybe_contiguous  # noqa: F401  (the package's API)
from .families import registry, titles_text
from .kernels import dtype_name
from .selector import ENV_VAR, resolve_device_index, select_flash_attn_version, version_problem
from .validation import (_is_local, check_q_device, check_varlen_call, quick_check_varlen_call,
                         window_tuple)

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


# (fa_version, device) or (None, device, VLLM_FLASH_ATTN_VERSION, traits) -> (version,
# ComponentInfo, forward op, VFA_DEBUG_CHECKS on, Family, the compiled family's adapter
# forward or None): the answer for a device and a kind of
# call does not change within one environment, and asking the selector costs
# microseconds on every layer of every step.
_resolved: dict = {}
on_environment_change(_resolved.clear)

# Bits of the resolution key: the FA3 kernel features a call needs (the selector falls
# back to FA2 when this wheel's FA3 lacks one that FA2 has).
_NEEDS = ((1, "paged"), (2, "softcap"), (4, "local"), (8, "split"))


def _resolve(key: tuple, tensor: torch.Tensor, traits: tuple) -> tuple:
    """Fill _resolved[key]; ``traits`` = (requires_alibi, head_size, head_size_v,
    has_sinks, dtype, bits of _NEEDS) of the call."""
    requires_alibi, head_size, head_size_v, has_sinks, dtype, needs = traits
    version = _resolve_version(key[0], tensor, requires_alibi=requires_alibi,
                               head_size=head_size, head_size_v=head_size_v,
                               has_sinks=has_sinks, dtype=dtype,
                               features=tuple(name for bit, name in _NEEDS if needs & bit))
    # A family of Python kernels (FA4) gets comp None and no forward: its adapter takes the
    # whole call (families.py: "adapter").
    family = registry()[version]
    comp = _component(version) if family.compiled else None
    forward = family.adapter_function() if family.compiled else None
    hit = _resolved[key] = (version, comp, _forward_op(version), debug_checks_enabled(), family, forward)
    return hit


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
    window = window_tuple(window_size)
    q_shape = q.shape
    head_size = q_shape[-1]
    v_shape = v.shape if isinstance(v, torch.Tensor) else None
    head_size_v = v_shape[-1] if v_shape else None
    dtype = q.dtype
    # An explicit fa_version is checked against the device only; the selector's answer
    # depends on the override and the kind of call too, including the FA3 kernel
    # features it needs (_NEEDS).
    if fa_version is not None:
        key = (fa_version, device)
    else:
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
        key = (None, device, env.getenv(ENV_VAR), alibi_slopes is not None, head_size,
               head_size_v, s_aux is not None, dtype, needs)
    version, comp, op, debug, family, forward = _resolved.get(key) or _resolve(key, q, (
        alibi_slopes is not None, head_size, head_size_v, s_aux is not None, dtype,
        key[-1] if fa_version is None else 0))
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
    quick = (q_v is None and alibi_slopes is None and s_aux is None and cp_world_size == 1
             and cp_rank == 0 and cp_tot_seqused_k is None and quick_check_varlen_call(
                 family, comp, device, q_shape, v_shape, dtype, q, k, v, max_seqlen_q,
                 cu_seqlens_q, max_seqlen_k, cu_seqlens_k, seqused_k, dropout_p, causal, window,
                 softcap, block_table, out, scheduler_metadata, q_descale, k_descale, v_descale,
                 num_splits))
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
