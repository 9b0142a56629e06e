"""The rest of the surface vLLM's attention backends use, on the real GPU:

* the op schemas the interface calls positionally are the compiled modules' own;
* flash_attn_supports_sinks / _mla / _quant_query_input and
  is_flash_attn_varlen_func_available answer what this wheel and GPU can run;
* scheduler metadata: computed for the call, it runs and matches the reference (also
  where the metadata omits an argument FA3 derives the same schedule without at this
  wheel's head dim; where the omission changes it, it is refused); computed
  for another call, it is refused before any kernel, both when get_scheduler_metadata
  returned it and when it was copied into a CUDA-graph style buffer; metadata the
  runtime calls equivalent is the same metadata (the real get_scheduler_metadata);
* a call needing a kernel feature this wheel's FA3 lacks (softcap in the minimal build)
  runs on FA2 with fa_version=None, with one warning, and is right.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpu_helpers import (BUILD, TORCH_DTYPES, built_dtypes, check, chunked_lengths, decode_lengths,
                         fa3_has_fp8, has_feature, make_problem, primary_head_dim, reference,
                         require, run_attention, version_skip_reason)

pytestmark = pytest.mark.gpu

ENV = "VLLM_FLASH_ATTN_VERSION"


@pytest.fixture
def selector_defaults(real_machine, monkeypatch):
    """The real machine, VLLM_FLASH_ATTN_VERSION unset, caches and warning memory cleared."""
    from vendored_flash_attn.selection.environment import set_environment

    monkeypatch.delenv(ENV, raising=False)
    set_environment(None)
    return real_machine


# --- schemas --------------------------------------------------------------------------

def test_op_schemas_are_the_compiled_modules(real_machine):
    """The adapters (fa2.launch, fa3.launch) call the ops positionally in the order of op_schemas.py (the CPU
    tests check every argument by name against it); here, that copy against the modules."""
    from vendored_flash_attn.declaration.op_schemas import FA2_NAMESPACE, OP_SCHEMAS

    checked = []
    for (namespace, name), schema in OP_SCHEMAS.items():
        version = 2 if namespace == FA2_NAMESPACE else 3
        if version_skip_reason(version):
            continue
        real = getattr(getattr(torch.ops, namespace), name).default._schema
        expected = torch._C.parse_schema(f"{namespace}::{schema}")
        assert str(real) == str(expected), f"{namespace}::{name}:\n  module: {real}\n  copy:   {expected}"
        assert real == expected
        checked.append(name)
    if not checked:
        pytest.skip("neither compiled module is usable here")


# --- helpers --------------------------------------------------------------------------

def test_helpers_answer_for_this_wheel_and_gpu(selector_defaults):
    """Expected answers derived here from the build info and what imports, not from the
    package's own rules."""
    import vendored_flash_attn as vfa

    fa2_ok, fa3_ok = (version_skip_reason(v) is None for v in (2, 3))
    fa3 = BUILD.fa3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert vfa.flash_attn_supports_sinks() is fa3_ok
        assert vfa.flash_attn_supports_quant_query_input() is (fa3_ok and "e4m3" in fa3.dtypes)
        mla = (fa3_ok and {"paged", "hdimdiff"} <= set(fa3.features)
               and {64, 192} <= set(fa3.head_dims))
        assert vfa.flash_attn_supports_mla() is mla, vfa.flash_attn_mla_unsupported_reason()
        assert vfa.is_flash_attn_varlen_func_available() is (fa2_ok or fa3_ok)
        # vLLM's positional call: (requires_alibi, head_size, head_size_v, has_sinks)
        head = primary_head_dim(3 if fa3_ok else 2)
        assert vfa.get_flash_attn_version(False, head, head, fa3_ok) == (3 if fa3_ok else 2)


# --- scheduler metadata -------------------------------------------------------------------

def _paged_problem(rng, dtype: str, lengths, page_size: int = 16):
    q_lens, k_lens = lengths
    return make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8, head_dim=primary_head_dim(3),
                        q_lens=q_lens, k_lens=k_lens, page_size=page_size)


def _metadata(p, **change):
    """get_scheduler_metadata for this problem as vLLM's FlashAttention backend computes it
    (causal, no window, num_splits 0), with ``change``."""
    from vendored_flash_attn import get_scheduler_metadata

    args = dict(batch_size=p.batch, max_seqlen_q=p.max_seqlen_q, max_seqlen_k=p.max_seqlen_k,
                num_heads_q=p.num_heads, num_heads_kv=p.num_heads_k, headdim=p.head_dim,
                cache_seqlens=p.seqused_k, qkv_dtype=TORCH_DTYPES[p.dtype],
                cu_seqlens_q=p.cu_seqlens_q, page_size=p.page_size, causal=True,
                window_size=(-1, -1), num_splits=0)
    args.update(change)
    return get_scheduler_metadata(**args)


@pytest.fixture
def paged_fa3():
    require(3)
    if not has_feature("paged"):
        pytest.skip("this wheel has no FA3 'paged' kernels")


# The metadata arguments vLLM passes, and omissions FA3 may derive the same schedule from:
# cu_seqlens_q (upstream's test leaves it out), page_size (upstream's test leaves it out
# for paged calls; a 16-bit causal prefill's tile ignores it at head dims 64, 128, 192 and
# 256, reads it at 96 and for 192 with V head dim 128), has_softcap for a call without
# softcap (16-bit tiles ignore it).
ACCEPTED = {
    "as-vllm": {},
    "no-cu_seqlens_q": {"cu_seqlens_q": None},
    "no-page_size": {"page_size": None},
    "has_softcap-unused": {"has_softcap": True},
}
ACCEPTED_CASES = [((built_dtypes(3) or ["bf16"])[0], variant) for variant in ACCEPTED] + (
    [("e4m3", "as-vllm"), ("e4m3", "has_softcap-unused")] if fa3_has_fp8() else [])


def _schedule_differences(metadata: torch.Tensor, for_the_call: torch.Tensor) -> list:
    """How the schedule FA3 derives from ``metadata``'s arguments differs from the one it
    derives from the call's (the runtime's verdict: refused when not empty)."""
    from vendored_flash_attn.declaration.build_info import load_build_info
    from vendored_flash_attn.call.scheduler_metadata import derive, mismatches, recorded_args

    comp = load_build_info().fa3
    return mismatches(derive(recorded_args(metadata), comp), derive(recorded_args(for_the_call), comp))


@pytest.mark.parametrize("dtype, variant", ACCEPTED_CASES, ids=[f"{d}-{v}" for d, v in ACCEPTED_CASES])
def test_metadata_for_the_call_runs_and_is_right(paged_fa3, rng, dtype, variant):
    """Metadata computed for the call (every argument the call has: vLLM's) runs and is
    right; so does metadata omitting an argument wherever FA3 derives the call's schedule
    without it. Where this wheel's head dim makes the omission change the schedule
    (page_size picks the tile at head dim 96), that metadata is not for this call:
    it is refused before any kernel, naming what differs, and the metadata computed with
    the argument runs and is right. Which case a wheel is in: tests/unit/test_gpu_expectations.py."""
    from vendored_flash_attn import FlashAttnInputError, flash_attn_varlen_func

    p = _paged_problem(rng, dtype, chunked_lengths(rng))
    for_the_call = _metadata(p)
    metadata = _metadata(p, **ACCEPTED[variant])
    differences = _schedule_differences(metadata, for_the_call)
    if differences:
        out = torch.full((p.total_q, p.num_heads, p.head_dim), float("nan"), dtype=p.out_dtype,
                         device="cuda")
        with pytest.raises(FlashAttnInputError, match="computed for another call") as info:
            flash_attn_varlen_func(**p.kwargs(), causal=True, out=out, fa_version=3,
                                   scheduler_metadata=metadata)
        for line in differences:  # "tile: (192, 144) for the metadata, (192, 128) for this call"
            field = line.split(":", 1)[0]
            assert f"{field}:" in str(info.value), (field, str(info.value))
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), "the refused call wrote its output: a kernel ran"
        metadata = for_the_call
    out, lse = run_attention(p, version=3, causal=True, scheduler_metadata=metadata)
    ref_out, ref_lse = reference(p, causal=True)
    check(p, out, lse, ref_out, ref_lse, label=f"FA3 paged chunked prefill, scheduler_metadata {variant}"
          + (" refused; computed for the call" if differences else ""))


def test_metadata_for_another_call_is_refused_before_any_kernel(paged_fa3, rng):
    """Upstream's own test pattern: metadata for decode (max_seqlen_q=1, no cu_seqlens_q,
    no page_size) handed to a chunked prefill."""
    from vendored_flash_attn import FlashAttnInputError, flash_attn_varlen_func

    p = _paged_problem(rng, built_dtypes(3)[0], chunked_lengths(rng))
    metadata = _metadata(p, max_seqlen_q=1, cu_seqlens_q=None, page_size=None)
    out = torch.full((p.total_q, p.num_heads, p.head_dim), float("nan"), dtype=p.out_dtype, device="cuda")
    with pytest.raises(FlashAttnInputError, match="scheduler_metadata was computed for another call") as info:
        flash_attn_varlen_func(**p.kwargs(), causal=True, out=out, fa_version=3,
                               scheduler_metadata=metadata)
    assert f"max_seqlen_q: 1 for the metadata, {p.max_seqlen_q} for this call" in str(info.value)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "the refused call wrote its output: a kernel ran"


def test_copied_metadata_buffer_for_another_call_is_refused(paged_fa3, rng):
    """vLLM's full-CUDA-graph path copies the metadata into a persistent buffer and passes
    a view: only the op can check it. Batch 2 vs 12 with num_splits=1 gives metadata of
    1 + 4k vs 1 + 12k entries, k the number of prepared vectors, the same for both
    (flash_api.cpp), so the op must refuse; the refusal is a FlashAttnInputError and the
    process keeps working."""
    from vendored_flash_attn import FlashAttnInputError, flash_attn_varlen_func

    dtype = built_dtypes(3)[0]
    small = _paged_problem(rng, dtype, decode_lengths(rng, batch=2))
    large = _paged_problem(rng, dtype, decode_lengths(rng, batch=12))
    metadata = _metadata(small, num_splits=1)
    buffer = torch.zeros(1 + 4 * 1024, dtype=torch.int32, device="cuda")
    buffer[:metadata.numel()] = metadata
    view = buffer[:metadata.numel()]
    out = torch.full((large.total_q, large.num_heads, large.head_dim), float("nan"),
                     dtype=large.out_dtype, device="cuda")
    with pytest.raises(FlashAttnInputError, match="scheduler_metadata does not fit this call") as info:
        flash_attn_varlen_func(**large.kwargs(), causal=True, out=out, num_splits=1, fa_version=3,
                               scheduler_metadata=view)
    assert "scheduler_metadata must have shape" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "the refused call wrote its output: a kernel ran"
    # The right metadata, copied the same way, runs.
    metadata = _metadata(large, num_splits=1)
    buffer[:metadata.numel()] = metadata
    got, lse = run_attention(large, version=3, causal=True, num_splits=1,
                             scheduler_metadata=buffer[:metadata.numel()])
    ref_out, ref_lse = reference(large, causal=True)
    check(large, got, lse, ref_out, ref_lse, label="FA3 paged decode, metadata copied into a buffer")


def _meaningful(metadata: torch.Tensor, batch: int) -> torch.Tensor:
    """The entries get_scheduler_metadata writes: one vector of ``batch`` per prepared
    quantity (each padded to a multiple of 4, padding left uninitialised), then the tile
    semaphore (flash_api.cpp, mha_fwd_get_scheduler_metadata)."""
    padded = math.ceil(batch / 4) * 4
    vectors = (metadata.numel() - 1) // padded
    assert 1 + vectors * padded == metadata.numel(), (metadata.numel(), batch)
    parts = [metadata[v * padded: v * padded + batch] for v in range(vectors)] + [metadata[-1:]]
    return torch.cat(parts)


# (id, problem kind, changes A, changes B): the runtime derives the same schedule from A and
# B (checked first); the real metadata must be the same. page_size-causal-prefill is such a
# pair only where a 16-bit causal prefill's tile ignores the page size (head dims 64, 128,
# 192, 256; at 96 page_size picks kBlockN, test_metadata_for_the_call_runs_and_is_right
# checks that refusal).
EQUIVALENT = [
    ("softcap-16bit", "decode", {}, {"has_softcap": True}),
    ("cu_seqlens_q-decode", "decode", {}, {"cu_seqlens_q": None}),
    ("page_size-causal-prefill", "chunked", {}, {"page_size": None}),
    ("page_size-16-vs-32", "chunked", {}, {"page_size": 32}),
    ("window-wider-than-keys", "chunked", {}, {"window_size": (1 << 20, 0)}),
    ("causal-as-window", "chunked", {}, {"causal": False, "window_size": (-1, 0)}),
]
# The pairs whose equivalence depends on the head dim (the others hold at every one).
EQUIVALENT_AT_SOME_HEAD_DIMS = {"page_size-causal-prefill"}


@pytest.mark.parametrize("case, kind, a, b", EQUIVALENT, ids=[c[0] for c in EQUIVALENT])
def test_metadata_the_runtime_calls_equivalent_is_equal(paged_fa3, rng, case, kind, a, b):
    lengths = decode_lengths(rng) if kind == "decode" else chunked_lengths(rng)
    p = _paged_problem(rng, built_dtypes(3)[0], lengths)
    ma, mb = _metadata(p, **a), _metadata(p, **b)
    differences = _schedule_differences(mb, ma)
    if differences and case in EQUIVALENT_AT_SOME_HEAD_DIMS:
        pytest.skip(f"not an equivalent pair at head dim {p.head_dim}: the runtime derives "
                    f"different schedules ({'; '.join(differences)}) and refuses one for the "
                    "other (test_metadata_for_the_call_runs_and_is_right)")
    assert not differences, (a, b, differences)
    torch.cuda.synchronize()
    assert ma.numel() == mb.numel(), (ma.numel(), mb.numel())
    assert torch.equal(_meaningful(ma, p.batch), _meaningful(mb, p.batch))


def test_decode_metadata_without_page_size_differs_for_head_dim_128(paged_fa3, rng):
    """Upstream keeps causal for a paged head-dim-128 decode and drops it without a page
    size: the metadata differ in size (the head-swizzle vector), which is why the runtime
    refuses that pair."""
    if primary_head_dim(3) != 128:
        pytest.skip("needs the FA3 hdim128 kernels")
    p = _paged_problem(rng, built_dtypes(3)[0], decode_lengths(rng))
    assert _metadata(p).numel() != _metadata(p, page_size=None).numel()


# --- feature fallback ----------------------------------------------------------------------

def test_softcap_call_falls_back_to_fa2_where_fa3_lacks_softcap(selector_defaults, op_versions, rng):
    from vendored_flash_attn import FlashAttnFallbackWarning

    require(2)
    require(3)
    if has_feature("softcap"):
        pytest.skip("this wheel's FA3 has the softcap kernels: nothing to fall back from "
                    "(test_varlen_gpu covers softcap)")
    dtypes = [d for d in built_dtypes(2) if d in built_dtypes(3)]
    dims = [h for h in BUILD.fa2.head_dims if h in BUILD.fa3.head_dims]
    if not dtypes or not dims:
        pytest.skip("FA2 and FA3 of this wheel share no dtype and head dim")
    q_lens, k_lens = chunked_lengths(rng)
    p = make_problem(rng, dtype=dtypes[0], num_heads=32, num_heads_k=8, head_dim=dims[0],
                     q_lens=q_lens, k_lens=k_lens, page_size=16)
    with pytest.warns(FlashAttnFallbackWarning, match="'softcap'.*using FA2"):
        out, lse = run_attention(p, version=None, causal=True, softcap=20.0)
    ref_out, ref_lse = reference(p, causal=True, softcap=20.0)
    check(p, out, lse, ref_out, ref_lse, label="fa_version=None, softcap 20 -> FA2 (FA3 lacks softcap)",
          softcap=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashAttnFallbackWarning)  # one warning per process
        run_attention(p, version=None, causal=True, softcap=20.0)
        out, lse = run_attention(p, version=None, causal=True)  # no softcap: FA3
    ref_out, ref_lse = reference(p, causal=True)
    check(p, out, lse, ref_out, ref_lse, label="fa_version=None, no softcap -> FA3")
    assert op_versions == [2, 2, 3]


def test_fp8_quant_query_input_runs_when_supported(selector_defaults, rng):
    """flash_attn_supports_quant_query_input() True means an FP8 query is served."""
    from vendored_flash_attn import flash_attn_supports_quant_query_input

    if not flash_attn_supports_quant_query_input():
        pytest.skip("FP8 query input not supported by this wheel/GPU")
    assert fa3_has_fp8()
    q_lens, k_lens = chunked_lengths(rng)
    p = make_problem(rng, dtype="e4m3", num_heads=32, num_heads_k=8, head_dim=primary_head_dim(3),
                     q_lens=q_lens, k_lens=k_lens)
    out, lse = run_attention(p, version=None, causal=True)
    ref_out, ref_lse = reference(p, causal=True)
    check(p, out, lse, ref_out, ref_lse, label="FP8 query via fa_version=None")
