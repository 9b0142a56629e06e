"""The attention entry points: ``flash_attn_varlen_func`` and ``get_scheduler_metadata``.

Call-compatible with vLLM's ``vllm_flash_attn`` functions of the same names (same
parameters, order and defaults), except that ``fa_version=None`` asks the selector.
Each call: resolve the version, validate (validation.py), then call the op of the
compiled module with exactly the argument order of its schema.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .build_info import BuildInfoMissing, ComponentInfo
from .debug_checks import debug_checks_enabled, run_debug_checks
from .environment import current_environment, on_environment_change
from .errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError
from .kernels import dtype_name, dtype_problem, head_size_problem
from .families import registry
from .op_schemas import OP_NAMESPACES  # noqa: F401  (tests/gpu/test_sparse_gpu.py reads it here)
from .scheduler_metadata import MetadataArgs, check_call as check_scheduler_metadata
from .scheduler_metadata import op_error, record as record_scheduler_metadata
from .scheduler_metadata import records as scheduler_metadata_records
from .selector import ENV_VAR, resolve_device_index, select_flash_attn_version, version_problem
from .validation import (_integer, _is_local, check_q_device, check_varlen_call,
                         quick_check_varlen_call)

_E4M3 = torch.float8_e4m3fn


def _component(version: int) -> ComponentInfo:
    try:
        return current_environment().build_info().component(version)
    except BuildInfoMissing as exc:
        raise FlashAttnUnavailableError(str(exc)) from exc


def _ops(version: int):
    """The op namespace of ``version``'s compiled module; importing it registers its ops."""
    family = registry()[version]
    error = current_environment().load_module(version)
    if error is not None:
        raise FlashAttnUnavailableError(f"the {family.title} module failed to import: {error}")
    return getattr(torch.ops, family.op_namespace)


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
# ComponentInfo, forward op, VFA_DEBUG_CHECKS on): the answer for a device and a kind of
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
    # A family of Python kernels (FA4) gets comp None: its adapter checks and dispatches the
    # whole call itself (families.py: "adapter").
    comp = _component(version) if registry()[version].compiled else None
    hit = _resolved[key] = (version, comp, _forward_op(version), debug_checks_enabled())
    return hit


def _resolve_version(fa_version, tensor: torch.Tensor, **traits) -> int:
    if fa_version is None and dtype_name(tensor.dtype) is None:
        # A dtype no FlashAttention kernel takes is the caller's mistake, not a reason for
        # the selector to fall back or to call FA unavailable.
        raise FlashAttnTypeError(f"q has dtype {tensor.dtype}; FlashAttention takes torch.bfloat16, "
                                 "torch.float16 or torch.float8_e4m3fn (FP8 needs FA3)")
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


def maybe_contiguous(x):
    # Like upstream: a q/k/v whose last dim is strided is copied (the kernels need stride 1).
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: torch.Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    has_softcap=False,
    num_splits=0,    # Can be tuned for speed
    pack_gqa=None,   # Can be tuned for speed
    sm_margin=0,     # Can be tuned if some SMs are used for communication
):
    """FA3 scheduler metadata for a later ``flash_attn_varlen_func(..., scheduler_metadata=)``.

    It holds the schedule of exactly one call shape; the returned tensor remembers the
    arguments, and a call that passes it is refused when FA3 would schedule that call
    differently (scheduler_metadata.py)."""
    if not isinstance(cache_seqlens, torch.Tensor):
        raise FlashAttnTypeError("cache_seqlens must be a torch.Tensor (the KV length of each sequence)")
    env = current_environment()
    if cache_seqlens.device.type != env.device_type:
        raise FlashAttnInputError(f"cache_seqlens is on {cache_seqlens.device}; it must be on a "
                                  f"{env.device_type.upper()} device")
    if cache_seqlens.dtype != torch.int32:
        raise FlashAttnTypeError(f"cache_seqlens must have dtype torch.int32, got {cache_seqlens.dtype}")
    problem = version_problem(3, _device_index(cache_seqlens))
    if problem is not None:
        raise FlashAttnUnavailableError(f"get_scheduler_metadata needs FA3: {problem}")
    comp = _component(3)
    if headdim_v is None:
        headdim_v = headdim
    batch_size = _integer("batch_size", batch_size, 1)
    max_seqlen_q = _integer("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _integer("max_seqlen_k", max_seqlen_k)
    num_heads_q = _integer("num_heads_q", num_heads_q, 1)
    num_heads_kv = _integer("num_heads_kv", num_heads_kv, 1)
    headdim, headdim_v = _integer("headdim", headdim, 1), _integer("headdim_v", headdim_v, 1)
    max_seqlen_k_new = _integer("max_seqlen_k_new", max_seqlen_k_new)
    num_splits, sm_margin = _integer("num_splits", num_splits), _integer("sm_margin", sm_margin)
    if page_size is not None:
        page_size = _integer("page_size", page_size, 1)
    if len(window_size) != 2:
        raise FlashAttnInputError(f"window_size must be (left, right), got {window_size!r}")
    window = (int(window_size[0]), int(window_size[1]))
    if pack_gqa is not None:
        pack_gqa = bool(pack_gqa)
    name = dtype_name(qkv_dtype)
    problem = dtype_problem(3, comp, name, shown=str(qkv_dtype).replace("torch.", "")) or head_size_problem(
        3, comp, headdim, headdim_v, name)
    if problem:
        raise FlashAttnInputError(f"get_scheduler_metadata: {problem}")
    if num_heads_q % num_heads_kv:
        raise FlashAttnInputError(f"num_heads_q ({num_heads_q}) must be a multiple of num_heads_kv "
                                  f"({num_heads_kv})")
    if tuple(cache_seqlens.shape) != (batch_size,):
        raise FlashAttnInputError(f"cache_seqlens must have shape ({batch_size},), got "
                                  f"{tuple(cache_seqlens.shape)}")
    # The op's prepare kernel reads these through raw int32 pointers, `length` entries each.
    for label, x, length in (("cu_seqlens_q", cu_seqlens_q, batch_size + 1),
                             ("cu_seqlens_k_new", cu_seqlens_k_new, batch_size + 1),
                             ("cache_leftpad", cache_leftpad, batch_size)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise FlashAttnTypeError(f"{label} must be a torch.Tensor or None, got {type(x).__name__}")
        if x.device != cache_seqlens.device:
            raise FlashAttnInputError(f"{label} is on {x.device} but cache_seqlens is on "
                                      f"{cache_seqlens.device}")
        if x.dtype != torch.int32:
            raise FlashAttnTypeError(f"{label} must have dtype torch.int32, got {x.dtype}")
        if tuple(x.shape) != (length,):
            raise FlashAttnInputError(f"{label} must have shape ({length},) for batch_size={batch_size}, "
                                      f"got {tuple(x.shape)}")
        if not x.is_contiguous():
            raise FlashAttnInputError(f"{label} must be contiguous; pass {label}.contiguous()")
    cache_seqlens = maybe_contiguous(cache_seqlens)
    metadata = _ops(3).get_scheduler_metadata(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
        qkv_dtype,
        cache_seqlens,
        cu_seqlens_q,
        None,  # cu_seqlens_k
        cu_seqlens_k_new,
        None,  # seqused_q
        cache_leftpad,
        page_size,
        max_seqlen_k_new,
        bool(causal),
        window[0], window[1],
        bool(has_softcap),
        num_splits,
        pack_gqa,
        sm_margin,
    )
    record_scheduler_metadata(metadata, MetadataArgs(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
        qkv_dtype, cu_seqlens_q is not None, page_size, bool(causal), window, bool(has_softcap),
        num_splits, pack_gqa, sm_margin, max_seqlen_k_new,
        cu_seqlens_k_new is not None, cache_leftpad is not None))
    return metadata


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
    if window_size is None:
        window = (-1, -1)
    else:
        if len(window_size) != 2:
            raise FlashAttnInputError(f"window_size must be (left, right), got {window_size!r}")
        window = (int(window_size[0]), int(window_size[1]))
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
    version, comp, op, debug = _resolved.get(key) or _resolve(key, q, (
        alibi_slopes is not None, head_size, head_size_v, s_aux is not None, dtype,
        key[-1] if fa_version is None else 0))
    if comp is None:
        # A family whose adapter checks and dispatches the call (FA4): what it cannot run
        # is refused there, before any kernel, naming the family that can.
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
                 version, comp, device, q_shape, v_shape, dtype, q, k, v, max_seqlen_q,
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
            version, comp, env.device_type,
            q=q, k=k, v=v, max_seqlen_q=max_seqlen_q, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_k=max_seqlen_k, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, q_v=q_v,
            dropout_p=dropout_p, causal=causal, window=window, softcap=softcap,
            alibi_slopes=alibi_slopes, block_table=block_table, out=out,
            scheduler_metadata=scheduler_metadata, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, num_splits=num_splits, s_aux=s_aux, cp_world_size=cp_world_size,
            cp_rank=cp_rank, cp_tot_seqused_k=cp_tot_seqused_k).fp8
        max_seqlen_q, max_seqlen_k, num_splits = int(max_seqlen_q), int(max_seqlen_k), int(num_splits)
        cp_world_size, cp_rank = int(cp_world_size), int(cp_rank)
    if scheduler_metadata is not None and version == 3:
        # Metadata get_scheduler_metadata computed for another call shape: compared once
        # per metadata tensor and call shape (scheduler_metadata.check_call), a lookup
        # after that. Written out here: vLLM passes metadata on every layer of every step.
        entry = scheduler_metadata_records.get(id(scheduler_metadata))
        if entry is not None and entry[0]() is scheduler_metadata:
            # v's shape is k's but for the last dim (validated): KV heads, page size.
            metadata_key = (cu_seqlens_q.numel() - 1, q_shape[1], v_shape[-2], head_size,
                            head_size_v, dtype, max_seqlen_q, max_seqlen_k,
                            v_shape[1] if block_table is not None else None, causal, window,
                            softcap, num_splits)
            if metadata_key != entry[3]:
                check_scheduler_metadata(entry, comp, metadata_key)
    if debug:
        run_debug_checks(q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_k=seqused_k, block_table=block_table,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    # The op calls, in the argument order of the modules' schemas (upstream's
    # ops.def strings), written out here rather than in helpers: this runs on every
    # layer of every step, and a Python call with 30 arguments costs a fraction of a µs.
    if version == 3:
        # Descales only mean something for FP8 data; FA3 ignores them otherwise, and
        # vLLM passes them on every call, so they are dropped rather than refused.
        if not fp8:
            q_descale = k_descale = v_descale = None
        try:
            out, softmax_lse = op(
                q, k, v,
                None, None,        # k_new, v_new
                q_v,
                out,
                cu_seqlens_q,
                cu_seqlens_k,
                None,              # cu_seqlens_k_new
                None, seqused_k,   # seqused_q, seqused_k
                max_seqlen_q, max_seqlen_k,
                block_table,       # page_table
                None,              # kv_batch_idx
                None,              # leftpad_k
                None, None, None,  # rotary_cos, rotary_sin, seqlens_rotary
                q_descale, k_descale, v_descale,
                float(softmax_scale),
                bool(causal),
                window[0], window[1],
                float(softcap),
                True,              # is_rotary_interleaved (no rotary here)
                scheduler_metadata,
                num_splits,
                None,              # pack_gqa: heuristic
                0,                 # sm_margin
                s_aux,
                cp_world_size,
                cp_rank,
                cp_tot_seqused_k,
            )[:2]
        except RuntimeError as exc:
            # A metadata tensor get_scheduler_metadata did not return (a copy in a
            # CUDA-graph buffer) is checked by the op alone, before any kernel.
            refusal = None if scheduler_metadata is None else op_error(exc, MetadataArgs(
                cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, q_shape[1], k.shape[-2],
                head_size, head_size_v, dtype, True,
                k.shape[1] if block_table is not None else None, bool(causal), window,
                softcap > 0, num_splits).as_call())
            if refusal is None:
                raise
            raise refusal from exc
    else:
        out, softmax_lse = op(
            q, k, v,
            out,
            cu_seqlens_q,
            # Paged cache: FA2's schema still wants cu_seqlens_k and its kernels read
            # entries b and b+1, but with a block_table the values never reach an
            # address or a length (block_info.h: K offsets come from the table,
            # lengths from seqused_k). Any initialised int32 tensor of batch + 1
            # entries keeps that read well-defined; cu_seqlens_q is one, and costs no
            # allocation or kernel launch per call. (Upstream passes uninitialised
            # memory here.)
            cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k,
            seqused_k,
            None,              # leftpad_k
            block_table,
            alibi_slopes,
            max_seqlen_q,
            max_seqlen_k,
            0.0,               # p_dropout: built without dropout
            float(softmax_scale),
            False,             # zero_tensors
            bool(causal),
            window[0],
            window[1],
            float(softcap),
            False,             # return_softmax: only meaningful with dropout
            num_splits,
            None,              # gen: must be None
        )[:2]
    return (out, softmax_lse) if return_softmax_lse else out
