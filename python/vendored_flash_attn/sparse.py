"""Sparse attention over FA2's vertical-and-slash kernels: ``sparse_attn_func`` and
``sparse_attn_varlen_func``, call-compatible with upstream's ``vllm_flash_attn`` functions.

What the kernels compute (csrc/flash_attn/src/flash_fwd_sparse_kernel.h at the pin).
Queries are taken in blocks of 64 rows (``NUM_ROWS = cdiv(seqlen_q, 64)``; varlen: of
``max_seqlen_q``). For batch ``b``, *query* head ``h`` and query block ``m``, the keys
attended are the union of

* blocks ("slash"): ``block_count[b, h, m]`` entries of ``block_offset[b, h, m, :]``, each
  the first key index of a run of 64 keys ``[off, off + 64)``, and
* columns ("vertical"): ``column_count[b, h, m]`` entries of ``column_index[b, h, m, :]``,
  each one key index,

clipped to the sequence's keys, with the causal mask (aligned bottom-right, as in
flash_attn_varlen_func) on top. A key listed twice is counted twice. The index tensors
are indexed by *query* head (GQA: q head h reads k/v head h // (heads / heads_k)).

What the kernels take on trust, and this module therefore checks before any kernel runs:
the index tensors are read through raw int32 pointers with the layout
``(batch, num_heads, NUM_ROWS[, NNZ])`` contiguous, so dtype, shape and contiguity are
checked here. The *values* are checked only with ``VFA_DEBUG_CHECKS=1`` (they need a device
sync): a count above NNZ reads past its row, and an offset outside the sequence reads
another sequence's keys or memory outside k/v, because the kernel loads every listed block
but the last one, and every listed column, without bounds checks. The kernel applies the
causal mask only to the last two listed blocks and the last two chunks of 64 listed
columns, so a causal pattern must list keys in ascending order (MInference's index
conversion does); the debug checks verify that too.

Two defects of the pinned upstream are handled here rather than passed on:

* ``varlen_fwd_sparse`` allocates the LSE as ``(num_heads, total_q)`` but its kernel
  writes the padded layout ``(batch, num_heads, max_seqlen_q)`` into it (set_params_fprop
  is called without ``unpadded_lse``). The LSE comes back scrambled unless every sequence
  has ``max_seqlen_q`` queries, and when ``batch * max_seqlen_q > total_q`` the kernel writes
  past the end of the buffer - device memory corruption. ``sparse_attn_varlen_func``
  therefore hands the op a q with at least ``batch * max_seqlen_q`` rows (copying q into a
  larger buffer when needed; the kernel reads only the rows cu_seqlens_q names) and
  returns the LSE laid out as documented, ``(num_heads, total_q)``.
* The kernel adds the ALiBi bias only in the (up to two) masked iterations - the last one
  or two listed blocks - and never to listed columns, so ``alibi_slopes`` would not give
  ALiBi attention; it is refused.
"""

from __future__ import annotations

from typing import Optional

import torch

from .declaration.build_info import ComponentInfo
from .call.arguments import SPARSE, SPARSE_VARLEN, SparseCall, SparseVarlenCall
from .selection.compiled import component
from .call.debug_checks import debug_checks_enabled, run_debug_checks
from .selection.environment import current_environment, on_environment_change
from .errors import FlashAttnTypeError, FlashAttnUnavailableError
from .declaration.families import Family, registry
from .interface import maybe_contiguous
from .declaration.kernels import SPARSE_HEAD_DIM, dtype_name, dtype_problem, sparse_problem
from .selection.selector import resolve_device_index, version_problem
from .call.validation import (_fail, _integer, _same_device, _tensor, check_heads, check_out,
                         check_q_device, check_same_dtype)

BLOCK_M = 64   # query rows per row block (kBlockM of the hdim-128 sparse kernel traits)
BLOCK_N = 64   # keys per listed block (kBlockN)
_INT32_LIMIT = 2 ** 31  # the kernel computes index-tensor offsets in int


# --- the family and its ops -----------------------------------------------------------------

def _family() -> Family:
    """The family whose module holds the sparse kernels: the one declaring the feature."""
    return registry().having("sparse")[0]


_ops: dict = {}
on_environment_change(_ops.clear)


def _op(name: str):
    op = _ops.get(name)
    if op is None:
        op = _ops[name] = getattr(getattr(torch.ops, _family().op_namespace), name).default
    return op


# --- cheap checks (metadata only) -------------------------------------------------------

def _check_common(comp: ComponentInfo, q, k, v, indexes, *, batch: int, num_rows: int, out,
                  dropout_p, softmax_scale, softcap, alibi_slopes) -> None:
    """Everything both entry points share; q/k/v shapes are checked by the caller first.
    ``comp``: the sparse family's build record; ``indexes``: the four index tensors by name;
    ``num_rows``: cdiv(seqlen_q, 64)."""
    num_heads, head_size = q.shape[-2], q.shape[-1]
    if k.shape != v.shape:
        _fail(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_heads(q, k)
    problem = sparse_problem(_family(), comp, head_size)
    if problem:
        _fail(problem)

    # Index tensors: the kernel reads element ((b * num_heads + h) * NUM_ROWS + m) * NNZ + j
    # through a raw int32 pointer, so only a contiguous int32 tensor of exactly this shape
    # is read as meant. The head dimension is the number of *query* heads.
    want = (batch, num_heads, num_rows)
    for name, x in indexes.items():
        if x.dtype != torch.int32:
            raise FlashAttnTypeError(f"{name} must have dtype torch.int32, got {x.dtype}; convert "
                                     f"it with {name}.to(torch.int32)")
        per_entry = not name.endswith("count")  # block_offset, column_index: one more dim
        if x.dim() != 3 + per_entry or tuple(x.shape[:3]) != want:
            nnz = ", NNZ" if per_entry else ""
            _fail(f"{name} must have shape (batch, num_heads, cdiv(seqlen_q, 64){nnz}) = "
                  f"({batch}, {num_heads}, {num_rows}{nnz}), got {tuple(x.shape)} (num_heads "
                  "counts q heads; a query block is 64 rows)")
        if not x.is_contiguous():
            _fail(f"{name} must be contiguous (the kernel reads it through a raw pointer); pass "
                  f"{name}.contiguous()")
        if x.numel() >= _INT32_LIMIT:
            _fail(f"{name} has {x.numel()} elements; the kernel indexes it with 32-bit ints "
                  f"(< {_INT32_LIMIT})")

    if out is not None:
        check_out(out, q.dtype, tuple(q.shape))
    if float(dropout_p) != 0.0:
        _fail(f"dropout_p must be 0.0: these kernels are inference-only and built without dropout "
              f"(got {dropout_p})")
    if softmax_scale is not None and not isinstance(softmax_scale, (int, float)):
        raise FlashAttnTypeError(f"softmax_scale must be a float or None, got "
                                 f"{type(softmax_scale).__name__}")
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool):
        raise FlashAttnTypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap < 0:
        _fail(f"softcap must be >= 0 (0 turns it off), got {softcap}")
    if alibi_slopes is not None:
        _fail("alibi_slopes is not supported by the sparse kernels: they add the ALiBi bias only "
              "to the last one (causal: two) blocks listed in block_offset and never to "
              "column_index keys, so the result would not be ALiBi attention; use "
              "flash_attn_varlen_func with alibi_slopes")


def _check_tensors(q, tensors: dict, optional: dict) -> None:
    """Types and devices: q decides, every other tensor follows it."""
    _tensor("q", q)
    check_q_device(q, current_environment().device_type)
    for name, x in tensors.items():
        _tensor(name, x)
    for name, x in optional.items():
        _tensor(name, x, optional=True)
    for name, x in list(tensors.items()) + list(optional.items()):
        _same_device(name, x, q)


def _check_usable(q) -> ComponentInfo:
    """The sparse family runs here and its build has the sparse kernels for q's dtype; its
    build record."""
    family = _family()
    index, problem = resolve_device_index(q.device)
    if problem is None:
        problem = version_problem(family.version, index)
    if problem is not None:
        raise FlashAttnUnavailableError(f"sparse attention needs {family.title}, which cannot run here: {problem}")
    comp = component(family.version)
    problem = sparse_problem(family, comp)
    if problem:
        _fail(problem)
    problem = dtype_problem(family, comp, dtype_name(q.dtype), shown=str(q.dtype).replace("torch.", ""))
    if problem:
        raise FlashAttnTypeError(f"q: {problem}")
    return comp


def _num_rows(seqlen_q: int) -> int:
    return (seqlen_q + BLOCK_M - 1) // BLOCK_M


# --- expensive checks (VFA_DEBUG_CHECKS=1) ------------------------------------------------

def check_sparse_indexes(block_count, block_offset, column_count, column_index, *,
                         seqlens_q: torch.Tensor, seqlens_k: torch.Tensor, causal: bool) -> None:
    """Raise FlashAttnInputError for index values the kernel would read out of bounds with,
    or (causal) mask wrongly. ``seqlens_q``/``seqlens_k``: (batch,) query and key counts per
    sequence. Runs on the index tensors' device; each finding reads back to the host (a sync)."""
    batch, _, num_rows = block_count.shape
    dev = block_count.device
    sq = seqlens_q.to(dev, torch.int64).view(batch, 1, 1)
    sk = seqlens_k.to(dev, torch.int64).view(batch, 1, 1)
    m = torch.arange(num_rows, device=dev).view(1, 1, num_rows)
    active = m * BLOCK_M < sq          # query blocks the kernel runs (others return at once)
    # Causal: the last key that query row m * 64, the first of block m, may see.
    first_row_limit = m * BLOCK_M + (sk - sq)

    def first_bad(mask: torch.Tensor):
        hit = torch.nonzero(mask)
        return None if hit.shape[0] == 0 else tuple(int(i) for i in hit[0])

    for count_name, count, nnz_name, values, per in (
            ("block_count", block_count, "block_offset", block_offset, BLOCK_N),
            ("column_count", column_count, "column_index", column_index, 1)):
        nnz = values.shape[-1]
        c = count.to(torch.int64)
        where = first_bad(active & ((c < 0) | (c > nnz)))
        if where:
            _fail(f"{count_name}{list(where)} = {int(c[where])} is outside [0, {nnz}] "
                  f"({nnz_name} has {nnz} entries per row); the kernel would read past the row")
        if nnz == 0:
            continue
        x = values.to(torch.int64)
        j = torch.arange(nnz, device=dev).view(1, 1, 1, nnz)
        listed = active.unsqueeze(-1) & (j < c.unsqueeze(-1))
        keys = sk.unsqueeze(-1)
        where = first_bad(listed & ((x < 0) | (x >= keys)))
        if where:
            _fail(f"{nnz_name}{list(where)} = {int(x[where])} is outside the sequence's keys "
                  f"[0, {int(keys[where[0], 0, 0, 0])}); the kernel would read outside it")
        if per == BLOCK_N:
            # Every listed block but the last is loaded without a bounds check.
            where = first_bad(listed & (j < c.unsqueeze(-1) - 1) & (x + BLOCK_N > keys))
            if where:
                _fail(f"{nnz_name}{list(where)} = {int(x[where])}: block [{int(x[where])}, "
                      f"{int(x[where]) + BLOCK_N}) runs past the sequence's "
                      f"{int(keys[where[0], 0, 0, 0])} keys; only the last listed block of a row "
                      "may (the kernel loads the others unchecked)")
        if causal:
            # The kernel masks the last two listed blocks and the last two chunks of 64
            # listed columns (n_masking_steps = 2); whatever comes before is used unmasked.
            if per == BLOCK_N:
                unmasked = j < c.unsqueeze(-1) - 2
            else:
                chunks = (c.unsqueeze(-1) + BLOCK_N - 1) // BLOCK_N
                unmasked = j // BLOCK_N < chunks - 2
            last_key = x + (per - 1)
            where = first_bad(listed & unmasked & (last_key > first_row_limit.unsqueeze(-1)))
            if where:
                what = "block" if per == BLOCK_N else "column"
                _fail(f"{nnz_name}{list(where)} = {int(x[where])}: a {what} the causal mask does "
                      f"not cover (the kernel masks only the last two listed blocks and the last "
                      f"two chunks of 64 listed columns) reaches past the diagonal of query row "
                      f"{where[2] * BLOCK_M}; list keys in ascending order")


# --- the entry points -----------------------------------------------------------------------

def _sparse(call: SparseCall):
    """sparse_attn_func's body (the function itself is generated from call.SPARSE)."""
    q, k, v, out = call.q, call.k, call.v, call.out
    block_count, block_offset, column_count, column_index = (call.block_count, call.block_offset,
                                                             call.column_count, call.column_index)
    dropout_p, softmax_scale, causal, softcap, alibi_slopes = (call.dropout_p, call.softmax_scale, call.causal,
                                                               call.softcap, call.alibi_slopes)
    indexes = dict(block_count=block_count, block_offset=block_offset, column_count=column_count,
                   column_index=column_index)
    _check_tensors(q, dict(k=k, v=v, **indexes), dict(out=out, alibi_slopes=alibi_slopes))
    comp = _check_usable(q)
    check_same_dtype(q, k, v)
    if q.dim() != 4:
        _fail(f"q must be 4-D (batch, seqlen_q, num_heads, head_size), got shape {tuple(q.shape)}; "
              "packed sequences go to sparse_attn_varlen_func")
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 4:
            _fail(f"{name} must be 4-D (batch, seqlen_k, num_heads_k, head_size), got shape "
                  f"{tuple(x.shape)}")
    batch, seqlen_q = q.shape[0], q.shape[1]
    if k.shape[0] != batch:
        _fail(f"k/v hold {k.shape[0]} sequences but q holds {batch}")
    if batch == 0 or seqlen_q == 0:
        _fail(f"q must hold at least one query (got batch {batch}, seqlen_q {seqlen_q})")
    _check_common(comp, q, k, v, indexes, batch=batch, num_rows=_num_rows(seqlen_q), out=out,
                  dropout_p=dropout_p, softmax_scale=softmax_scale,
                  softcap=softcap, alibi_slopes=alibi_slopes)
    if debug_checks_enabled():
        check_sparse_indexes(block_count, block_offset, column_count, column_index,
                             seqlens_q=torch.full((batch,), seqlen_q, device=q.device),
                             seqlens_k=torch.full((batch,), k.shape[1], device=q.device),
                             causal=causal)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    q, k, v = (maybe_contiguous(x) for x in (q, k, v))
    # Argument order of the schema (flash_api_torch_lib.cpp, ops.def("fwd_sparse(...")).
    result, softmax_lse = _op("fwd_sparse")(
        q, k, v,
        block_count, block_offset, column_count, column_index,
        out,
        None,                    # alibi_slopes: refused above
        0.0,                     # p_dropout: built without dropout
        float(softmax_scale),
        bool(causal),
        float(softcap),
        False,                   # return_softmax: only with dropout
        None,                    # gen: must be None
    )[:2]
    return (result, softmax_lse) if call.return_softmax_lse else result


sparse_attn_func = SPARSE.function(_sparse, __name__, """\
Attention with vertical (column) and slash (block) sparsity; see the module docstring.

q: (batch, seqlen_q, num_heads, 128); k, v: (batch, seqlen_k, num_heads_k, 128);
block_count, column_count: (batch, num_heads, cdiv(seqlen_q, 64)) int32;
block_offset: (..., NNZ_S) int32, key index of the first of 64 keys per listed block;
column_index: (..., NNZ_V) int32, key indices. Returns out (like q), or
(out, softmax_lse (batch, num_heads, seqlen_q)) with return_softmax_lse=True.
``deterministic`` and ``return_attn_probs`` are accepted for compatibility (forward only,
no dropout).
""")


def _sparse_varlen(call: SparseVarlenCall):
    """sparse_attn_varlen_func's body (the function itself is generated from call.SPARSE_VARLEN)."""
    q, k, v, out = call.q, call.k, call.v, call.out
    block_count, block_offset, column_count, column_index = (call.block_count, call.block_offset,
                                                             call.column_count, call.column_index)
    cu_seqlens_q, cu_seqlens_k = call.cu_seqlens_q, call.cu_seqlens_k
    dropout_p, softmax_scale, causal, softcap, alibi_slopes = (call.dropout_p, call.softmax_scale, call.causal,
                                                               call.softcap, call.alibi_slopes)
    indexes = dict(block_count=block_count, block_offset=block_offset, column_count=column_count,
                   column_index=column_index)
    _check_tensors(q, dict(k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **indexes),
                   dict(out=out, alibi_slopes=alibi_slopes))
    comp = _check_usable(q)
    check_same_dtype(q, k, v)
    if q.dim() != 3:
        _fail(f"q must be 3-D (total_q, num_heads, head_size), got shape {tuple(q.shape)}; "
              "batched (4-D) inputs go to sparse_attn_func")
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 3:
            _fail(f"{name} must be 3-D (total_k, num_heads_k, head_size), got shape "
                  f"{tuple(x.shape)}")
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if x.dtype != torch.int32:
            raise FlashAttnTypeError(f"{name} must have dtype torch.int32, got {x.dtype}; convert "
                                     f"it with {name}.to(torch.int32)")
        if x.dim() != 1 or x.shape[0] < 2:
            _fail(f"{name} must be 1-D with batch_size + 1 >= 2 entries, got shape {tuple(x.shape)}")
        if not x.is_contiguous():
            _fail(f"{name} must be contiguous; pass {name}.contiguous()")
    batch = cu_seqlens_q.shape[0] - 1
    if cu_seqlens_k.shape[0] != batch + 1:
        _fail(f"cu_seqlens_k must have batch_size + 1 = {batch + 1} entries like cu_seqlens_q, got "
              f"{cu_seqlens_k.shape[0]}")
    max_seqlen_q = _integer("max_seqlen_q", call.max_seqlen_q, minimum=1)
    max_seqlen_k = _integer("max_seqlen_k", call.max_seqlen_k)
    total_q, num_heads, head_size = q.shape
    _check_common(comp, q, k, v, indexes, batch=batch, num_rows=_num_rows(max_seqlen_q), out=out,
                  dropout_p=dropout_p, softmax_scale=softmax_scale,
                  softcap=softcap, alibi_slopes=alibi_slopes)
    if debug_checks_enabled():
        run_debug_checks(q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         seqused_k=None, block_table=None, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k)
        check_sparse_indexes(block_count, block_offset, column_count, column_index,
                             seqlens_q=cu_seqlens_q[1:] - cu_seqlens_q[:-1],
                             seqlens_k=cu_seqlens_k[1:] - cu_seqlens_k[:-1], causal=causal)
    if softmax_scale is None:
        softmax_scale = head_size ** (-0.5)
    q, k, v = (maybe_contiguous(x) for x in (q, k, v))
    # The kernel writes the LSE as (batch, num_heads, max_seqlen_q) into a buffer the op
    # sizes (num_heads, q.shape[0]): give it a q of at least batch * max_seqlen_q rows. The
    # rows past total_q are never read (the kernel reads the rows cu_seqlens_q names), and
    # the output rows past total_q never written.
    rows = batch * max_seqlen_q
    q_run, out_run = q, out
    if rows > total_q:
        q_run = q.new_empty((rows, num_heads, head_size))
        q_run[:total_q].copy_(q)
        out_run = None  # the op allocates one like q_run
    # Argument order of the schema (flash_api_torch_lib.cpp, ops.def("varlen_fwd_sparse(...")).
    result, raw_lse = _op("varlen_fwd_sparse")(
        q_run, k, v,
        block_count, block_offset, column_count, column_index,
        out_run,
        cu_seqlens_q,
        cu_seqlens_k,
        None,                    # seqused_k
        None,                    # alibi_slopes: refused above
        max_seqlen_q,
        max_seqlen_k,
        0.0,                     # p_dropout: built without dropout
        float(softmax_scale),
        False,                   # zero_tensors
        bool(causal),
        float(softcap),
        False,                   # return_softmax: only with dropout
        None,                    # gen: must be None
    )[:2]
    if q_run is not q:
        result = result[:total_q]
        if out is not None:
            out.copy_(result)
            result = out
    if not call.return_softmax_lse:
        return result
    return result, varlen_lse(raw_lse, cu_seqlens_q, batch, num_heads, max_seqlen_q, total_q)


sparse_attn_varlen_func = SPARSE_VARLEN.function(_sparse_varlen, __name__, """\
Packed-sequence sparse attention; see the module docstring.

q: (total_q, num_heads, 128); k, v: (total_k, num_heads_k, 128); cu_seqlens_q/k:
(batch + 1,) int32; index tensors as in sparse_attn_func with
NUM_ROWS = cdiv(max_seqlen_q, 64). Returns out (like q), or (out, softmax_lse
(num_heads, total_q)) with return_softmax_lse=True.
""")


def varlen_lse(raw: torch.Tensor, cu_seqlens_q: torch.Tensor, batch: int, num_heads: int,
               max_seqlen_q: int, total_q: int) -> torch.Tensor:
    """The LSE as (num_heads, total_q) from the kernel's (batch, num_heads, max_seqlen_q)
    layout at the start of ``raw``. Device ops only (no sync); entries of tokens that belong
    to no sequence are +inf, the kernel's value for a row that sees no key."""
    per_seq = raw.reshape(-1)[: batch * num_heads * max_seqlen_q].view(batch, num_heads, max_seqlen_q)
    token = torch.arange(total_q, device=raw.device, dtype=cu_seqlens_q.dtype)
    seq = (torch.searchsorted(cu_seqlens_q, token, right=True) - 1).clamp_(0, batch - 1)
    start = cu_seqlens_q[seq]
    row = (token - start).long()
    inside = (token >= start) & (token < cu_seqlens_q[seq + 1]) & (row < max_seqlen_q)
    lse = per_seq[seq, :, row.clamp(0, max_seqlen_q - 1)].t()  # (num_heads, total_q)
    return lse.masked_fill(~inside.unsqueeze(0), float("inf")).contiguous()


__all__ = ["sparse_attn_func", "sparse_attn_varlen_func", "BLOCK_M", "BLOCK_N", "SPARSE_HEAD_DIM"]
