"""Argument checks for ``flash_attn_varlen_func``, run before any kernel.

The C++ ops check most of this too, but a failed check there comes late (after
allocations, sometimes after a kernel), reads worse, and some mistakes it does not
catch at all (FA3 silently ignores several arguments). Everything here reads tensor
metadata only: no ``.item()``, no reductions, no device sync. The expensive checks
(index ranges, monotonic offsets) run only when ``VFA_DEBUG_CHECKS=1``
(see ``debug_checks``). The interface's quick path (interface._quick) accepts the common
calls on a subset of these rules without refusing any; everything else comes here.

One set of checks for every family: what differs between families is read off their
declaration (families.py: dtypes, features, ``call``) and their build record, never off
a version number. A family's adapter refuses only what is its own beyond that (fa4/adapter.py).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional

import torch

from ..declaration.build_info import ComponentInfo
from .arguments import VarlenCall
from ..errors import FlashAttnInputError, FlashAttnTypeError
from ..declaration.families import Family, registry, titles_text, versions_text
from ..declaration.kernels import dtype_name, dtype_problem, feature_problem, head_size_problem


_E4M3 = torch.float8_e4m3fn


class CallShape(NamedTuple):
    """What the checks learned about a call; the dispatcher uses it. (A NamedTuple:
    built on every call, and a frozen dataclass costs a microsecond to construct.)"""

    batch: int
    num_heads: int
    num_heads_k: int
    head_size: int
    head_size_v: int
    paged: bool
    fp8: bool


def _fail(message: str) -> None:
    raise FlashAttnInputError(message)


def _tensor(name: str, x, optional: bool = False) -> None:
    if x is None and optional:
        return
    if not isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def _integer(name: str, x, minimum: int = 0) -> int:
    if isinstance(x, torch.Tensor):
        raise FlashAttnTypeError(
            f"{name} must be a Python int, got a tensor; convert it once on the host "
            "(reading a GPU tensor here would sync the device on every call)")
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise FlashAttnTypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < minimum:
        _fail(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def _same_device(name: str, x, q) -> None:
    if x is not None and x.device != q.device:
        _fail(f"{name} is on {x.device} but q is on {q.device}; all tensors of a call must be "
              "on the same device")


def _index_tensor(name: str, x, q, shape: Optional[tuple] = None, dims: int = 1) -> None:
    """int32 index tensors: cu_seqlens_*, seqused_k, block_table, scheduler_metadata."""
    _tensor(name, x)
    _same_device(name, x, q)
    if x.dtype != torch.int32:
        raise FlashAttnTypeError(f"{name} must have dtype torch.int32, got {x.dtype}; "
                                 f"convert it with {name}.to(torch.int32)")
    if x.dim() != dims:
        _fail(f"{name} must be {dims}-D, got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        _fail(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if dims == 1 and not x.is_contiguous():
        _fail(f"{name} must be contiguous; pass {name}.contiguous()")
    if dims == 2 and x.stride(-1) != 1:
        _fail(f"{name} must have a contiguous last dimension (stride 1); pass {name}.contiguous()")


def check_same_dtype(q, k, v) -> None:
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise FlashAttnTypeError(f"{name} has dtype {x.dtype} but q has {q.dtype}; q, k and v "
                                     "must have the same dtype")


def check_heads(q, k) -> None:
    """q and k: (..., heads, head size). Same head size; GQA/MQA head ratio."""
    num_heads, head_size = q.shape[-2], q.shape[-1]
    num_heads_k = k.shape[-2]
    if k.shape[-1] != head_size:
        _fail(f"k has head size {k.shape[-1]} but q has {head_size}; they must match")
    if num_heads_k == 0 or num_heads % num_heads_k:
        _fail(f"q has {num_heads} heads and k/v have {num_heads_k}; the number of q heads must be "
              "a multiple of the number of k/v heads (GQA/MQA)")


def check_out(out, dtype, shape: tuple, fp8: bool = False) -> None:
    """The output buffer is written in place, so it is never silently copied or cast:
    exactly ``dtype`` and ``shape``, and a unit last stride."""
    if out.dtype != dtype:
        raise FlashAttnTypeError(f"out has dtype {out.dtype}; it must be {dtype}"
                                 + (" (FP8 attention writes bf16)" if fp8 else " like q"))
    if tuple(out.shape) != shape:
        _fail(f"out must have shape {shape}, got {tuple(out.shape)}")
    if out.stride(-1) != 1:
        _fail("out must have a contiguous last dimension (stride 1)")


def check_q_device(q, device_type: str) -> None:
    if q.device.type != device_type:
        _fail(f"q is on {q.device}, but FlashAttention runs on {device_type.upper()} devices; move "
              f"q, k, v and the index tensors to the GPU (e.g. q.to('{device_type}'))")


def window_tuple(window_size) -> tuple[int, int]:
    """vLLM's window_size (None, or (left, right) with -1 = unbounded) as a tuple of ints."""
    if window_size is None:
        return (-1, -1)
    if len(window_size) != 2:
        raise FlashAttnInputError(f"window_size must be (left, right), got {window_size!r}")
    return (int(window_size[0]), int(window_size[1]))


# What a call asks for that only some families declare (the family declaration's
# features), and the refusal when the family at hand does not: {title} is that family,
# {having} / {versions} the families that declare the feature.
_REFUSALS = {
    "alibi": "ALiBi (alibi_slopes) is not supported by {title}; pass fa_version={versions} or leave "
             "fa_version=None so the selector picks {having}",
    "sinks": "s_aux (attention sinks) needs {having}; {title} has no sinks support",
    "q_v": "q_v needs {having}; {title} does not support it",
    "split": "{title} does not take num_splits > 1 (got {num_splits}); pass 0 for its heuristic",
    "scheduler_metadata": "scheduler_metadata comes from get_scheduler_metadata and is {having}-only; "
                          "pass None with {title}",
    "context_parallel": "context parallelism (cp_world_size > 1) needs {having}",
}


def _refuse_undeclared(family: Family, *, alibi_slopes, s_aux, q_v, num_splits, scheduler_metadata,
                       cp_world_size, cp_tot_seqused_k) -> None:
    asked = (("alibi", alibi_slopes is not None), ("sinks", s_aux is not None), ("q_v", q_v is not None),
             ("split", num_splits > 1), ("scheduler_metadata", scheduler_metadata is not None),
             ("context_parallel", cp_world_size != 1 or cp_tot_seqused_k is not None))
    for feature, on in asked:
        if on and feature not in family.features:
            having = registry().having(feature)
            _fail(_REFUSALS[feature].format(title=family.title, having=titles_text(having),
                                            versions=versions_text(having), num_splits=num_splits))


def check_varlen_call(family: Family, comp: Optional[ComponentInfo], device_type: str, call: VarlenCall,
                      window: tuple[int, int]) -> CallShape:
    """Raise FlashAttnInputError/FlashAttnTypeError for anything ``family`` cannot run, as
    its declaration says (dtypes, features, ``call``) and, for a family whose build selects
    kernels, as its build record ``comp`` says (None: a family that selects none). The same
    checks for every family; what one family refuses beyond these is its adapter's.
    ``window``: window_tuple(call.window_size), which the caller has computed.

    The steps below run in this order and the first refusal is the message, so a call that is
    wrong in two ways is always refused for the same one."""
    q = call.q
    _check_tensors_on_one_device(call, device_type)
    qname, fp8, kv_fp8 = _check_dtypes(family, comp, call)
    paged = _check_kv_layout(family, call)
    total_q, batch, num_heads, head_size, num_heads_k, head_size_v = _check_shapes(family, comp, call, paged, qname)
    _check_kv_index_tensors(family, comp, call, paged, batch)
    _integer("max_seqlen_q", call.max_seqlen_q)
    _integer("max_seqlen_k", call.max_seqlen_k)
    if call.out is not None:
        check_out(call.out, torch.bfloat16 if fp8 else q.dtype, (total_q, num_heads, head_size_v), fp8=fp8)
    num_splits, cp_world_size, cp_rank = _check_scalar_options(call)
    _check_features(family, comp, call, window, num_splits, cp_world_size)

    # The arguments of the features it has (each step only when its argument is given).
    if call.alibi_slopes is not None:
        _check_alibi_slopes(call.alibi_slopes, batch, num_heads)
    if call.scheduler_metadata is not None:
        _index_tensor("scheduler_metadata", call.scheduler_metadata, q)
    if fp8 or kv_fp8:
        _check_descales(call, batch, num_heads_k)
    if call.s_aux is not None:
        _check_sinks(family, call.s_aux, num_heads, head_size, head_size_v)
    if call.q_v is not None:
        _check_q_v(call, fp8, total_q, num_heads, head_size, head_size_v)
    if cp_world_size != 1 or cp_rank != 0 or call.cp_tot_seqused_k is not None:
        _check_context_parallel(call, window, cp_world_size, cp_rank, batch)
    return CallShape(batch, num_heads, num_heads_k, head_size, head_size_v, paged, fp8)


def _check_tensors_on_one_device(call: VarlenCall, device_type: str) -> None:
    """q, k, v and cu_seqlens_q are tensors and each optional tensor argument is one or None;
    then the device: q's is of ``device_type``, every other tensor is on q's."""
    q = call.q
    for name, x in (("q", q), ("k", call.k), ("v", call.v), ("cu_seqlens_q", call.cu_seqlens_q)):
        _tensor(name, x)
    optional = (("cu_seqlens_k", call.cu_seqlens_k), ("seqused_k", call.seqused_k), ("q_v", call.q_v),
                ("alibi_slopes", call.alibi_slopes), ("block_table", call.block_table), ("out", call.out),
                ("scheduler_metadata", call.scheduler_metadata), ("q_descale", call.q_descale),
                ("k_descale", call.k_descale), ("v_descale", call.v_descale), ("s_aux", call.s_aux),
                ("cp_tot_seqused_k", call.cp_tot_seqused_k))
    for name, x in optional:
        _tensor(name, x, optional=True)
    check_q_device(q, device_type)
    for name, x in (("k", call.k), ("v", call.v)) + optional:
        _same_device(name, x, q)


def _check_dtypes(family: Family, comp: Optional[ComponentInfo], call: VarlenCall) -> tuple:
    """q's dtype is one of the family's (and built); k and v have q's, or are FP8 under a
    16-bit q where the family declares fp8_kv. Returns (q's dtype name, fp8, kv_fp8)."""
    q, k, v = call.q, call.k, call.v
    qname = dtype_name(q.dtype)
    problem = dtype_problem(family, comp, qname, shown=str(q.dtype).replace("torch.", ""))
    if problem:
        raise FlashAttnTypeError(f"q: {problem}")
    fp8 = qname == "e4m3"
    kv_fp8 = not fp8 and "fp8_kv" in family.features and k.dtype == v.dtype == _E4M3
    if not kv_fp8:
        check_same_dtype(q, k, v)
    return qname, fp8, kv_fp8


def _check_kv_layout(family: Family, call: VarlenCall) -> bool:
    """One KV layout: packed (cu_seqlens_k), paged (block_table + seqused_k) or batched
    (seqused_k alone, where the family declares it). Returns whether it is paged."""
    cu_seqlens_k, seqused_k = call.cu_seqlens_k, call.seqused_k
    paged = call.block_table is not None
    if paged and (seqused_k is None or cu_seqlens_k is not None):
        _fail("block_table (paged KV cache) needs seqused_k (the KV length of each sequence) "
              "and no cu_seqlens_k")
    if cu_seqlens_k is None and seqused_k is None:
        _fail("pass cu_seqlens_k (packed K/V) or seqused_k (with block_table for a paged cache); "
              "got neither")
    if cu_seqlens_k is not None and seqused_k is not None:
        _fail("pass either cu_seqlens_k or seqused_k, not both")
    if not paged and cu_seqlens_k is None and "batched" not in family.call.kv_layouts:
        # Such a family takes K offsets from cu_seqlens_k unless the cache is paged.
        _fail(f"{family.title} needs cu_seqlens_k for an unpaged K/V (it says where each sequence starts); "
              "seqused_k alone is only valid with block_table")
    return paged


def _check_shapes(family: Family, comp: Optional[ComponentInfo], call: VarlenCall, paged: bool,
                  qname) -> tuple:
    """q is 3-D, cu_seqlens_q an int32 index of batch + 1 >= 2 entries, k and v of the layout's
    rank and agreeing but in the last dimension, the GQA head ratio and the head sizes the
    family (and its build) has. Returns (total_q, batch, num_heads, head_size, num_heads_k,
    head_size_v)."""
    q, k, v, cu_seqlens_q = call.q, call.k, call.v, call.cu_seqlens_q
    if q.dim() != 3:
        _fail(f"q must be 3-D (total_q, num_heads, head_size), got shape {tuple(q.shape)}")
    total_q, num_heads, head_size = q.shape
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 2:
        _fail("cu_seqlens_q must be 1-D with batch_size + 1 >= 2 entries, got shape "
              f"{tuple(cu_seqlens_q.shape)}")
    batch = cu_seqlens_q.shape[0] - 1
    _index_tensor("cu_seqlens_q", cu_seqlens_q, q)
    kv_dims = 4 if (paged or call.cu_seqlens_k is None) else 3
    layout = {3: "(total_k, num_heads_k, head_size)",
              4: "(num_blocks, block_size, num_heads_k, head_size)" if paged
              else "(batch_size, seqlen_k, num_heads_k, head_size)"}[kv_dims]
    for name, x in (("k", k), ("v", v)):
        if x.dim() != kv_dims:
            _fail(f"{name} must be {kv_dims}-D {layout} here, got shape {tuple(x.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        _fail(f"k and v must agree in all but the last dimension, got {tuple(k.shape)} and "
              f"{tuple(v.shape)}")
    num_heads_k = k.shape[-2]
    head_size_v = v.shape[-1]
    check_heads(q, k)
    problem = head_size_problem(family, comp, head_size, head_size_v, qname)
    if problem:
        _fail(problem)
    return total_q, batch, num_heads, head_size, num_heads_k, head_size_v


def _check_kv_index_tensors(family: Family, comp: Optional[ComponentInfo], call: VarlenCall, paged: bool,
                            batch: int) -> None:
    """cu_seqlens_k (batch + 1 entries), seqused_k (batch), block_table (a row per sequence,
    a block size the family pages by, the build's paged kernels), or for a batched K/V one
    sequence per q sequence."""
    q, k = call.q, call.k
    if call.cu_seqlens_k is not None:
        _index_tensor("cu_seqlens_k", call.cu_seqlens_k, q, shape=(batch + 1,))
    if call.seqused_k is not None:
        _index_tensor("seqused_k", call.seqused_k, q, shape=(batch,))
    if paged:
        block_table = call.block_table
        _index_tensor("block_table", block_table, q, dims=2)
        if block_table.shape[0] != batch:
            _fail(f"block_table has {block_table.shape[0]} rows but cu_seqlens_q describes {batch} "
                  "sequences; it needs one row per sequence")
        multiple = family.call.page_size_multiple
        if k.shape[1] % multiple:
            _fail(f"{family.title} needs a paged KV block size divisible by {multiple}, got {k.shape[1]}")
        _feature(family, comp, "paged")
    elif call.cu_seqlens_k is None and k.shape[0] != batch:  # batched: k is 4-D (_check_shapes)
        _fail(f"k/v hold {k.shape[0]} sequences but cu_seqlens_q describes {batch}")


def _check_scalar_options(call: VarlenCall) -> tuple[int, int, int]:
    """dropout_p is 0, softcap >= 0, num_splits, cp_world_size (>= 1) and cp_rank ints.
    Returns (num_splits, cp_world_size, cp_rank) as ints."""
    if float(call.dropout_p) != 0.0:
        _fail(f"dropout_p must be 0.0: these kernels are inference-only and built without dropout "
              f"(got {call.dropout_p})")
    if call.softcap < 0:
        _fail(f"softcap must be >= 0 (0 turns it off), got {call.softcap}")
    num_splits = _integer("num_splits", call.num_splits)
    cp_world_size = _integer("cp_world_size", call.cp_world_size, minimum=1)
    cp_rank = _integer("cp_rank", call.cp_rank)
    return num_splits, cp_world_size, cp_rank


def _check_features(family: Family, comp: Optional[ComponentInfo], call: VarlenCall, window: tuple[int, int],
                    num_splits: int, cp_world_size: int) -> None:
    """What the call asks for that the family does not declare at all, then what its build
    left out (softcap, local, split), and the family's most splits."""
    _refuse_undeclared(family, alibi_slopes=call.alibi_slopes, s_aux=call.s_aux, q_v=call.q_v,
                       num_splits=num_splits, scheduler_metadata=call.scheduler_metadata,
                       cp_world_size=cp_world_size, cp_tot_seqused_k=call.cp_tot_seqused_k)
    if call.softcap > 0:
        _feature(family, comp, "softcap")
    if _is_local(window, call.causal):
        _feature(family, comp, "local")
    if num_splits > 1:
        _feature(family, comp, "split")
        most = family.call.max_num_splits
        if most is not None and num_splits > most:
            _fail(f"{family.title} supports num_splits up to {most}, got {num_splits}")


def _check_alibi_slopes(alibi_slopes, batch: int, num_heads: int) -> None:
    """float32, of shape (num_heads,) or (batch, num_heads), a unit last stride."""
    if alibi_slopes.dtype != torch.float32:
        raise FlashAttnTypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((num_heads,), (batch, num_heads)):
        _fail(f"alibi_slopes must have shape ({num_heads},) or ({batch}, {num_heads}), got "
              f"{tuple(alibi_slopes.shape)}")
    if alibi_slopes.stride(-1) != 1:
        _fail("alibi_slopes must have a contiguous last dimension (stride 1)")


def _check_descales(call: VarlenCall, batch: int, num_heads_k: int) -> None:
    """FP8's q/k/v_descale, each given: float32 of shape (num_seqs, num_kv_heads)."""
    for name, d in (("q_descale", call.q_descale), ("k_descale", call.k_descale), ("v_descale", call.v_descale)):
        if d is None:
            continue
        if d.dtype != torch.float32:
            raise FlashAttnTypeError(f"{name} must be float32, got {d.dtype}")
        if tuple(d.shape) != (batch, num_heads_k):
            _fail(f"{name} must have shape (num_seqs, num_kv_heads) = {(batch, num_heads_k)}, "
                  f"got {tuple(d.shape)}; expand a per-tensor scale with "
                  f"scale.expand({batch}, {num_heads_k}) or use make_fp8_descales")


def _check_sinks(family: Family, s_aux, num_heads: int, head_size: int, head_size_v: int) -> None:
    """s_aux (attention sinks): bfloat16, one per q head, contiguous, within the family's
    limits on q heads and head sizes."""
    if s_aux.dtype != torch.bfloat16:
        raise FlashAttnTypeError(f"s_aux must be bfloat16, got {s_aux.dtype}")
    if tuple(s_aux.shape) != (num_heads,):
        _fail(f"s_aux must have shape ({num_heads},) (one sink per q head), got "
              f"{tuple(s_aux.shape)}")
    if not s_aux.is_contiguous():
        _fail("s_aux must be contiguous")
    most = family.call.sinks_max_q_heads
    if most is not None and num_heads > most:
        _fail(f"{family.title} supports s_aux with at most {most} q heads, got {num_heads}")
    if family.call.sinks_same_head_sizes and head_size != head_size_v:
        _fail(f"{family.title} does not support s_aux with different Q/K and V head sizes")


def _check_q_v(call: VarlenCall, fp8: bool, total_q: int, num_heads: int, head_size: int,
               head_size_v: int) -> None:
    """q_v: head sizes <= 64 (Q/K) and >= 256 (V), q's 16-bit dtype, (total_q, num_heads,
    head_size_v), a unit last stride."""
    q_v = call.q_v
    if head_size > 64 or head_size_v < 256:
        _fail("q_v needs a Q/K head size <= 64 and a V head size >= 256, got "
              f"{head_size} and {head_size_v}")
    if fp8 or q_v.dtype != call.q.dtype:
        raise FlashAttnTypeError(f"q_v must have q's dtype, fp16 or bf16; got {q_v.dtype}")
    if tuple(q_v.shape) != (total_q, num_heads, head_size_v):
        _fail(f"q_v must have shape {(total_q, num_heads, head_size_v)}, got {tuple(q_v.shape)}")
    if q_v.stride(-1) != 1:
        _fail("q_v must have a contiguous last dimension (stride 1)")


def _check_context_parallel(call: VarlenCall, window: tuple[int, int], cp_world_size: int, cp_rank: int,
                            batch: int) -> None:
    """cp_rank 0 without context parallelism; with it, cp_tot_seqused_k given, cp_rank below
    cp_world_size, no sliding window; cp_tot_seqused_k an int32 index of batch entries."""
    if cp_world_size == 1 and cp_rank != 0:
        _fail(f"cp_rank must be 0 without context parallelism (cp_world_size=1), got {cp_rank}")
    if cp_world_size > 1:
        if call.cp_tot_seqused_k is None:
            _fail("context parallelism (cp_world_size > 1) needs cp_tot_seqused_k")
        if cp_rank >= cp_world_size:
            _fail(f"cp_rank must be < cp_world_size ({cp_world_size}), got {cp_rank}")
        if _is_local(window, call.causal):
            _fail("sliding-window attention is not supported with context parallelism")
    if call.cp_tot_seqused_k is not None:
        _index_tensor("cp_tot_seqused_k", call.cp_tot_seqused_k, call.q, shape=(batch,))


def _feature(family: Family, comp: Optional[ComponentInfo], feature: str) -> None:
    problem = feature_problem(family, comp, feature)
    if problem:
        _fail(problem)


def _is_local(window, causal) -> bool:
    # Same normalisation as FA3's mha_fwd, minus its clamping to the batch's max seqlen:
    # a sliding-window model needs the local kernels whatever the current batch looks like.
    left, right = window
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    return (left >= 0 or right >= 0) and not is_causal


# --- what the quick path may take, decided once per kind of call ---------------------------
#
# The interface's quick path (interface._quick) checks the common calls with flat metadata
# reads; what does not depend on the step (dtype, heads, head sizes, the kernel features a
# call needs, against this wheel) it does not check per call: the interface asks
# static_verdict when it resolves a kind of call and keeps the answer with the resolution
# (cleared with it when the environment, and so the build record, changes).


def static_verdict(family, comp, dtype, num_heads: int, head_size: int, num_heads_k: int,
                   head_size_v: int, paged: bool, softcap_on: bool, local: bool, split: bool) -> bool:
    """Whether calls of this static signature (dtype, heads, head sizes, the features they
    need) can take the quick path at all: check_varlen_call's own rules (dtype_problem,
    head_size_problem, the GQA ratio, the build's features), decided once."""
    name = dtype_name(dtype)
    needed = [f for f, on in (("paged", paged), ("softcap", softcap_on), ("local", local), ("split", split)) if on]
    return (
        name is not None and num_heads_k > 0 and num_heads % num_heads_k == 0
        and dtype_problem(family, comp, name, shown=str(dtype)) is None
        and head_size_problem(family, comp, head_size, head_size_v, name) is None
        and not family.features_missing(comp.features if comp is not None else (), needed)
    )
