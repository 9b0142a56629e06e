"""sparse_attn_func / sparse_attn_varlen_func on CPU: the exact
arguments handed to FA2's sparse ops (fake ops with upstream's schemas), refusals before
any op runs, the VFA_DEBUG_CHECKS index checks, and the varlen LSE fix."""

from __future__ import annotations

import pytest
import torch

from runtime_fakes import AMPERE, HOPPER, TURING, _arg_names, make_build
from vendored_flash_attn import sparse_attn_func, sparse_attn_varlen_func
from vendored_flash_attn.errors import (
    FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError)
from vendored_flash_attn.declaration.op_schemas import FA2_FWD_SPARSE, FA2_VARLEN_FWD_SPARSE

BF16, FP16 = torch.bfloat16, torch.float16
I32 = torch.int32

# Schemas as upstream's FA2 module registers them (the package's copy, which a GPU test
# compares with the compiled module).
FWD_SPARSE, VARLEN_FWD_SPARSE = FA2_FWD_SPARSE, FA2_VARLEN_FWD_SPARSE

# Upstream's signatures of both functions: tests/unit/test_call.py (with flash_attn_varlen_func's).


# --- fake ops: record the arguments by schema name; emulate the kernel's output layout ----

def _lse_code(b: int, h: int, r: int) -> float:
    return 10000.0 * h + 100.0 * b + r


def _fwd_sparse(a):
    q = a["q"]
    out = torch.zeros_like(q) if a["out"] is None else a["out"]
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    return [out, lse]


def _varlen_fwd_sparse(a):
    """Writes the LSE where upstream's kernel does: (b * num_heads + h) * max_seqlen_q + row,
    into a buffer sized (num_heads, q.shape[0]); a write past its end is what corrupts
    device memory on the GPU, so here it raises."""
    q, cu, seqlen_q = a["q"], a["cu_seqlens_q"].tolist(), a["max_seqlen_q"]
    num_heads = q.shape[1]
    out = torch.zeros_like(q) if a["out"] is None else a["out"]
    lse = torch.full((num_heads, q.shape[0]), float("nan"))
    flat = lse.view(-1)
    for b in range(len(cu) - 1):
        out[cu[b]:cu[b + 1]] = b + 1
        for h in range(num_heads):
            for r in range(cu[b + 1] - cu[b]):
                index = (b * num_heads + h) * seqlen_q + r
                if index >= flat.numel():
                    raise AssertionError(f"fake kernel: LSE write at {index} past the end of a "
                                         f"buffer of {flat.numel()} floats")
                flat[index] = _lse_code(b, h, r)
    return [out, lse]


_libraries: list = []


@pytest.fixture
def sparse_ops(fake_ops):
    """fake_ops (which defines the namespaces) plus the two sparse ops, same recorder."""
    if not _libraries:
        lib = torch.library.Library("_vendored_fa2_C", "FRAGMENT")
        for schema, result in ((FWD_SPARSE, _fwd_sparse), (VARLEN_FWD_SPARSE, _varlen_fwd_sparse)):
            name = schema[:schema.index("(")]
            names = _arg_names(schema)
            lib.define(schema)

            def kernel(*args, name=name, names=names, result=result):
                fake_ops.calls.append((name, dict(zip(names, args))))
                return result(dict(zip(names, args)))

            lib.impl(name, kernel, "CPU")
        _libraries.append(lib)
    return fake_ops


# --- calls --------------------------------------------------------------------------------

def _idx(values, shape):
    return torch.tensor(values, dtype=I32).reshape(shape)


def batched_call(batch=2, seqlen_q=70, seqlen_k=130, heads=4, kv_heads=2, d=128, dtype=BF16):
    """Every query block reads blocks [0, 64) and [64, 128) and columns 128, 129: all keys."""
    rows = (seqlen_q + 63) // 64
    n = batch * heads * rows
    return dict(
        q=torch.randn(batch, seqlen_q, heads, d).to(dtype),
        k=torch.randn(batch, seqlen_k, kv_heads, d).to(dtype),
        v=torch.randn(batch, seqlen_k, kv_heads, d).to(dtype),
        block_count=_idx([2] * n, (batch, heads, rows)),
        block_offset=_idx([0, 64] * n, (batch, heads, rows, 2)),
        column_count=_idx([2] * n, (batch, heads, rows)),
        column_index=_idx([128, 129, 0] * n, (batch, heads, rows, 3)),
    )


def varlen_call(q_lens=(2, 5), k_lens=(130, 70), heads=2, kv_heads=1, d=128, dtype=BF16):
    """Per sequence: block [0, 64) and the remaining keys as columns."""
    batch, max_q = len(q_lens), max(q_lens)
    rows = (max_q + 63) // 64
    nnz_v = max(k_lens) - 64
    counts, columns = [], []
    for k_len in k_lens:
        cols = list(range(64, k_len))
        counts += [len(cols)] * (heads * rows)
        columns += (cols + [0] * (nnz_v - len(cols))) * (heads * rows)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=I32)  # noqa: E731
    return dict(
        q=torch.randn(sum(q_lens), heads, d).to(dtype),
        k=torch.randn(sum(k_lens), kv_heads, d).to(dtype),
        v=torch.randn(sum(k_lens), kv_heads, d).to(dtype),
        block_count=_idx([1] * (batch * heads * rows), (batch, heads, rows)),
        block_offset=_idx([0] * (batch * heads * rows), (batch, heads, rows, 1)),
        column_count=_idx(counts, (batch, heads, rows)),
        column_index=_idx(columns, (batch, heads, rows, nnz_v)),
        cu_seqlens_q=cu(q_lens), cu_seqlens_k=cu(k_lens), max_seqlen_q=max_q,
        max_seqlen_k=max(k_lens),
    )


def same(a, b) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


# --- dispatch -----------------------------------------------------------------------------

def test_fwd_sparse_arguments(describe, sparse_ops):
    describe(caps=(AMPERE,))
    call = batched_call()
    out = torch.empty_like(call["q"])
    result, lse = sparse_attn_func(**call, softmax_scale=0.3, causal=True, softcap=5.0, out=out,
                                   return_softmax_lse=True)
    args = sparse_ops.last("fwd_sparse")
    assert list(args) == _arg_names(FWD_SPARSE)
    for name in ("q", "k", "v", "block_count", "block_offset", "column_count", "column_index"):
        assert same(args[name], call[name]), name
    assert same(args["out"], out) and result.data_ptr() == out.data_ptr()
    assert args["alibi_slopes"] is None and args["gen"] is None
    assert args["p_dropout"] == 0.0 and args["return_softmax"] is False
    assert args["softmax_scale"] == 0.3 and args["softcap"] == 5.0 and args["is_causal"] is True
    assert lse.shape == (2, 4, 70)


def test_fwd_sparse_defaults(describe, sparse_ops):
    describe(caps=(HOPPER,))
    result = sparse_attn_func(**batched_call())
    args = sparse_ops.last("fwd_sparse")
    assert args["softmax_scale"] == pytest.approx(128 ** -0.5)
    assert args["is_causal"] is False and args["softcap"] == 0.0 and args["out"] is None
    assert isinstance(result, torch.Tensor) and result.shape == (2, 70, 4, 128)


def test_varlen_fwd_sparse_arguments(describe, sparse_ops):
    describe(caps=(AMPERE,))
    call = varlen_call(q_lens=(5, 5), k_lens=(130, 70))  # batch * max_seqlen_q == total_q
    out = torch.empty_like(call["q"])
    sparse_attn_varlen_func(**call, softmax_scale=0.3, causal=True, softcap=5.0, out=out)
    args = sparse_ops.last("varlen_fwd_sparse")
    assert list(args) == _arg_names(VARLEN_FWD_SPARSE)
    for name in ("q", "k", "v", "block_count", "block_offset", "column_count", "column_index",
                 "cu_seqlens_q", "cu_seqlens_k"):
        assert same(args[name], call[name]), name
    assert same(args["out"], out)  # no copy when q already has batch * max_seqlen_q rows
    assert args["seqused_k"] is None and args["alibi_slopes"] is None and args["gen"] is None
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (5, 130)
    assert args["p_dropout"] == 0.0 and args["zero_tensors"] is False
    assert args["return_softmax"] is False
    assert args["softmax_scale"] == 0.3 and args["softcap"] == 5.0 and args["is_causal"] is True


@pytest.mark.parametrize("use_out", [False, True], ids=["allocated", "out"])
def test_varlen_lse_layout_and_buffer(describe, sparse_ops, use_out):
    # Lengths 2 and 5: the kernel's (batch, heads, max_seqlen_q) LSE needs 2 * 2 * 5 = 20
    # floats, the op's buffer for this q holds 2 * 7 = 14.
    describe(caps=(AMPERE,))
    call = varlen_call(q_lens=(2, 5), k_lens=(130, 70), heads=2)
    out = torch.full_like(call["q"], -1.0) if use_out else None
    result, lse = sparse_attn_varlen_func(**call, out=out, return_softmax_lse=True)
    assert result.shape == (7, 2, 128)
    if use_out:
        assert result is out
    # The fake kernel marks the rows of sequence b with b + 1.
    assert result[:2].eq(1).all() and result[2:].eq(2).all()
    want = torch.tensor([[_lse_code(b, h, r) for b, n in enumerate((2, 5)) for r in range(n)]
                         for h in range(2)])
    assert lse.shape == (2, 7) and torch.equal(lse, want)
    assert sparse_ops.last("varlen_fwd_sparse")["q"].shape[0] >= 10


def test_varlen_lse_of_tokens_outside_every_sequence(describe, sparse_ops):
    describe(caps=(AMPERE,))
    call = varlen_call(q_lens=(3, 3), k_lens=(70, 70), heads=1)
    call["cu_seqlens_q"] = torch.tensor([0, 3, 5], dtype=I32)  # q row 5 belongs to no sequence
    _, lse = sparse_attn_varlen_func(**call, return_softmax_lse=True)
    assert lse[0, :5].tolist() == [0.0, 1.0, 2.0, 100.0, 101.0] and lse[0, 5] == float("inf")


# --- refusals -----------------------------------------------------------------------------

def _with(**changes):
    return lambda call: {**call, **changes}


def _map(name, fn):
    return lambda call: {**call, name: fn(call)}


NO_SPARSE = make_build("full", fa2={"features": []})
SPARSE_NO_128 = make_build("full", fa2={"head_dims": [64, 256]})
BF16_ONLY = make_build("full", fa2={"dtypes": ["bf16"]})

# (id, function, build, call, change, exception, message pattern)
CASES = [
    ("not-built", "batched", NO_SPARSE, batched_call(), None, FlashAttnInputError,
     r"needs the FA2 'sparse' kernels, which this wheel was built without .*VFA_FA2_FEATURES=sparse"),
    ("not-built-varlen", "varlen", NO_SPARSE, varlen_call(), None, FlashAttnInputError,
     r"VFA_FA2_FEATURES=sparse"),
    # A wheel without the kernels says so before it looks at the shapes.
    ("not-built-before-shapes", "batched", NO_SPARSE, batched_call(), _map("q", lambda c: c["q"][0]),
     FlashAttnInputError, r"VFA_FA2_FEATURES=sparse"),
    ("hdim128-not-built", "batched", SPARSE_NO_128, batched_call(), None, FlashAttnInputError,
     r"built for head dim 128 only.*FA2 head dims built: 64, 256"),
    ("fp16-not-built", "batched", BF16_ONLY, batched_call(dtype=FP16), None, FlashAttnTypeError,
     r"no FA2 kernels for float16 \(FA2 dtypes built: bfloat16\)"),
    ("head-size-64", "batched", "full", batched_call(d=64), None, FlashAttnInputError,
     r"take head size 128 only .*got 64"),
    ("head-size-120-varlen", "varlen", "full", varlen_call(d=120), None, FlashAttnInputError,
     r"take head size 128 only"),
    ("float32", "batched", "full", batched_call(dtype=torch.float32), None, FlashAttnTypeError,
     r"q: FA2 supports dtypes bfloat16, float16, got float32"),
    ("k-dtype", "batched", "full", batched_call(), _map("k", lambda c: c["k"].half()),
     FlashAttnTypeError, r"k has dtype torch.float16 but q has torch.bfloat16"),
    ("q-3d", "batched", "full", batched_call(), _map("q", lambda c: c["q"][0]), FlashAttnInputError,
     r"q must be 4-D .*packed sequences go to sparse_attn_varlen_func"),
    ("q-4d-varlen", "varlen", "full", varlen_call(), _map("q", lambda c: c["q"][None]),
     FlashAttnInputError, r"q must be 3-D .*batched \(4-D\) inputs go to sparse_attn_func"),
    ("kv-batch", "batched", "full", batched_call(), _map("v", lambda c: c["v"][:1]),
     FlashAttnInputError, r"k and v must have the same shape"),
    ("gqa-ratio", "batched", "full", batched_call(heads=4, kv_heads=3), None, FlashAttnInputError,
     r"multiple of the number of k/v heads"),
    ("index-int64", "batched", "full", batched_call(),
     _map("block_offset", lambda c: c["block_offset"].long()), FlashAttnTypeError,
     r"block_offset must have dtype torch.int32, got torch.int64"),
    ("index-kv-heads", "batched", "full", batched_call(heads=4, kv_heads=2),
     _map("column_count", lambda c: c["column_count"][:, :2].contiguous()), FlashAttnInputError,
     r"column_count must have shape \(batch, num_heads, cdiv\(seqlen_q, 64\)\) = \(2, 4, 2\), "
     r"got \(2, 2, 2\) \(num_heads counts q heads"),
    ("index-num-rows", "batched", "full", batched_call(),
     _map("block_count", lambda c: c["block_count"][:, :, :1].contiguous()), FlashAttnInputError,
     r"block_count must have shape .* = \(2, 4, 2\), got \(2, 4, 1\)"),
    ("index-missing-nnz", "batched", "full", batched_call(),
     _map("column_index", lambda c: c["column_index"][..., 0].contiguous()), FlashAttnInputError,
     r"column_index must have shape \(batch, num_heads, cdiv\(seqlen_q, 64\), NNZ\) = \(2, 4, 2, NNZ\)"),
    ("index-varlen-num-rows", "varlen", "full", varlen_call(), _with(max_seqlen_q=65),
     FlashAttnInputError, r"block_count must have shape .* = \(2, 2, 2\), got \(2, 2, 1\)"),
    ("index-strided", "batched", "full", batched_call(),
     _map("block_offset", lambda c: c["block_offset"].transpose(0, 1).contiguous().transpose(0, 1)),
     FlashAttnInputError, r"block_offset must be contiguous \(the kernel reads it through a raw pointer\)"),
    ("index-not-tensor", "batched", "full", batched_call(), _with(block_count=[2, 2]),
     FlashAttnTypeError, r"block_count must be a torch.Tensor, got list"),
    ("index-device", "batched", "full", batched_call(),
     _map("column_index", lambda c: c["column_index"].to("meta")), FlashAttnInputError,
     r"column_index is on meta but q is on cpu"),
    ("out-dtype", "batched", "full", batched_call(), _map("out", lambda c: c["q"].float()),
     FlashAttnTypeError, r"out has dtype torch.float32; it must be torch.bfloat16"),
    ("out-shape", "varlen", "full", varlen_call(), _map("out", lambda c: c["q"][:3]),
     FlashAttnInputError, r"out must have shape \(7, 2, 128\)"),
    ("dropout", "batched", "full", batched_call(), _with(dropout_p=0.1), FlashAttnInputError,
     r"dropout_p must be 0.0"),
    ("alibi", "batched", "full", batched_call(), _with(alibi_slopes=torch.ones(4)),
     FlashAttnInputError, r"alibi_slopes is not supported by the sparse kernels"),
    ("softcap-negative", "varlen", "full", varlen_call(), _with(softcap=-1.0), FlashAttnInputError,
     r"softcap must be >= 0"),
    ("empty-q", "batched", "full", batched_call(seqlen_q=0), None, FlashAttnInputError,
     r"at least one query"),
    ("cu_seqlens-int64", "varlen", "full", varlen_call(),
     _map("cu_seqlens_k", lambda c: c["cu_seqlens_k"].long()), FlashAttnTypeError,
     r"cu_seqlens_k must have dtype torch.int32"),
    ("cu_seqlens-length", "varlen", "full", varlen_call(),
     _map("cu_seqlens_k", lambda c: c["cu_seqlens_k"][:2]), FlashAttnInputError,
     r"cu_seqlens_k must have batch_size \+ 1 = 3 entries"),
    ("max_seqlen-tensor", "varlen", "full", varlen_call(), _with(max_seqlen_q=torch.tensor(5)),
     FlashAttnTypeError, r"max_seqlen_q must be a Python int, got a tensor"),
    ("max_seqlen_q-0", "varlen", "full", varlen_call(), _with(max_seqlen_q=0), FlashAttnInputError,
     r"max_seqlen_q must be >= 1"),
]


def _call(kind, kwargs):
    return (sparse_attn_func if kind == "batched" else sparse_attn_varlen_func)(**kwargs)


@pytest.mark.parametrize("kind, build, call, change, error, pattern", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_call_is_refused_before_the_op(describe, sparse_ops, kind, build, call, change, error,
                                           pattern):
    describe(caps=(AMPERE,), build=build)
    with pytest.raises(error, match=pattern):
        _call(kind, change(call) if change else call)
    assert sparse_ops.calls == []


@pytest.mark.parametrize("machine, error, pattern", [
    (dict(caps=(TURING,)), FlashAttnUnavailableError, r"needs FA2, which cannot run here: .*8.0"),
    (dict(caps=()), FlashAttnUnavailableError, r"no CUDA GPU is visible"),
    (dict(caps=(AMPERE,), module_errors={2: "ImportError: undefined symbol: foo"}),
     FlashAttnUnavailableError, r"undefined symbol: foo"),
    (dict(caps=(AMPERE,), build=make_build("full", fa2={"built": False, "reason": "arch list"})),
     FlashAttnUnavailableError, r"built without FA2: arch list"),
    (dict(caps=(AMPERE,), device_type="cuda"), FlashAttnInputError, r"q is on cpu, but .* CUDA"),
], ids=["turing", "no-gpu", "import-error", "fa2-not-built", "q-on-cpu"])
def test_fa2_not_usable(describe, sparse_ops, machine, error, pattern):
    describe(**machine)
    with pytest.raises(error, match=pattern):
        sparse_attn_func(**batched_call())
    assert sparse_ops.calls == []


def test_gqa_index_tensors_count_q_heads(describe, sparse_ops):
    describe(caps=(AMPERE,))
    sparse_attn_func(**batched_call(heads=8, kv_heads=2))
    assert sparse_ops.last("fwd_sparse")["block_count"].shape == (2, 8, 2)


def test_empty_nnz_is_accepted(describe, sparse_ops):
    # Upstream's own test passes NNZ_S = 0 (block_offset of shape (b, h, rows, 0)).
    describe(caps=(AMPERE,))
    call = batched_call(seqlen_k=3)
    call.update(block_count=torch.zeros_like(call["block_count"]),
                block_offset=torch.zeros(2, 4, 2, 0, dtype=I32))
    sparse_attn_func(**call)
    assert sparse_ops.last("fwd_sparse")["block_offset"].shape == (2, 4, 2, 0)


# --- VFA_DEBUG_CHECKS=1: index values --------------------------------------------------------

def _set(name, index, value):
    def change(call):
        x = call[name].clone()
        x[index] = value
        return {**call, name: x}
    return change


def _chain(*changes):
    def change(call):
        for c in changes:
            call = c(call)
        return call
    return change


def _causal_blocks():
    """seqlen 192 (3 query blocks), causal; row block m lists blocks 0..m in order."""
    call = batched_call(batch=1, seqlen_q=192, seqlen_k=192, heads=1, kv_heads=1)
    call["block_count"] = _idx([1, 2, 3], (1, 1, 3))
    call["block_offset"] = _idx([0, 0, 0, 0, 64, 0, 0, 64, 128], (1, 1, 3, 3))
    call["column_count"] = _idx([0, 0, 0], (1, 1, 3))
    return call


def _causal_columns():
    """seqlen 256 (4 query blocks), causal; block 3 lists columns 0..191 in order (3 chunks)."""
    call = batched_call(batch=1, seqlen_q=256, seqlen_k=256, heads=1, kv_heads=1)
    call["block_count"] = _idx([0, 0, 0, 1], (1, 1, 4))
    call["block_offset"] = _idx([0, 0, 0, 192], (1, 1, 4, 1))
    call["column_count"] = _idx([0, 0, 0, 192], (1, 1, 4))
    call["column_index"] = torch.arange(192, dtype=I32).repeat(4).reshape(1, 1, 4, 192).contiguous()
    return call


DEBUG_CASES = [
    ("block-count-above-nnz", "batched", False, batched_call(), _set("block_count", (1, 2, 0), 3),
     r"block_count\[1, 2, 0\] = 3 is outside \[0, 2\] \(block_offset has 2 entries per row\)"),
    ("column-count-negative", "batched", False, batched_call(), _set("column_count", (0, 0, 1), -1),
     r"column_count\[0, 0, 1\] = -1 is outside \[0, 3\]"),
    ("block-offset-negative", "batched", False, batched_call(), _set("block_offset", (0, 1, 1, 0), -64),
     r"block_offset\[0, 1, 1, 0\] = -64 is outside the sequence's keys \[0, 130\)"),
    ("column-past-keys", "batched", False, batched_call(), _set("column_index", (1, 3, 0, 1), 130),
     r"column_index\[1, 3, 0, 1\] = 130 is outside the sequence's keys \[0, 130\)"),
    ("inner-block-past-keys", "batched", False, batched_call(),
     _chain(_set("block_offset", (0, 0, 0, 0), 100)),
     r"block_offset\[0, 0, 0, 0\] = 100: block \[100, 164\) runs past the sequence's 130 keys"),
    ("varlen-column-past-own-sequence", "varlen", False, varlen_call(),
     _set("column_index", (1, 0, 0, 5), 70),
     r"column_index\[1, 0, 0, 5\] = 70 is outside the sequence's keys \[0, 70\)"),
    ("varlen-cu_seqlens", "varlen", False, varlen_call(),
     _with(cu_seqlens_k=torch.tensor([0, 130, 150], dtype=I32)),
     r"column_index\[1, 0, 0, 0\] = 64 is outside the sequence's keys \[0, 20\)"),
    ("causal-block-order", "batched", True, _causal_blocks(),
     _chain(_set("block_count", (0, 0, 0), 3), _set("block_offset", (0, 0, 0, 0), 128)),
     r"block_offset\[0, 0, 0, 0\] = 128: a block the causal mask does not cover .* query row 0"),
    ("causal-column-order", "batched", True, _causal_columns(),
     _set("column_index", (0, 0, 3, 3), 255),
     r"column_index\[0, 0, 3, 3\] = 255: a column the causal mask does not cover"),
]


@pytest.mark.parametrize("kind, causal, call, change, pattern", [c[1:] for c in DEBUG_CASES],
                         ids=[c[0] for c in DEBUG_CASES])
def test_debug_checks(describe, sparse_ops, kind, causal, call, change, pattern):
    bad = change(call)
    describe(caps=(AMPERE,))
    _call(kind, {**bad, "causal": causal})  # not checked without VFA_DEBUG_CHECKS
    describe(caps=(AMPERE,), env={"VFA_DEBUG_CHECKS": "1"})
    sparse_ops.calls.clear()
    with pytest.raises(FlashAttnInputError, match=pattern):
        _call(kind, {**bad, "causal": causal})
    assert sparse_ops.calls == []


@pytest.mark.parametrize("kind, causal, call", [
    ("batched", False, batched_call()),
    ("varlen", False, varlen_call()),
    ("batched", True, _causal_blocks()),
    ("batched", True, _causal_columns()),
], ids=["full-cover", "varlen", "causal-blocks", "causal-columns"])
def test_debug_checks_pass_good_patterns(describe, sparse_ops, kind, causal, call):
    describe(caps=(AMPERE,), env={"VFA_DEBUG_CHECKS": "1"})
    _call(kind, {**call, "causal": causal})
    assert len(sparse_ops.calls) == 1


def test_debug_checks_ignore_rows_the_kernel_skips(describe, sparse_ops):
    # Sequence 0 has 2 queries, so only its query block 0 runs; block 1's entries are junk.
    describe(caps=(AMPERE,), env={"VFA_DEBUG_CHECKS": "1"})
    call = varlen_call(q_lens=(2, 70), k_lens=(130, 70))
    call["block_count"][0, :, 1] = 99
    call["column_index"][0, :, 1] = -5
    sparse_attn_varlen_func(**call)
    assert len(sparse_ops.calls) == 1
