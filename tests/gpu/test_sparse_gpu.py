"""Sparse attention (FA2's vertical-and-slash kernels) on the GPU against a float64 reference.

The reference turns the sparsity pattern into a mask with multiplicities: query row ``i`` of
query block ``m = i // 64`` sees key ``j`` once for every listed block ``[off, off + 64)``
that holds it and once for every listed column equal to it (the kernel sums over what is
listed), keys past the sequence never, and with ``causal`` only ``j <= i + sk - sq``.
Patterns are generated the way the kernels need them (ascending, so that what reaches past
the diagonal sits in the last two blocks / chunks of 64 columns, which are the ones the
kernel masks); every pattern is also put through the VFA_DEBUG_CHECKS index checks, which
must accept it. Output and LSE are checked (rows that see no key: output 0, LSE +inf).

Built for head dim 128 only, in the FA2 dtypes of the wheel; what the wheel lacks is checked
to be refused instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import pytest
import torch

from gpu_helpers import (LSE_TOL, OUT_TOL, SIXTEEN_BIT, SPARSE_HEAD_DIM, Rand, check, component,
                         expect_refused, make_problem, relative_l2, require,
                         sparse_refusal_fragments)

pytestmark = pytest.mark.gpu

HEAD_DIM = SPARSE_HEAD_DIM
BLOCK = 64


def sparse_skip_reason():
    comp = component(2)
    if comp is None:
        return None  # no build info: conftest skips everything with its reason
    if sparse_refusal_fragments():
        return ("this wheel has no FA2 sparse kernels (build with VFA_FA2_FEATURES=sparse and head "
                "dim 128 in VFA_FA2_HEAD_DIMS)")
    return None


def sparse_dtypes() -> List[str]:
    comp = component(2)
    if comp is None or sparse_skip_reason():
        return ["bf16"]  # placeholder: skipped
    return [d for d in SIXTEEN_BIT if d in comp.dtypes]


def unbuilt_sparse_dtypes() -> List[str]:
    comp = component(2)
    if comp is None or sparse_skip_reason():
        return []
    return [d for d in SIXTEEN_BIT if d not in comp.dtypes]


def require_sparse():
    require(2)
    reason = sparse_skip_reason()
    if reason:
        pytest.skip(reason)


# --- patterns -------------------------------------------------------------------------------

@dataclass
class Pattern:
    """The four index tensors plus, per (sequence, head, query block), the keys listed."""

    block_count: torch.Tensor
    block_offset: torch.Tensor
    column_count: torch.Tensor
    column_index: torch.Tensor
    lists: list  # lists[b][h][m] = (block offsets, column indices)

    def kwargs(self) -> dict:
        return dict(block_count=self.block_count, block_offset=self.block_offset,
                    column_count=self.column_count, column_index=self.column_index)


def make_pattern(r: Rand, q_lens, k_lens, heads: int, kind: str, causal: bool) -> Pattern:
    """kind: blocks | columns | mixed | empty-rows (mixed, some rows listing nothing) |
    all-blocks | all-columns (every key a query may see, as blocks / as columns)."""
    rows = math.ceil(max(q_lens) / BLOCK)
    lists = []
    for sq, sk in zip(q_lens, k_lens):
        per_seq = []
        for _ in range(heads):
            per_head = []
            for m in range(rows):
                if m * BLOCK >= sq:
                    per_head.append(([], []))  # the kernel skips this query block
                    continue
                last_row = min(m * BLOCK + BLOCK - 1, sq - 1)
                top = sk - 1 if not causal else min(sk - 1, last_row + sk - sq)
                starts = list(range(0, top + 1, BLOCK)) if top >= 0 else []
                if kind == "all-blocks":
                    blocks, columns = starts, []
                elif kind == "all-columns":
                    blocks, columns = [], list(range(top + 1))
                elif kind == "empty-rows" and r.py.random() < 0.3:
                    blocks, columns = [], []
                else:
                    p_block = {"blocks": 0.6, "columns": 0.0}.get(kind, 0.4)
                    p_column = {"blocks": 0.0, "columns": 0.5}.get(kind, 0.25)
                    blocks = [s for s in starts if r.py.random() < p_block]
                    covered = {j for s in blocks for j in range(s, s + BLOCK)}
                    columns = [j for j in range(top + 1)
                               if j not in covered and r.py.random() < p_column]
                per_head.append((blocks, columns))
            per_seq.append(per_head)
        lists.append(per_seq)
    nnz_s = max([1] + [len(b) for s in lists for h in s for b, _ in h])
    nnz_v = max([1] + [len(c) for s in lists for h in s for _, c in h])
    batch = len(q_lens)
    shape = (batch, heads, rows)
    bc = torch.zeros(shape, dtype=torch.int32)
    cc = torch.zeros(shape, dtype=torch.int32)
    bo = torch.zeros(shape + (nnz_s,), dtype=torch.int32)  # unlisted entries: 0 (never read)
    ci = torch.zeros(shape + (nnz_v,), dtype=torch.int32)
    for b in range(batch):
        for h in range(heads):
            for m in range(rows):
                blocks, columns = lists[b][h][m]
                bc[b, h, m], cc[b, h, m] = len(blocks), len(columns)
                bo[b, h, m, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
                ci[b, h, m, :len(columns)] = torch.tensor(columns, dtype=torch.int32)
    return Pattern(bc.cuda(), bo.cuda(), cc.cuda(), ci.cuda(), lists)


def sparse_reference(p, pattern: Pattern, *, causal: bool, softcap: float = 0.0):
    """(out (total_q, H, D), lse (H, total_q)) in float32, computed in float64."""
    outs, lses = [], []
    scale = HEAD_DIM ** -0.5
    for b, (q, k, v) in enumerate(zip(p.q_ref, p.k_ref, p.v_ref)):
        sq, heads, _ = q.shape
        sk, heads_k, _ = k.shape
        group = heads // heads_k
        times = torch.zeros(heads, sq, sk, dtype=torch.float64, device="cuda")
        for h in range(heads):
            for m, (blocks, columns) in enumerate(pattern.lists[b][h]):
                rows = slice(m * BLOCK, min((m + 1) * BLOCK, sq))
                for start in blocks:
                    times[h, rows, start:min(start + BLOCK, sk)] += 1
                if columns:
                    times[h, rows].index_add_(
                        1, torch.tensor(columns, device="cuda"),
                        torch.ones(rows.stop - rows.start, len(columns), dtype=torch.float64,
                                   device="cuda"))
        if causal:
            i = torch.arange(sq, device="cuda").view(sq, 1)
            j = torch.arange(sk, device="cuda").view(1, sk)
            times = times * (j <= i + sk - sq)
        q64 = q.double()
        k64 = k.double().repeat_interleave(group, dim=1)
        v64 = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q64, k64) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores + torch.log(times)  # log 0 = -inf: not listed; log 2: listed twice
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v64).float())
        lses.append(lse.float())
    return torch.cat(outs), torch.cat(lses, dim=1)


def check_sparse(p, out, lse, ref_out, ref_lse, label: str, softcap: bool = False):
    empty = torch.isneginf(ref_lse)  # rows that see no key
    if empty.any():
        rows = empty.t()  # (total_q, H)
        assert (out.float()[rows] == 0).all(), f"{label}: rows that see no key are not 0"
        assert torch.isposinf(lse[empty]).all(), f"{label}: LSE of rows that see no key is not +inf"
    check(p, out, lse, ref_out, ref_lse, label=label, softcap=softcap)


def debug_checks_accept(pattern: Pattern, q_lens, k_lens, causal: bool) -> None:
    """The VFA_DEBUG_CHECKS index checks must accept every pattern the kernel runs right."""
    from vendored_flash_attn.sparse import check_sparse_indexes

    check_sparse_indexes(pattern.block_count, pattern.block_offset, pattern.column_count,
                         pattern.column_index,
                         seqlens_q=torch.tensor(q_lens, device="cuda"),
                         seqlens_k=torch.tensor(k_lens, device="cuda"), causal=causal)


# --- batched: sparse_attn_func --------------------------------------------------------------

BATCHED = {
    # name: (batch, seqlen_q, seqlen_k, heads, heads_k)
    "b2-70x130-mha4": (2, 70, 130, 4, 4),
    "b1-192x192-gqa8_2": (1, 192, 192, 8, 2),
    "b3-129x1000-mqa4_1": (3, 129, 1000, 4, 1),
    "b2-1x300-gqa4_2": (2, 1, 300, 4, 2),
}
KINDS = ("blocks", "columns", "mixed", "empty-rows")


def batched_cases():
    return [pytest.param(dtype, shape, kind, causal,
                         id=f"{dtype}-{shape}-{kind}-{'causal' if causal else 'full'}")
            for dtype in sparse_dtypes() for shape in BATCHED for kind in KINDS
            for causal in (False, True)]


def batched_problem(rng, dtype, shape):
    batch, sq, sk, heads, heads_k = BATCHED[shape]
    p = make_problem(rng, dtype=dtype, num_heads=heads, num_heads_k=heads_k, head_dim=HEAD_DIM,
                     q_lens=[sq] * batch, k_lens=[sk] * batch)
    q = p.q.view(batch, sq, heads, HEAD_DIM)
    k = p.k[:batch * sk].view(batch, sk, heads_k, HEAD_DIM)
    v = p.v[:batch * sk].view(batch, sk, heads_k, HEAD_DIM)
    return p, q, k, v


def run_batched(p, q, k, v, pattern, **opts):
    from vendored_flash_attn import sparse_attn_func

    out = torch.full_like(q, float("nan"))
    got, lse = sparse_attn_func(q, k, v, **pattern.kwargs(), out=out, return_softmax_lse=True,
                                **opts)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    batch, sq, heads, _ = q.shape
    assert lse.shape == (batch, heads, sq)
    # As the varlen layout: (total_q, H, D) and (H, total_q).
    return got.reshape(batch * sq, heads, HEAD_DIM), lse.permute(1, 0, 2).reshape(heads, batch * sq)


@pytest.mark.parametrize("dtype,shape,kind,causal", batched_cases())
def test_sparse_batched(dtype, shape, kind, causal, rng):
    require_sparse()
    p, q, k, v = batched_problem(rng, dtype, shape)
    pattern = make_pattern(rng, p.q_lens, p.k_lens, p.num_heads, kind, causal)
    debug_checks_accept(pattern, p.q_lens, p.k_lens, causal)
    out, lse = run_batched(p, q, k, v, pattern, causal=causal)
    ref_out, ref_lse = sparse_reference(p, pattern, causal=causal)
    check_sparse(p, out, lse, ref_out, ref_lse, f"sparse {shape} {kind} causal={causal}")


def test_sparse_batched_softcap(rng):
    require_sparse()
    dtype = sparse_dtypes()[0]
    p, q, k, v = batched_problem(rng, dtype, "b1-192x192-gqa8_2")
    pattern = make_pattern(rng, p.q_lens, p.k_lens, p.num_heads, "mixed", True)
    out, lse = run_batched(p, q * 4, k, v, pattern, causal=True, softcap=20.0)
    p.q_ref = [x * 4 for x in p.q_ref]
    ref_out, ref_lse = sparse_reference(p, pattern, causal=True, softcap=20.0)
    check_sparse(p, out, lse, ref_out, ref_lse, "sparse softcap20 causal", softcap=True)


# --- varlen: sparse_attn_varlen_func --------------------------------------------------------

VARLEN = {
    # name: (q lens, k lens, heads, heads_k). The longest sequence is not the first and the
    # lengths differ: upstream's op returns these LSEs scrambled and writes past its buffer.
    "prefill-gqa8_2": ([1, 37, 200, 130], [1, 37, 200, 130], 8, 2),
    "chunked-mha4": ([64, 5, 129], [700, 300, 1029], 4, 4),
    "mqa4_1-one-long": ([3, 500, 2], [70, 900, 64], 4, 1),
}


def varlen_cases():
    return [pytest.param(dtype, lens, kind, causal,
                         id=f"{dtype}-{lens}-{kind}-{'causal' if causal else 'full'}")
            for dtype in sparse_dtypes() for lens in VARLEN for kind in KINDS
            for causal in (False, True)]


def run_varlen(p, pattern, use_out=True, **opts):
    from vendored_flash_attn import sparse_attn_varlen_func

    out = torch.full_like(p.q, float("nan")) if use_out else None
    got, lse = sparse_attn_varlen_func(
        p.q, p.k, p.v, **pattern.kwargs(), cu_seqlens_q=p.cu_seqlens_q,
        cu_seqlens_k=p.cu_seqlens_k, max_seqlen_q=p.max_seqlen_q, max_seqlen_k=p.max_seqlen_k,
        out=out, return_softmax_lse=True, **opts)
    torch.cuda.synchronize()
    if use_out:
        assert got.data_ptr() == out.data_ptr(), "the result is not the out= buffer"
    assert got.shape == p.q.shape and torch.isfinite(got).all(), "output rows left unwritten"
    assert lse.shape == (p.num_heads, p.total_q)
    return got, lse


@pytest.mark.parametrize("dtype,lens,kind,causal", varlen_cases())
def test_sparse_varlen(dtype, lens, kind, causal, rng):
    require_sparse()
    q_lens, k_lens, heads, heads_k = VARLEN[lens]
    p = make_problem(rng, dtype=dtype, num_heads=heads, num_heads_k=heads_k, head_dim=HEAD_DIM,
                     q_lens=q_lens, k_lens=k_lens)
    pattern = make_pattern(rng, q_lens, k_lens, heads, kind, causal)
    debug_checks_accept(pattern, q_lens, k_lens, causal)
    out, lse = run_varlen(p, pattern, use_out=(kind != "mixed"), causal=causal)
    ref_out, ref_lse = sparse_reference(p, pattern, causal=causal)
    check_sparse(p, out, lse, ref_out, ref_lse, f"sparse varlen {lens} {kind} causal={causal}")


# --- a pattern that lists every key equals dense attention ----------------------------------

@pytest.mark.parametrize("kind", ["all-blocks", "all-columns"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_full_pattern_equals_dense(kind, causal, rng):
    require_sparse()
    from vendored_flash_attn import flash_attn_varlen_func

    dtype = sparse_dtypes()[0]
    q_lens, k_lens, heads, heads_k = VARLEN["chunked-mha4"]
    p = make_problem(rng, dtype=dtype, num_heads=heads, num_heads_k=heads_k, head_dim=HEAD_DIM,
                     q_lens=q_lens, k_lens=k_lens)
    pattern = make_pattern(rng, q_lens, k_lens, heads, kind, causal)
    out, lse = run_varlen(p, pattern, causal=causal)
    dense, dense_lse = flash_attn_varlen_func(**p.kwargs(), causal=causal, return_softmax_lse=True,
                                              fa_version=2)
    diff = relative_l2(out, dense)
    assert diff <= OUT_TOL[dtype], f"sparse ({kind}) and dense FA2 differ by {diff:.3e}"
    lse_diff = (lse - dense_lse).abs().max().item()
    assert lse_diff <= LSE_TOL[dtype], f"sparse ({kind}) and dense FA2 LSE differ by {lse_diff:.3e}"
    ref_out, ref_lse = sparse_reference(p, pattern, causal=causal)
    check_sparse(p, out, lse, ref_out, ref_lse, f"sparse {kind} = dense, causal={causal}")


# --- what the wheel lacks is refused ----------------------------------------------------------

@pytest.mark.parametrize("dtype", unbuilt_sparse_dtypes())
def test_unbuilt_dtype_is_refused(dtype, rng):
    require_sparse()
    p, q, k, v = batched_problem(rng, dtype, "b2-70x130-mha4")
    pattern = make_pattern(rng, p.q_lens, p.k_lens, p.num_heads, "mixed", False)
    from vendored_flash_attn import sparse_attn_func

    message = expect_refused(lambda: sparse_attn_func(q, k, v, **pattern.kwargs()), "no FA2 kernels")
    assert "rebuild" in message


def test_refused_without_sparse_kernels(rng):
    """A wheel without usable sparse kernels refuses the call before any kernel, naming
    its own cause and fix: the 'sparse' feature left out (VFA_FA2_FEATURES), or head dim
    128 left out of the FA2 selection (a slice of `full`; VFA_FA2_HEAD_DIMS)."""
    require(2)
    fragments = sparse_refusal_fragments()
    if not fragments:
        pytest.skip("this wheel has the sparse kernels (the refusal is tested on CPU in "
                    "tests/unit/test_sparse.py)")
    p = make_problem(rng, dtype="bf16", num_heads=2, num_heads_k=2, head_dim=HEAD_DIM,
                     q_lens=[70], k_lens=[70])
    pattern = make_pattern(rng, p.q_lens, p.k_lens, 2, "all-blocks", False)
    from vendored_flash_attn import sparse_attn_func

    message = expect_refused(lambda: sparse_attn_func(p.q[None], p.k[:70][None], p.v[:70][None],
                                                      **pattern.kwargs()), fragments[0])
    for fragment in fragments[1:]:
        assert fragment.lower() in message.lower(), (fragment, message)


# --- VFA_DEBUG_CHECKS=1 on the device: bad values refused, the context stays usable ---------

def test_debug_checks_refuse_out_of_bounds_indexes(rng, real_machine, monkeypatch):
    require_sparse()
    from vendored_flash_attn import sparse_attn_varlen_func
    from vendored_flash_attn.selection.environment import set_environment

    monkeypatch.setenv("VFA_DEBUG_CHECKS", "1")
    set_environment(None)
    q_lens, k_lens, heads, heads_k = VARLEN["mqa4_1-one-long"]
    p = make_problem(rng, dtype=sparse_dtypes()[0], num_heads=heads, num_heads_k=heads_k,
                     head_dim=HEAD_DIM, q_lens=q_lens, k_lens=k_lens)
    pattern = make_pattern(rng, q_lens, k_lens, heads, "all-columns", False)

    def call(**changes):
        kw = dict(pattern.kwargs(), **changes)
        return sparse_attn_varlen_func(p.q, p.k, p.v, **kw, cu_seqlens_q=p.cu_seqlens_q,
                                       cu_seqlens_k=p.cu_seqlens_k, max_seqlen_q=p.max_seqlen_q,
                                       max_seqlen_k=p.max_seqlen_k)

    far = pattern.column_index.clone()
    far[2, 0, 0, 0] = 1 << 30  # the last sequence: a read far outside k
    expect_refused(lambda: call(column_index=far), "outside the sequence's keys")
    many = pattern.column_count.clone()
    many[1, 3, 0] = pattern.column_index.shape[-1] + 1
    expect_refused(lambda: call(column_count=many), "read past the row")
    out = call()  # the context is intact and a good call still runs
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


# --- evidence for what sparse.py works around (the raw ops, called safely) -------------------

def _raw_ops():
    require_sparse()
    from vendored_flash_attn.selection.environment import current_environment
    from vendored_flash_attn.interface import OP_NAMESPACES

    assert current_environment().load_module(2) is None
    return getattr(torch.ops, OP_NAMESPACES[2])


def test_raw_varlen_op_writes_the_padded_lse_layout(rng):
    """Upstream's varlen_fwd_sparse writes the LSE as (batch, heads, max_seqlen_q) into a
    (heads, q rows) buffer. Called here with q padded to batch * max_seqlen_q rows (so the
    writes stay inside), the raw buffer holds the padded layout, not (heads, total_q) -
    which is why sparse_attn_varlen_func pads q and re-lays the LSE out."""
    ops = _raw_ops()
    q_lens, k_lens, heads, heads_k = [3, 70, 5], [80, 90, 100], 2, 2
    p = make_problem(rng, dtype=sparse_dtypes()[0], num_heads=heads, num_heads_k=heads_k,
                     head_dim=HEAD_DIM, q_lens=q_lens, k_lens=k_lens)
    pattern = make_pattern(rng, q_lens, k_lens, heads, "all-columns", False)
    batch, max_q = len(q_lens), max(q_lens)
    q_pad = p.q.new_zeros((batch * max_q, heads, HEAD_DIM))
    q_pad[:p.total_q] = p.q
    _, raw = ops.varlen_fwd_sparse.default(
        q_pad, p.k, p.v, *pattern.kwargs().values(), None, p.cu_seqlens_q, p.cu_seqlens_k, None,
        None, max_q, p.max_seqlen_k, 0.0, HEAD_DIM ** -0.5, False, False, 0.0, False, None)[:2]
    torch.cuda.synchronize()
    _, ref_lse = sparse_reference(p, pattern, causal=False)
    padded = raw.reshape(-1)[:batch * heads * max_q].view(batch, heads, max_q)
    starts = p.cu_seqlens_q.tolist()
    for b, n in enumerate(q_lens):
        got = padded[b, :, :n]
        want = ref_lse[:, starts[b]:starts[b] + n]
        assert (got - want).abs().max().item() <= LSE_TOL[p.dtype], f"sequence {b}"


def test_raw_op_adds_alibi_only_in_the_masked_block(rng):
    """Why sparse_attn_* refuse alibi_slopes: with three listed blocks (non-causal, no
    columns) the kernel's ALiBi bias lands on the last listed block only."""
    ops = _raw_ops()
    sq, sk, heads = 64, 192, 2
    p = make_problem(rng, dtype=sparse_dtypes()[0], num_heads=heads, num_heads_k=heads,
                     head_dim=HEAD_DIM, q_lens=[sq], k_lens=[sk])
    one = torch.ones(1, heads, 1, dtype=torch.int32, device="cuda")
    offsets = torch.tensor([0, 64, 128], dtype=torch.int32, device="cuda").expand(1, heads, 1, 3)
    slopes = torch.tensor([0.5, 0.25], device="cuda")
    q, k, v = p.q[None], p.k[:sk][None], p.v[:sk][None]
    out, lse = ops.fwd_sparse.default(q, k, v, one * 3, offsets.contiguous(), one * 0,
                                      torch.zeros(1, heads, 1, 1, dtype=torch.int32, device="cuda"),
                                      None, slopes, 0.0, HEAD_DIM ** -0.5, False, 0.0, False, None)[:2]
    torch.cuda.synchronize()
    i = torch.arange(sq, device="cuda").view(sq, 1)
    j = torch.arange(sk, device="cuda").view(1, sk)
    distance = (i + sk - sq - j).abs().double()
    scores = torch.einsum("qhd,khd->hqk", p.q_ref[0].double(), p.k_ref[0].double()) * HEAD_DIM ** -0.5

    def attend(bias):
        s = scores + bias
        return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), p.v_ref[0].double())

    alibi = -slopes.double().view(heads, 1, 1) * distance
    last_block_only = alibi * (j >= 128)
    got = out[0].float()
    err_last = relative_l2(got, attend(last_block_only).float())
    err_alibi = relative_l2(got, attend(alibi).float())
    assert err_last <= OUT_TOL[p.dtype], f"bias on the last block only: error {err_last:.3e}"
    assert err_alibi > 10 * OUT_TOL[p.dtype], f"true ALiBi matches ({err_alibi:.3e}): refusal not needed"

