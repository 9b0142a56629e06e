"""The attention entry points: ``flash_attn_varlen_func`` and ``get_scheduler_metadata``.

Call-compatible with vLLM's ``vllm_flash_attn`` functions of the same names (same
parameters, order and defaults: ``flash_attn_varlen_func`` is generated from the one table
of them, call.py), except that ``fa_version=None`` asks the selector. Each call: resolve
its kind (family, build record, op, adapter) once per kind, check it with the shared checks
(validation.py: the quick check for the common shapes, else the full one) against the
family's declaration, and hand the checked call object (call.VarlenCall) to the family's
declared adapter (families.py: ``adapter``; fa2.forward, fa3.forward, fa4.forward), which
maps it onto its kernels and refuses what only that family cannot run.
``get_scheduler_metadata`` is the adapter's of the family declaring scheduler_metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import torch

from .build_info import ComponentInfo
from .call import VARLEN, VarlenCall
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
_new = tuple.__new__

#: FA version -> the torch.ops namespace of its compiled module (tests/gpu/test_sparse_gpu.py
#: reads it here), from the family declaration.
OP_NAMESPACES = {f.version: f.op_namespace for f in registry() if f.compiled}


# version -> the forward op overload of a compiled family (None: a family whose adapter reaches
# its kernels itself, FA4), looked up once per kind of call: torch.ops attribute lookups cost
# microseconds on every call.
_forward_ops: dict = {}
on_environment_change(_forward_ops.clear)


def _forward_op(family: Family):
    if family.version not in _forward_ops:
        _forward_ops[family.version] = (getattr(_ops(family.version), family.forward_op).default
                                        if family.compiled else None)
    return _forward_ops[family.version]


def _device_index(tensor: torch.Tensor) -> int:
    index, problem = resolve_device_index(tensor.device)
    if problem is not None:
        raise FlashAttnUnavailableError(problem)
    return index


class ResolutionKey(NamedTuple):
    """A kind of call: what its resolution (the family, and whether its calls may take the
    quick check) depends on. Built on every call (with tuple.__new__, no __new__ frame)."""

    fa_version: Optional[int]      # as the caller named it; None: the selector chooses
    device: int                    # q.get_device()
    env_version: Optional[str]     # VLLM_FLASH_ATTN_VERSION, read only when the selector chooses
    alibi: bool                    # alibi_slopes given (the selector falls back to FA2)
    sinks: bool                    # s_aux given
    dtype: object                  # q.dtype
    num_heads: Optional[int]       # None: q/k/v are not tensors of enough dims (the full check says so)
    head_size: Optional[int]
    num_heads_k: Optional[int]
    head_size_v: Optional[int]
    needs: int                     # the kernel features the call needs, bits of _NEEDS


class Resolved(NamedTuple):
    """The resolution of a kind of call, _resolved's value; what the adapter is handed."""

    family: Family
    comp: Optional[ComponentInfo]  # its build record; None: a family without one (FA4)
    op: object                     # a compiled family's forward op; None: the adapter reaches its kernels
    forward: Callable              # the family's adapter: forward(resolved, call, window, fp8)
    static: bool                   # validation.static_verdict: its calls may take the quick check
    debug: bool                    # VFA_DEBUG_CHECKS
    capture_guard: bool            # ask whether the stream is capturing (see _refuse_capture)


# One dictionary lookup per call: asking the selector costs microseconds on every layer of
# every step, and the answer does not change within one environment.
_resolved: dict = {}
on_environment_change(_resolved.clear)

# Bits of ResolutionKey.needs: the kernel features a call needs (the selector falls back to
# FA2 when this wheel's FA3 lacks one that FA2 has; the quick check's verdict depends on them).
_NEEDS = ((1, "paged"), (2, "softcap"), (4, "local"), (8, "split"))
_NO_WINDOW = (-1, -1)


def _resolve(key: ResolutionKey, tensor: torch.Tensor) -> Resolved:
    """Fill _resolved[key]: the registry, the selector and the build record asked once."""
    features = tuple(name for bit, name in _NEEDS if key.needs & bit)
    family = _resolve_family(key.fa_version, tensor, requires_alibi=key.alibi, head_size=key.head_size,
                             head_size_v=key.head_size_v, has_sinks=key.sinks, dtype=key.dtype,
                             features=features)
    comp = _component(family.version) if family.record_key is not None else None
    static = isinstance(key.num_heads, int) and static_verdict(
        family, comp, key.dtype, key.num_heads, key.head_size, key.num_heads_k, key.head_size_v,
        *(bool(key.needs & bit) for bit, _ in _NEEDS))
    debug = debug_checks_enabled()
    hit = _resolved[key] = Resolved(family, comp, _forward_op(family), family.adapter_function(), static, debug,
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


def _refuse_version(fa_version) -> None:
    families = registry()
    raise FlashAttnInputError(f"fa_version must be {', '.join(map(str, families.versions))} or None (let the "
                              f"selector choose), got {fa_version!r}")


def _resolve_family(fa_version, tensor: torch.Tensor, **traits) -> Family:
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
        return registry()[selection.version]
    family = registry().get(fa_version)
    if family is None:
        _refuse_version(fa_version)
    problem = version_problem(family.version, _device_index(tensor))
    if problem is not None:
        raise FlashAttnUnavailableError(f"fa_version={family.version} cannot run here: {problem}")
    return family


def _dispatch(call: VarlenCall):
    """flash_attn_varlen_func's body (the function itself is generated from call.VARLEN)."""
    q = call.q
    if not isinstance(q, torch.Tensor):
        raise FlashAttnTypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    fa_version = call.fa_version
    if fa_version is not None and type(fa_version) is not int:
        # A tensor would compare equal to 3 elementwise, a list is unhashable, a bool an int:
        # only a plain int names a version.
        _refuse_version(fa_version)
    env = current_environment()
    device = q.get_device()  # -1 unless a CUDA tensor
    if device < 0 or env.device_type != "cuda":
        if q.is_cuda != (env.device_type == "cuda"):
            check_q_device(q, env.device_type)  # raises before the selector looks at q.device
    window_size, causal = call.window_size, call.causal
    window = _NO_WINDOW if window_size is None else window_tuple(window_size)
    k, v = call.k, call.v
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
    # The kernel features the call needs (_NEEDS): part of the key, as the selector's answer
    # and the quick check's verdict depend on them.
    needs = 1 if call.block_table is not None else 0
    if (window[0] >= 0 or window[1] >= 0) and _is_local(window, causal):
        needs |= 4
    try:
        if call.softcap > 0:
            needs |= 2
        if call.num_splits > 1:
            needs |= 8
    except (TypeError, RuntimeError):  # not numbers: validation says so
        pass
    alibi, sinks = call.alibi_slopes is not None, call.s_aux is not None
    key = _new(ResolutionKey, (fa_version, device, env.getenv(ENV_VAR) if fa_version is None else None, alibi,
                               sinks, dtype, num_heads, head_size, num_heads_k, head_size_v, needs))
    resolved = _resolved.get(key) or _resolve(key, q)
    if resolved.capture_guard:
        _refuse_capture(resolved, q)
    # Like upstream: a q/k/v whose last dim is strided is copied (the kernels need stride
    # 1). is_contiguous() first: it is a third of the cost of stride(-1).
    if ((not q.is_contiguous() and q.stride(-1) != 1)
            or (isinstance(k, torch.Tensor) and not k.is_contiguous() and k.stride(-1) != 1)
            or (isinstance(v, torch.Tensor) and not v.is_contiguous() and v.stride(-1) != 1)):
        call = dataclasses.replace(call, q=maybe_contiguous(q), k=maybe_contiguous(k) if isinstance(k, torch.Tensor) else k,
                             v=maybe_contiguous(v) if isinstance(v, torch.Tensor) else v)
        q = call.q
    # The common call shapes take the quick check (validation.py); the others, and every
    # call it does not accept, the full one, which raises with the precise message.
    family, comp = resolved.family, resolved.comp
    if resolved.static and quick_check_varlen_call(family, comp, device, q_shape, v_shape, dtype, call, window,
                                                   True, k_shape):
        # It accepts exact ints only (and cp_world_size 1, cp_rank 0): nothing to convert.
        fp8 = dtype is _E4M3
    else:
        fp8 = check_varlen_call(family, comp, env.device_type, call, window).fp8
        # Integral scalars as the plain ints the kernels' schemas take (a rare path).
        call = dataclasses.replace(call, max_seqlen_q=int(call.max_seqlen_q), max_seqlen_k=int(call.max_seqlen_k),
                             num_splits=int(call.num_splits), cp_world_size=int(call.cp_world_size),
                             cp_rank=int(call.cp_rank))
    if resolved.debug:
        run_debug_checks(q=q, k=call.k, cu_seqlens_q=call.cu_seqlens_q, cu_seqlens_k=call.cu_seqlens_k,
                         seqused_k=call.seqused_k, block_table=call.block_table,
                         max_seqlen_q=call.max_seqlen_q, max_seqlen_k=call.max_seqlen_k)
    out, softmax_lse = resolved.forward(resolved, call, window, fp8)
    return (out, softmax_lse) if call.return_softmax_lse else out


flash_attn_varlen_func = VARLEN.function(_dispatch, __name__, """\
Variable-length (and paged-KV) attention forward; see docs/runtime.md.

q: (total_q, num_heads, head_size); k, v: (total_k, num_heads_k, head_size) with
cu_seqlens_k, or (num_blocks, block_size, num_heads_k, head_size) with block_table +
seqused_k. GQA/MQA when num_heads is a multiple of num_heads_k. Returns out, or
(out, softmax_lse) with return_softmax_lse=True. fa_version=None lets the selector
choose; FP8 (float8_e4m3fn q/k/v, bf16 out, float32 descales of shape
(num_seqs, num_kv_heads)) needs FA3 on Hopper. ``deterministic`` and
``return_attn_probs`` are accepted for compatibility and have no effect (forward only).
""")
