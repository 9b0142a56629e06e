"""Varlen (packed K/V with cu_seqlens_k) attention on the GPU, FA2 and FA3, against the
float32 reference: every dtype and head dim the wheel holds, MHA/GQA/MQA, causal or not,
sliding window, softcap, LSE; out= buffers poisoned with NaN before each call.

What the wheel lacks is not skipped silently: an unbuilt dtype, head dim or FA3 feature is
checked to be refused with a clear error instead.
"""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import (FA2_BUCKETS, FA3_BUCKETS, LSE_TOL, MEASURED, OUT_TOL, SIXTEEN_BIT,
                         built_dtypes, built_head_dims, check, chunked_lengths, decode_lengths,
                         expect_refused, fa3_missing_feature, make_problem, prefill_lengths,
                         primary_head_dim, reference, relative_l2, require, run_attention,
                         run_checked, unbuilt_dtypes)

pytestmark = pytest.mark.gpu

# name -> (q heads, kv heads), lengths, options
SCENARIOS = {
    "mha16": dict(heads=(16, 16), lens="prefill"),
    "gqa32_8-causal": dict(heads=(32, 8), lens="prefill", causal=True),
    "mqa8_1-causal-chunked": dict(heads=(8, 1), lens="chunked", causal=True),
    "gqa32_8-causal-window96": dict(heads=(32, 8), lens="prefill", causal=True, window=(96, 0)),
    "gqa8_2-window64_32": dict(heads=(8, 2), lens="chunked", window=(64, 32)),
    # q scaled up so that scores reach the cap
    "gqa8_2-causal-softcap20": dict(heads=(8, 2), lens="prefill", causal=True, softcap=20.0,
                                    q_scale=4.0),
}
SMALL = "gqa32_8-causal"  # the scenario run for the other head dims


def options(scenario: str) -> dict:
    sc = SCENARIOS[scenario]
    return dict(causal=sc.get("causal", False), window=sc.get("window"),
                softcap=sc.get("softcap", 0.0))


def lengths(rng, kind):
    return prefill_lengths(rng) if kind == "prefill" else chunked_lengths(rng)


def varlen_cases():
    cases = []
    for version in (2, 3):
        for dtype in built_dtypes(version):
            primary = primary_head_dim(version)
            for head_dim in built_head_dims(version):
                for name in (SCENARIOS if head_dim == primary else (SMALL,)):
                    cases.append(pytest.param(version, dtype, head_dim, name,
                                              id=f"fa{version}-{dtype}-hd{head_dim}-{name}"))
    return cases


@pytest.mark.parametrize("version,dtype,head_dim,scenario", varlen_cases())
def test_varlen(version, dtype, head_dim, scenario, rng):
    sc = SCENARIOS[scenario]
    hq, hk = sc["heads"]
    q_lens, k_lens = lengths(rng, sc["lens"])
    p = make_problem(rng, dtype=dtype, num_heads=hq, num_heads_k=hk, head_dim=head_dim,
                     q_lens=q_lens, k_lens=k_lens, q_scale=sc.get("q_scale", 1.0))
    run_checked(p, version, f"FA{version} varlen hd{head_dim} {scenario}", **options(scenario))


def routed_cases():
    """Head sizes served by a larger built kernel (FA3 rounds up to the next built head dim;
    FA2 to its fixed buckets): 80 everywhere, and FA3 head dims this wheel left out below
    its largest one."""
    cases = []
    for version in (2, 3):
        built = tuple(built_head_dims(version))
        dtype = built_dtypes(version)[0] if built_dtypes(version) else "bf16"
        sizes = [80]
        if version == 3:
            sizes += [b for b in FA3_BUCKETS if b not in built and b < max(built, default=0)]
        for size in sorted(set(sizes)):
            bucket = next((b for b in (FA3_BUCKETS if version == 3 else FA2_BUCKETS)
                           if size <= b and (version == 2 or b in built)), None)
            if bucket in built and bucket != size:
                cases.append(pytest.param(version, dtype, size, bucket,
                                          id=f"fa{version}-{dtype}-hd{size}-via-hd{bucket}"))
    return cases


@pytest.mark.parametrize("version,dtype,head_size,kernel", routed_cases())
def test_head_size_routed_to_larger_kernel(version, dtype, head_size, kernel, rng):
    q_lens, k_lens = prefill_lengths(rng)
    p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8, head_dim=head_size,
                     q_lens=q_lens, k_lens=k_lens)
    run_checked(p, version, f"FA{version} varlen hd{head_size} (hd{kernel} kernel) gqa32_8-causal",
                causal=True)


def unbuilt_head_dim_cases():
    cases = []
    for version, buckets in ((2, FA2_BUCKETS), (3, FA3_BUCKETS)):
        built = built_head_dims(version)
        dtype = built_dtypes(version)[0] if built_dtypes(version) else "bf16"
        if version == 2:
            missing = [b for b in buckets if b not in built]
            fragment = "does not contain"
        else:
            missing = [b for b in buckets if b > max(built, default=0)]
            fragment = "larger than the largest"
        for size in missing:
            cases.append(pytest.param(version, dtype, size, fragment, id=f"fa{version}-hd{size}"))
    return cases


@pytest.mark.parametrize("version,dtype,head_size,fragment", unbuilt_head_dim_cases())
def test_unbuilt_head_dim_is_refused(version, dtype, head_size, fragment, rng):
    p = make_problem(rng, dtype=dtype, num_heads=4, num_heads_k=2, head_dim=head_size,
                     q_lens=[3, 5], k_lens=[7, 5])
    message = expect_refused(lambda: run_attention(p, version=version, causal=True), fragment)
    assert str(head_size) in message and "rebuild" in message


@pytest.mark.parametrize("version,dtype", [
    pytest.param(v, d, id=f"fa{v}-{d}") for v in (2, 3) for d in unbuilt_dtypes(v, SIXTEEN_BIT)])
def test_unbuilt_dtype_is_refused(version, dtype, rng):
    p = make_problem(rng, dtype=dtype, num_heads=4, num_heads_k=2,
                     head_dim=primary_head_dim(version), q_lens=[3, 5], k_lens=[7, 5])
    message = expect_refused(lambda: run_attention(p, version=version), "no FA")
    assert "rebuild" in message


@pytest.mark.parametrize("version", [2, 3], ids=["fa2", "fa3"])
def test_allocated_output_without_lse(version, rng):
    """out=None (the kernel allocates; the allocator is poisoned with NaN first) and
    return_softmax_lse=False (a tensor comes back, not a tuple)."""
    dtype = built_dtypes(version)[0]
    q_lens, k_lens = chunked_lengths(rng)
    p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8,
                     head_dim=primary_head_dim(version), q_lens=q_lens, k_lens=k_lens)
    out, lse = run_attention(p, version=version, causal=True, use_out=False, lse=False)
    assert lse is None and isinstance(out, torch.Tensor)
    ref_out, ref_lse = reference(p, causal=True)
    check(p, out, None, ref_out, ref_lse, label=f"FA{version} varlen out=None gqa32_8-causal-chunked")


def common_dtype_and_head_dim():
    dtypes = [d for d in built_dtypes(2) if d in built_dtypes(3)]
    dims = [h for h in built_head_dims(2) if h in built_head_dims(3)]
    return (dtypes[0] if dtypes else None), (128 if 128 in dims else (dims[0] if dims else None))


@pytest.mark.parametrize("layout", ["varlen-gqa32_8-causal", "paged16-decode-gqa32_8",
                                    "paged16-chunked-mqa8_1-window128"])
def test_fa2_and_fa3_agree(layout, rng):
    """Both versions on the same inputs: each close to the reference and to each other."""
    require(2)
    require(3)
    dtype, head_dim = common_dtype_and_head_dim()
    if dtype is None or head_dim is None:
        pytest.skip("FA2 and FA3 of this wheel share no dtype and head dim")
    opts = dict(causal=True)
    if layout.startswith("varlen"):
        q_lens, k_lens = prefill_lengths(rng)
        p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8, head_dim=head_dim,
                         q_lens=q_lens, k_lens=k_lens)
    elif "decode" in layout:
        q_lens, k_lens = decode_lengths(rng)
        p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8, head_dim=head_dim,
                         q_lens=q_lens, k_lens=k_lens, page_size=16)
    else:
        q_lens, k_lens = chunked_lengths(rng)
        p = make_problem(rng, dtype=dtype, num_heads=8, num_heads_k=1, head_dim=head_dim,
                         q_lens=q_lens, k_lens=k_lens, page_size=16)
        opts["window"] = (128, 0)
    missing = fa3_missing_feature(3, dict(opts, paged=p.block_table is not None))
    if missing:
        pytest.skip(f"this wheel has no FA3 '{missing}' kernels")
    out2, lse2 = run_checked(p, 2, f"FA2 {layout}", **opts)
    out3, lse3 = run_checked(p, 3, f"FA3 {layout}", **opts)
    diff = relative_l2(out2, out3)
    assert diff <= OUT_TOL[dtype], f"FA2 and FA3 differ by {diff:.3e} (relative L2)"
    lse_diff = (lse2 - lse3).abs().max().item()
    assert lse_diff <= LSE_TOL[dtype], f"FA2 and FA3 LSE differ by {lse_diff:.3e}"


@pytest.mark.parametrize("version", [2, 3], ids=["fa2", "fa3"])
@pytest.mark.parametrize("batch", [4, 16], ids=["4seqs", "16seqs"])
def test_packed_decode_gqa(version, batch, rng):
    """One query token per sequence with packed K/V (cu_seqlens_k) and GQA 32/8.

    FA2 runs this through its "seqlen_q <-> ngroups swap": with 4 sequences its split-KV
    heuristic picks several splits (the combine kernel writes the LSE); with 16 (16 x 8 KV
    heads >= 0.8 x 132 SMs) it picks one split and the plain forward kernel runs. Reading
    the pinned upstream, that kernel writes the swapped LSE as (heads_k, ngroups, batch)
    while mha_varlen_fwd transposes it as if it were (heads_k, batch, ngroups); if so, the
    output is right and the LSE rows are scrambled. The output is checked hard; an LSE
    mismatch on that path is reported as an expected failure naming the suspicion.
    """
    dtype = built_dtypes(version)[0]
    q_lens = [1] * batch
    k_lens = [rng.py.randint(1, 1500) for _ in range(batch)]
    p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8,
                     head_dim=primary_head_dim(version), q_lens=q_lens, k_lens=k_lens)
    out, lse = run_attention(p, version=version, causal=True)
    ref_out, ref_lse = reference(p, causal=True)
    label = f"FA{version} packed decode gqa32_8 {batch} seqs"
    check(p, out, None, ref_out, ref_lse, label=label)
    lse_err = (lse - ref_lse).abs().max().item()
    MEASURED[-1] = MEASURED[-1][:3] + (lse_err,)
    if lse_err > LSE_TOL[dtype]:
        MEASURED.append((f"{label}: LSE WRONG (max abs error {lse_err:.2e})", dtype, float("nan"),
                         lse_err))
        if version == 2:
            pytest.xfail(f"FA2 LSE of a packed-K GQA decode batch ({batch} seqs) is off by "
                         f"{lse_err:.2e}: suspected upstream LSE layout mismatch on the "
                         "seqlenq_ngroups_swapped path without split-KV (output is correct)")
        pytest.fail(f"{label}: LSE max abs error {lse_err:.3e}")
