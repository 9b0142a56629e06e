"""FP8 (e4m3) attention on FA3: q/k/v float8_e4m3fn, bf16 output, float32 descales of
shape (num_seqs, num_kv_heads) that differ per KV head and per sequence, given with real
strides, through a non-contiguous view, as a stride-0 expanded scalar, and with q reusing
k's scale (make_fp8_descales without a q scale). The reference dequantises the very FP8
values the kernel reads (``fp8.float() * descale[seq, kv_head]``, q heads using the descale
of their KV head) and computes in float32.
"""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import (OUT_TOL, built_head_dims, chunked_lengths, component,
                         decode_lengths, expect_refused, fa3_has_fp8, make_problem,
                         prefill_lengths, primary_head_dim, reference, relative_l2, require,
                         require_fp8, run_attention, run_checked)

pytestmark = pytest.mark.gpu

# id -> heads, lengths, page size, descale layout, options
CASES = {
    "varlen-gqa32_8-causal-per_seq_head": dict(heads=(32, 8), lens="prefill", descales="per_seq_head",
                                               causal=True),
    "varlen-gqa32_8-causal-strided": dict(heads=(32, 8), lens="prefill", descales="strided",
                                          causal=True),
    "varlen-mha8-scalar_stride0": dict(heads=(8, 8), lens="prefill", descales="scalar"),
    "varlen-mqa8_1-causal-chunked-q_reuses_k": dict(heads=(8, 1), lens="chunked", descales="reuse_k",
                                                    causal=True),
    "varlen-gqa32_8-causal-window128-per_seq_head": dict(heads=(32, 8), lens="prefill",
                                                         descales="per_seq_head", causal=True,
                                                         window=(128, 0)),
    "paged16-decode-gqa32_8-per_seq_head": dict(heads=(32, 8), lens="decode", page=16,
                                                descales="per_seq_head", causal=True),
    "paged256-chunked-gqa16_2-scalar_stride0": dict(heads=(16, 2), lens="chunked", page=256,
                                                    descales="scalar", causal=True),
    "paged16-decode-gqa32_8-strided-splits3": dict(heads=(32, 8), lens="decode", page=16,
                                                   descales="strided", causal=True, num_splits=3),
}
LENGTHS = {"prefill": prefill_lengths, "chunked": chunked_lengths, "decode": decode_lengths}


def fp8_head_dims():
    dims = [h for h in built_head_dims(3) if h % 16 == 0]
    return dims or [128]


def make_fp8(rng, case: str, head_dim: int):
    spec = CASES[case]
    hq, hk = spec["heads"]
    q_lens, k_lens = LENGTHS[spec["lens"]](rng)
    return make_problem(rng, dtype="e4m3", num_heads=hq, num_heads_k=hk, head_dim=head_dim,
                        q_lens=q_lens, k_lens=k_lens, page_size=spec.get("page"),
                        descale_kind=spec["descales"])


def fp8_cases():
    cases = []
    for case in CASES:
        dims = fp8_head_dims() if case.startswith("varlen-gqa32_8-causal-per") else [primary_head_dim(3)]
        for head_dim in dims:
            cases.append(pytest.param(case, head_dim, id=f"fa3-e4m3-hd{head_dim}-{case}"))
    return cases


@pytest.mark.parametrize("case,head_dim", fp8_cases())
def test_fp8(case, head_dim, rng):
    require_fp8()
    spec = CASES[case]
    p = make_fp8(rng, case, head_dim)
    qd, kd, vd = p.descales
    if spec["descales"] == "scalar":
        assert all(d.stride() == (0, 0) for d in (qd, kd, vd)), [d.stride() for d in (qd, kd, vd)]
    if spec["descales"] == "reuse_k":
        assert qd.data_ptr() == kd.data_ptr()
    out, _ = run_checked(p, 3, f"FA3 fp8 {case}", causal=spec.get("causal", False),
                         window=spec.get("window"), num_splits=spec.get("num_splits", 0))
    assert out.dtype == torch.bfloat16


def test_fp8_descales_are_applied_per_head_and_sequence(rng):
    """The same inputs with the descales rolled by one KV head (and, separately, by one
    sequence) must miss the reference by far more than the tolerance: the kernel reads
    each (sequence, head) entry, and the FP8 tolerance is tight enough to see it."""
    require_fp8()
    p = make_fp8(rng, "varlen-gqa32_8-causal-per_seq_head", primary_head_dim(3))
    ref_out, _ = reference(p, causal=True)
    good, _ = run_attention(p, version=3, causal=True)
    assert relative_l2(good, ref_out) <= OUT_TOL["e4m3"]
    for dim, what in ((1, "KV head"), (0, "sequence")):
        rolled = tuple(d.roll(1, dims=dim) for d in p.descales)
        p_wrong = type(p)(**{**p.__dict__, "descales": rolled})
        wrong, _ = run_attention(p_wrong, version=3, causal=True)
        err = relative_l2(wrong, ref_out)
        assert err > 3 * OUT_TOL["e4m3"], (
            f"descales rolled by one {what} still match the reference ({err:.3e}): the test "
            f"cannot tell per-{what} descales apart")


def test_fp8_without_e4m3_kernels_is_refused(rng):
    require(3)
    if fa3_has_fp8():
        pytest.skip("this wheel has FA3 e4m3 kernels (test_fp8 covers them)")
    p = make_problem(rng, dtype="e4m3", num_heads=4, num_heads_k=2,
                     head_dim=primary_head_dim(3), q_lens=[3, 5], k_lens=[7, 5])
    message = expect_refused(lambda: run_attention(p, version=3), "float8_e4m3fn")
    assert "rebuild" in message, message
    assert component(3) is not None
