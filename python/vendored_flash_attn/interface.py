"""The attention entry points: ``flash_attn_varlen_func`` and ``get_scheduler_metadata``.

Call-compatible with vLLM's ``vllm_flash_attn`` functions of the same names (same
parameters, order and defaults: ``flash_attn_varlen_func`` is generated from the one table
of them, call/arguments.py), except that ``fa_version=None`` asks the selector. Each call: resolve
its kind (family, build record, op, adapter) once per kind, check it with the shared checks
against the family's declaration, and hand it to the family's adapter, which maps it onto
its kernels and refuses what only that family cannot run. Two paths do that:

* the **quick path** (``_quick``), which the common calls of a serving engine take on every
  layer of every step: inlined in the generated public function (call.Declared.function), it
  runs on that function's own locals, in its frame, finds the call's kind
  already resolved, checks the call with flat metadata reads (a conservative subset of the
  shared checks: it only accepts, never refuses), and calls the adapter's ``launch``
  (call.LAUNCH_PARAMETERS, the call written out by call.with_launch) with the arguments as
  they are. No call object, no second set of rules;
* the **full path** (``_dispatch``) for everything it declines: the call object
  (call.VarlenCall), the resolution (which may refuse), the shared checks
  (validation.check_varlen_call, which refuse with the precise message), the debug checks
  and the capture refusal, then the family's declared adapter (families.py: ``adapter``;
  fa2.forward, fa3.forward, fa4.forward), which launches it the same way.

``get_scheduler_metadata`` is generated the same way (call.SCHEDULER_METADATA) and hands its
call object to the ``scheduler_metadata`` entry of the adapter of the family that declares the
``scheduler_metadata`` feature (FA3's today); no adapter is named here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import torch

from .declaration.build_info import ComponentInfo
from .call.arguments import SCHEDULER_METADATA, VARLEN, SchedulerMetadataCall, VarlenCall, launch, with_launch
from .call.arguments import maybe_contiguous  # noqa: F401  (the package's API, as upstream's file has it)
from .selection.compiled import component as _component, ops as _ops
from .call.debug_checks import DEBUG_ENV, debug_checks_enabled, run_debug_checks
from .selection.environment import current_environment, on_environment_change
from .errors import (FlashAttnCaptureError, FlashAttnInputError, FlashAttnTypeError,
                     FlashAttnUnavailableError)
from .declaration.families import Family, registry, titles_text
from .declaration.kernels import dtype_name
from .selection.selector import ENV_VAR, resolve_device_index, select_flash_attn_version, version_problem
from .call.validation import _is_local, check_q_device, check_varlen_call, static_verdict, window_tuple

_Tensor = torch.Tensor
_INT32, _FLOAT32, _BF16, _E4M3 = torch.int32, torch.float32, torch.bfloat16, torch.float8_e4m3fn

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
    quick path) depends on. Both paths build it by field name; in the quick path
    call.with_launch writes it out as the plain tuple of these fields (equal, and hashed
    alike), without the named tuple's constructor on every call."""

    fa_version: Optional[int]      # as the caller named it; None: the selector chooses
    device: int                    # q.get_device()
    env_version: object            # VLLM_FLASH_ATTN_VERSION as getenv_lookup answers (only when the selector chooses)
    alibi: bool                    # alibi_slopes given (the selector falls back to FA2)
    sinks: bool                    # s_aux given
    dtype: object                  # q.dtype
    num_heads: Optional[int]       # None: q/k/v are not tensors of enough dims (the full check says so)
    head_size: Optional[int]
    num_heads_k: Optional[int]
    head_size_v: Optional[int]
    needs: int                     # the kernel features the call needs, bits of _NEEDS


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """The resolution of a kind of call, _resolved's value; what the adapter is handed. (A
    slotted class: the quick path reads its fields on every call, and a slot is read in half
    the time of a named tuple's field.)"""

    family: Family
    comp: Optional[ComponentInfo]  # its build record; None: a family without one (FA4)
    op: object                     # a compiled family's forward op; None: the adapter reaches its kernels
    forward: Callable              # the family's adapter: forward(resolved, call, window, fp8)
    static: bool                   # validation.static_verdict: its calls may take the quick path
    debug: bool                    # VFA_DEBUG_CHECKS
    capture_guard: bool            # ask whether the stream is capturing (see _refuse_capture)
    # The quick path's: the adapter's launch(resolved, *call.LAUNCH) (None: it has none), and
    # whether the quick path may take this kind's calls at all: static, a launch, and nothing
    # asked per call (no capture guard, no debug checks). What of the family's declaration it
    # reads per call, here rather than two attribute hops away:
    launch: Optional[Callable]
    quick: bool
    page_size_multiple: int        # family.call's
    max_num_splits: int            # family.call's; 0: no limit (its split feature is in `static`)
    takes_scheduler_metadata: bool  # the family declares the feature


# One dictionary lookup per call: asking the selector costs microseconds on every layer of
# every step, and the answer does not change within one environment. Bounded like the
# package's other caches (fa4._ACCEPTED, kernels' head-size verdicts): a caller cycling
# through odd shapes (a fuzzer) must not grow it without end; a serving engine has a handful
# of kinds.
_resolved: dict = {}
_RESOLVED_MAX = 4096
on_environment_change(_resolved.clear)

# Bits of ResolutionKey.needs: the kernel features a call needs (the selector falls back to
# FA2 when this wheel's FA3 lacks one that FA2 has; whether the quick path may take a call
# depends on them).
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
    guard = debug or not family.call.cuda_graphs
    forward = family.adapter_function()
    launch = getattr(forward, "launch", None)
    if len(_resolved) >= _RESOLVED_MAX:
        _resolved.clear()
    hit = _resolved[key] = Resolved(
        family, comp, _forward_op(family), forward, static, debug, guard, launch,
        static and launch is not None and not guard, family.call.page_size_multiple,
        family.call.max_num_splits or 0, "scheduler_metadata" in family.features)
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
    """The full path: flash_attn_varlen_func's body for every call the quick path declines."""
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
    # and whether the quick path may take such calls depend on them.
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
    env_version = _version_lookup(_version_key) if fa_version is None else None
    key = ResolutionKey(fa_version=fa_version, device=device, env_version=env_version, alibi=alibi, sinks=sinks,
                        dtype=dtype, num_heads=num_heads, head_size=head_size, num_heads_k=num_heads_k,
                        head_size_v=head_size_v, needs=needs)
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
    family, comp = resolved.family, resolved.comp
    fp8 = check_varlen_call(family, comp, env.device_type, call, window).fp8
    # Integral scalars as the plain ints the kernels' schemas take.
    call = dataclasses.replace(call, max_seqlen_q=int(call.max_seqlen_q), max_seqlen_k=int(call.max_seqlen_k),
                               num_splits=int(call.num_splits), cp_world_size=int(call.cp_world_size),
                               cp_rank=int(call.cp_rank))
    if resolved.debug:
        run_debug_checks(q=q, k=call.k, cu_seqlens_q=call.cu_seqlens_q, cu_seqlens_k=call.cu_seqlens_k,
                         seqused_k=call.seqused_k, block_table=call.block_table,
                         max_seqlen_q=call.max_seqlen_q, max_seqlen_k=call.max_seqlen_k)
    out, softmax_lse = resolved.forward(resolved, call, window, fp8)
    return (out, softmax_lse) if call.return_softmax_lse else out


# --- the quick path ------------------------------------------------------------------------
#
# What a call reads of the environment, kept here and refreshed when it is swapped (asking
# current_environment() for it costs a call and attribute reads per call). The version
# override as Environment.getenv_lookup reads it: ResolutionKey.env_version on both paths.
_version_lookup, _version_key = current_environment().getenv_lookup(ENV_VAR)
_cuda_runtime = current_environment().device_type == "cuda"
_cpu_runtime = current_environment().device_type == "cpu"  # a described machine's (tests)


def _environment_swapped() -> None:
    global _version_lookup, _version_key, _cuda_runtime, _cpu_runtime
    env = current_environment()
    _version_lookup, _version_key = env.getenv_lookup(ENV_VAR)
    _cuda_runtime, _cpu_runtime = env.device_type == "cuda", env.device_type == "cpu"


on_environment_change(_environment_swapped)
_get_device = torch.Tensor.get_device


def _quick(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k, seqused_k, q_v, dropout_p,
           softmax_scale, causal, window_size, softcap, alibi_slopes, block_table, return_softmax_lse, out,
           scheduler_metadata, q_descale, k_descale, v_descale, num_splits, fa_version, s_aux, cp_world_size,
           cp_rank, cp_tot_seqused_k):
    """The quick path: the result of a common call, or None to decline it (the full path,
    _dispatch, then takes it, and refuses it if it is wrong). call.VARLEN's generated
    function runs this code inline on its own arguments (call.Declared.function; a return
    None there goes on to the full path); it stays a function for tests and readers.

    A conservative subset of the shared checks (validation.check_varlen_call), on flat
    metadata reads, each tensor's read once: the two call shapes serving engines make on
    every layer (packed varlen, paged KV) of a kind of call the full path has resolved and
    found static_verdict-clean, with the arguments of what only some families take unset,
    exact ints and floats as the kernels take them, every tensor on q's device. It never
    refuses (a call it does not accept goes to the full path, whose messages and verdicts
    stay the only ones) and never accepts what the full path refuses
    (tests/unit/test_quick_check.py holds it to that on a corpus of broken calls, and
    tests/unit/test_quick_equals_full.py on a seeded random one). What it
    does not ask per call: the stream's capture state and the debug checks (a kind of call
    that needs either is not quick: Resolved.quick).

    Nothing is left to the compiled ops' own argument checks: their messages name C++
    internals, and a module linked with a private static libstdc++ died on a failing
    STD_TORCH_CHECK (SIGSEGV) instead of raising - found by tests/gpu/test_bad_input.py when
    the quick check once relied on them; cmake/CxxRuntime.cmake now refuses such a compiler.
    The one check left to an op is scheduler_metadata's size for a tensor
    get_scheduler_metadata did not return (scheduler_metadata.op_error), which Python cannot
    know."""
    # The scalars: what only unusual calls set at their defaults, the rest of exact types
    # (nothing to convert, and no tensor whose comparison would read the device).
    if (type(q) is not _Tensor or q_v is not None or alibi_slopes is not None or s_aux is not None
            or cp_tot_seqused_k is not None or type(cp_world_size) is not int or cp_world_size != 1
            or type(cp_rank) is not int or cp_rank != 0 or type(dropout_p) is not float or dropout_p != 0.0
            or type(max_seqlen_q) is not int or max_seqlen_q < 0 or type(max_seqlen_k) is not int
            or max_seqlen_k < 0 or type(num_splits) is not int or num_splits < 0
            or (causal is not True and causal is not False)
            or (return_softmax_lse is not True and return_softmax_lse is not False)
            or (softmax_scale is not None and type(softmax_scale) is not float)
            or (fa_version is not None and type(fa_version) is not int)):
        return None
    cap = softcap
    if type(cap) is not float:
        if type(cap) is not int:
            return None
        cap = float(cap)  # vLLM passes 0 for "off"; the ops take a float
    if cap < 0:
        return None
    if window_size is None:
        left = right = -1
    elif (type(window_size) is tuple or type(window_size) is list) and len(window_size) == 2:
        left, right = window_size
        if type(left) is not int or type(right) is not int:
            return None
    else:
        return None
    try:
        q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
        total_q, num_heads, head_size = q_shape  # ValueError unless 3-D
        num_heads_k, head_size_v = k_shape[-2], v_shape[-1]
        device = q.get_device()  # -1 unless a CUDA tensor
        dtype = q.dtype
        # The kind of call (ResolutionKey, as a plain tuple); what it needs of the kernels:
        # bits of _NEEDS.
        needs = 0 if block_table is None else 1
        if cap > 0:
            needs |= 2
        if (left >= 0 or right >= 0) and _is_local((left, right), causal):
            needs |= 4
        if num_splits > 1:
            needs |= 8
        resolved = _resolved.get(ResolutionKey(  # a plain tuple here (call.with_launch writes it out)
            fa_version=fa_version, device=device,
            env_version=None if fa_version is not None else _version_lookup(_version_key), alibi=False, sinks=False,
            dtype=dtype, num_heads=num_heads, head_size=head_size, num_heads_k=num_heads_k, head_size_v=head_size_v,
            needs=needs))
        if resolved is None or not resolved.quick:
            return None  # the full path resolves it (the next such call is quick) or refuses it
        if k.dtype is not dtype or v.dtype is not dtype:
            return None
        # Every tensor on q's device, q on the runtime's device type. On a CUDA runtime, by
        # index and type: another device type (XPU, a private one) numbers its devices from 0
        # too, and the full check compares torch.device objects (type and index).
        if device >= 0:  # q is a tensor of an indexed device
            if not _cuda_runtime or not q.is_cuda:
                return None
            if (_get_device(k) != device or not k.is_cuda or _get_device(v) != device or not v.is_cuda
                    or _get_device(cu_seqlens_q) != device or not cu_seqlens_q.is_cuda
                    or (cu_seqlens_k is not None and (_get_device(cu_seqlens_k) != device or not cu_seqlens_k.is_cuda))
                    or (seqused_k is not None and (_get_device(seqused_k) != device or not seqused_k.is_cuda))
                    or (block_table is not None and (_get_device(block_table) != device or not block_table.is_cuda))
                    or (out is not None and (_get_device(out) != device or not out.is_cuda))
                    or (scheduler_metadata is not None
                        and (_get_device(scheduler_metadata) != device or not scheduler_metadata.is_cuda))
                    or (q_descale is not None and (_get_device(q_descale) != device or not q_descale.is_cuda))
                    or (k_descale is not None and (_get_device(k_descale) != device or not k_descale.is_cuda))
                    or (v_descale is not None and (_get_device(v_descale) != device or not v_descale.is_cuda))):
                return None
        elif _cpu_runtime and q.is_cpu:  # a described CPU machine (the tests): get_device() is
            # -1 for cpu and meta tensors alike
            if (not k.is_cpu or not v.is_cpu or not cu_seqlens_q.is_cpu
                    or (cu_seqlens_k is not None and not cu_seqlens_k.is_cpu)
                    or (seqused_k is not None and not seqused_k.is_cpu)
                    or (block_table is not None and not block_table.is_cpu)
                    or (out is not None and not out.is_cpu)
                    or (scheduler_metadata is not None and not scheduler_metadata.is_cpu)
                    or (q_descale is not None and not q_descale.is_cpu)
                    or (k_descale is not None and not k_descale.is_cpu)
                    or (v_descale is not None and not v_descale.is_cpu)):
                return None
        else:
            return None
        (batch_plus_1,) = cu_seqlens_q.shape  # ValueError unless 1-D
        batch = batch_plus_1 - 1
        if batch < 1 or cu_seqlens_q.dtype is not _INT32 or not cu_seqlens_q.is_contiguous():
            return None
        # No query tokens or no heads: the full path's (is_contiguous() below holds for an out=
        # of no elements whatever its strides, and the full check reads out's stride itself).
        if not total_q or not num_heads or not num_heads_k:
            return None
        # k and v agree in all but the last dimension (one comparison when the head sizes
        # match, the common case).
        if k_shape != v_shape and (len(k_shape) != len(v_shape) or k_shape[:-1] != v_shape[:-1]):
            return None
        if block_table is not None:  # paged
            if cu_seqlens_k is not None or seqused_k is None:
                return None
            _, block_size, _, head_size_k = k_shape  # ValueError unless 4-D
            (used,) = seqused_k.shape
            rows, columns = block_table.shape
            if (used != batch or seqused_k.dtype is not _INT32 or not seqused_k.is_contiguous()
                    or block_table.dtype is not _INT32 or rows != batch or not block_size
                    # The full check reads stride(-1); is_contiguous() (a third of its cost)
                    # answers it only for a table of more than one column: it ignores a
                    # dimension of size 1 and the strides of a table of no elements.
                    or ((columns <= 1 or not block_table.is_contiguous()) and block_table.stride(-1) != 1)
                    or block_size % resolved.page_size_multiple):
                return None
        else:  # packed
            if cu_seqlens_k is None or seqused_k is not None:
                return None
            _, _, head_size_k = k_shape  # ValueError unless 3-D
            (k_offsets,) = cu_seqlens_k.shape
            if (k_offsets != batch_plus_1 or cu_seqlens_k.dtype is not _INT32
                    or not cu_seqlens_k.is_contiguous()):
                return None
        if head_size_k != head_size:
            return None
        fp8 = dtype is _E4M3
        if out is not None and (out.dtype is not (_BF16 if fp8 else dtype)
                                or out.shape != (total_q, num_heads, head_size_v)
                                or (not out.is_contiguous() and out.stride(-1) != 1)):
            return None
        if fp8 and (q_descale is not None or k_descale is not None or v_descale is not None):
            for d in (q_descale, k_descale, v_descale):
                if d is not None and (d.dtype is not _FLOAT32 or d.shape != (batch, num_heads_k)):
                    return None
        if num_splits > 1 and resolved.max_num_splits and num_splits > resolved.max_num_splits:
            return None
        if scheduler_metadata is not None and (
                not resolved.takes_scheduler_metadata or scheduler_metadata.dtype is not _INT32
                or scheduler_metadata.dim() != 1 or not scheduler_metadata.is_contiguous()):
            return None
        # A q/k/v whose last dim is strided: the full path copies it, as upstream does.
        if ((not q.is_contiguous() and q.stride(-1) != 1) or (not k.is_contiguous() and k.stride(-1) != 1)
                or (not v.is_contiguous() and v.stride(-1) != 1)):
            return None
    except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
        return None  # not tensors, odd types or shapes: the full path explains
    # The adapter's launch: call.with_launch writes this call out in the launch contract's
    # order (call.LAUNCH_PARAMETERS), with the computed arguments named here and this
    # function's parameters (the caller's arguments) for the rest.
    result = launch(resolved, softmax_scale=head_size ** -0.5 if softmax_scale is None else softmax_scale,
                    window_left=left, window_right=right, softcap=cap, fp8=fp8)
    return (result[0], result[1]) if return_softmax_lse else result[0]


_quick = with_launch(_quick, tuples={"ResolutionKey": ResolutionKey._fields})
flash_attn_varlen_func = VARLEN.function(_dispatch, __name__, """\
Variable-length (and paged-KV) attention forward; see docs/runtime.md.

q: (total_q, num_heads, head_size); k, v: (total_k, num_heads_k, head_size) with
cu_seqlens_k, or (num_blocks, block_size, num_heads_k, head_size) with block_table +
seqused_k. GQA/MQA when num_heads is a multiple of num_heads_k. Returns out, or
(out, softmax_lse) with return_softmax_lse=True. fa_version=None lets the selector
choose; FP8 (float8_e4m3fn q/k/v, bf16 out, float32 descales of shape
(num_seqs, num_kv_heads)) needs FA3 on Hopper. ``deterministic`` and
``return_attn_probs`` are accepted for compatibility and have no effect (forward only).
""", quick=_quick)


def _scheduler_metadata(call: SchedulerMetadataCall):
    """get_scheduler_metadata's body: the call, to the family that declares the
    scheduler_metadata feature (its adapter's ``scheduler_metadata(family, call)``)."""
    having = registry().having("scheduler_metadata")
    if not having:
        raise FlashAttnUnavailableError("get_scheduler_metadata: no family of this package declares "
                                        "scheduler_metadata (cmake/knobs.json); pass scheduler_metadata=None")
    family = having[0]
    return family.adapter_function().scheduler_metadata(family, call)


get_scheduler_metadata = SCHEDULER_METADATA.function(_scheduler_metadata, __name__, """\
Scheduler metadata for a later ``flash_attn_varlen_func(..., scheduler_metadata=)``, computed by
the family that declares it (FA3); see docs/runtime.md.

It holds the schedule of exactly one call shape; the returned tensor remembers the arguments,
and a call that passes it is refused when the kernels would schedule that call differently.
""")
