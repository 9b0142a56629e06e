"""FA3's adapter: a call the shared checks (validation.py) passed, onto the compiled module's
``fwd`` in the argument order of its schema (op_schemas.FA3_FWD) (``launch``, in the launch
contract of call.LAUNCH; ``forward``, the declared adapter, for a call object), and
``scheduler_metadata``, what the interface's ``get_scheduler_metadata`` (call.SCHEDULER_METADATA)
hands its call to.

The family declaration (cmake/knobs.json, ``families.fa3``) names ``forward`` as its
adapter and declares the ``scheduler_metadata`` feature, which this module serves: the
metadata a call passes is compared with the call shape it was computed for
(scheduler_metadata.py) here, before the op.
"""

from __future__ import annotations

import torch

from ..call.arguments import SchedulerMetadataCall, VarlenCall, launch_arguments, maybe_contiguous
from ..selection.compiled import component, ops
from ..selection.environment import current_environment
from ..errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError
from ..declaration.families import Family
from ..declaration.kernels import dtype_name, dtype_problem, head_size_problem
from ..call.scheduler_metadata import MetadataArgs, check_call as check_scheduler_metadata
from ..call.scheduler_metadata import op_error, record as record_scheduler_metadata
from ..call.scheduler_metadata import records as scheduler_metadata_records
from ..selection.selector import resolve_device_index, version_problem
from ..call.validation import _integer, window_tuple


def _device_index(tensor: torch.Tensor) -> int:
    index, problem = resolve_device_index(tensor.device)
    if problem is not None:
        raise FlashAttnUnavailableError(problem)
    return index


def scheduler_metadata(family: Family, call: SchedulerMetadataCall):
    """``get_scheduler_metadata``'s adapter (call.SCHEDULER_METADATA; the interface hands it
    the call with the family declaring ``scheduler_metadata``): the scheduler metadata for a
    later ``flash_attn_varlen_func(..., scheduler_metadata=)``.

    It holds the schedule of exactly one call shape; the returned tensor remembers the
    arguments, and a call that passes it is refused when FA3 would schedule that call
    differently (scheduler_metadata.py)."""
    cache_seqlens = call.cache_seqlens
    if not isinstance(cache_seqlens, torch.Tensor):
        raise FlashAttnTypeError("cache_seqlens must be a torch.Tensor (the KV length of each sequence)")
    env = current_environment()
    if cache_seqlens.device.type != env.device_type:
        raise FlashAttnInputError(f"cache_seqlens is on {cache_seqlens.device}; it must be on a "
                                  f"{env.device_type.upper()} device")
    if cache_seqlens.dtype != torch.int32:
        raise FlashAttnTypeError(f"cache_seqlens must have dtype torch.int32, got {cache_seqlens.dtype}")
    problem = version_problem(family.version, _device_index(cache_seqlens))
    if problem is not None:
        raise FlashAttnUnavailableError(f"get_scheduler_metadata needs {family.title}: {problem}")
    comp = component(family.version)
    headdim_v = call.headdim if call.headdim_v is None else call.headdim_v
    batch_size = _integer("batch_size", call.batch_size, 1)
    max_seqlen_q = _integer("max_seqlen_q", call.max_seqlen_q)
    max_seqlen_k = _integer("max_seqlen_k", call.max_seqlen_k)
    num_heads_q = _integer("num_heads_q", call.num_heads_q, 1)
    num_heads_kv = _integer("num_heads_kv", call.num_heads_kv, 1)
    headdim, headdim_v = _integer("headdim", call.headdim, 1), _integer("headdim_v", headdim_v, 1)
    max_seqlen_k_new = _integer("max_seqlen_k_new", call.max_seqlen_k_new)
    num_splits, sm_margin = _integer("num_splits", call.num_splits), _integer("sm_margin", call.sm_margin)
    page_size = None if call.page_size is None else _integer("page_size", call.page_size, 1)
    window = window_tuple(call.window_size)
    pack_gqa = None if call.pack_gqa is None else bool(call.pack_gqa)
    causal, has_softcap, qkv_dtype = bool(call.causal), bool(call.has_softcap), call.qkv_dtype
    cu_seqlens_q, cu_seqlens_k_new, cache_leftpad = call.cu_seqlens_q, call.cu_seqlens_k_new, call.cache_leftpad
    name = dtype_name(qkv_dtype)
    problem = dtype_problem(family, comp, name, shown=str(qkv_dtype).replace("torch.", "")) or head_size_problem(
        family, comp, headdim, headdim_v, name)
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
    # In the op's schema order (op_schemas.FA3_GET_SCHEDULER_METADATA).
    metadata = ops(family.version).get_scheduler_metadata(
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
        causal,
        window[0], window[1],
        has_softcap,
        num_splits,
        pack_gqa,
        sm_margin,
    )
    record_scheduler_metadata(metadata, MetadataArgs(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
        qkv_dtype, cu_seqlens_q is not None, page_size, causal, window, has_softcap,
        num_splits, pack_gqa, sm_margin, max_seqlen_k_new,
        cu_seqlens_k_new is not None, cache_leftpad is not None))
    return metadata


def launch(resolved, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table, out,
           scheduler_metadata, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right,
           softcap, num_splits, return_softmax_lse, fp8, q_v, alibi_slopes, s_aux, cp_world_size, cp_rank,
           cp_tot_seqused_k):
    """FA3's forward op (``resolved.op``) for a call the shared checks passed, in the launch
    contract (call.LAUNCH); its result (out, softmax_lse, ...). alibi_slopes is not read: FA3
    declares no ALiBi, so the shared checks refused it; the op returns LSE either way."""
    if scheduler_metadata is not None:
        # Metadata get_scheduler_metadata computed for another call shape: compared once
        # per metadata tensor and call shape (scheduler_metadata.check_call), a lookup
        # after that. Written out here: vLLM passes metadata on every layer of every step.
        entry = scheduler_metadata_records.get(id(scheduler_metadata))
        if entry is not None and entry[0]() is scheduler_metadata:
            # v's shape is k's but for the last dim (validated): KV heads, page size.
            v_shape = v.shape
            metadata_key = (cu_seqlens_q.numel() - 1, q.shape[1], v_shape[-2], q.shape[-1],
                            v_shape[-1], q.dtype, max_seqlen_q, max_seqlen_k,
                            v_shape[1] if block_table is not None else None, causal, (window_left, window_right),
                            softcap, num_splits)
            if metadata_key != entry[3]:
                check_scheduler_metadata(entry, resolved.comp, metadata_key)
    # Descales only mean something for FP8 data; FA3 ignores them otherwise, and
    # vLLM passes them on every call, so they are dropped rather than refused.
    if not fp8:
        q_descale = k_descale = v_descale = None
    try:
        return resolved.op(
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
            softmax_scale,
            causal,
            window_left, window_right,
            softcap,
            True,              # is_rotary_interleaved (no rotary here)
            scheduler_metadata,
            num_splits,
            None,              # pack_gqa: heuristic
            0,                 # sm_margin
            s_aux,
            cp_world_size,
            cp_rank,
            cp_tot_seqused_k,
        )
    except RuntimeError as exc:
        # A metadata tensor get_scheduler_metadata did not return (a copy in a
        # CUDA-graph buffer) is checked by the op alone, before any kernel.
        refusal = None if scheduler_metadata is None else op_error(exc, MetadataArgs(
            cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[-2],
            q.shape[-1], v.shape[-1], q.dtype, True,
            k.shape[1] if block_table is not None else None, causal, (window_left, window_right),
            softcap > 0, num_splits).as_call())
        if refusal is None:
            raise
        raise refusal from exc


def forward(resolved, call: VarlenCall, window: tuple[int, int], fp8: bool):
    """FA3's adapter (the declaration's ``adapter``): (out, softmax_lse) of a call the shared
    checks passed, through ``launch``."""
    return launch(resolved, *launch_arguments(call, window, fp8))[:2]


forward.launch = launch  # the interface's quick path calls it with a quick call's own arguments
# The interface's get_scheduler_metadata hands its call here: the declaration names this
# family's adapter, and the family declares the scheduler_metadata feature.
forward.scheduler_metadata = scheduler_metadata
