"""Bad calls are refused in Python, with a message naming the argument and the fix,
before any op runs."""

from __future__ import annotations

import pytest
import torch

from calls import descales, paged_call, varlen_call
from runtime_fakes import AMPERE, HOPPER, make_build
from vendored_flash_attn import flash_attn_varlen_func, get_scheduler_metadata
from vendored_flash_attn.errors import (
    FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError)

BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
NO_FEATURES = make_build("full", fa3={"features": []})
I64 = torch.int64


def _with(**changes):
    return lambda call: {**call, **changes}


def _drop(*names):
    return lambda call: {k: v for k, v in call.items() if k not in names}


def _map(name, fn):
    return lambda call: {**call, name: fn(call)}


# (id, fa_version, build, base call, change, exception, message pattern)
CASES = [
    # dtypes
    ("q-float32", 3, "full", varlen_call(torch.float32), None, FlashAttnTypeError,
     r"q: FA3 supports dtypes bfloat16, float16, float8_e4m3fn, got float32"),
    ("k-dtype-mismatch", 2, "full", varlen_call(), _map("k", lambda c: c["k"].half()),
     FlashAttnTypeError, r"k has dtype torch.float16 but q has torch.bfloat16"),
    ("v-dtype-mismatch", 3, "full", varlen_call(), _map("v", lambda c: c["v"].half()),
     FlashAttnTypeError, r"v has dtype torch.float16 but q has"),
    ("fp8-to-fa2", 2, "full", paged_call(FP8), None, FlashAttnTypeError,
     r"FP8 \(float8_e4m3fn\) needs FA3 on a Hopper GPU"),
    ("fp8-to-fa2-with-one-descale", 2, "full", paged_call(FP8),
     lambda c: {**c, "q_descale": descales()["q_descale"]}, FlashAttnTypeError, r"FP8 .*needs FA3"),
    ("dtype-not-in-wheel", 3, "minimal", varlen_call(FP16), None, FlashAttnTypeError,
     r"no FA3 kernels for float16 \(FA3 dtypes built: bfloat16, float8_e4m3fn\); rebuild .*VFA_PRESET=full"),
    # index tensors
    ("cu_seqlens_q-int64", 2, "full", varlen_call(), _map("cu_seqlens_q", lambda c: c["cu_seqlens_q"].long()),
     FlashAttnTypeError, r"cu_seqlens_q must have dtype torch.int32, got torch.int64; .*to\(torch.int32\)"),
    ("cu_seqlens_k-int64", 3, "full", varlen_call(), _map("cu_seqlens_k", lambda c: c["cu_seqlens_k"].long()),
     FlashAttnTypeError, r"cu_seqlens_k must have dtype torch.int32"),
    ("seqused_k-int64", 3, "full", paged_call(), _map("seqused_k", lambda c: c["seqused_k"].long()),
     FlashAttnTypeError, r"seqused_k must have dtype torch.int32"),
    ("block_table-int64", 2, "full", paged_call(), _map("block_table", lambda c: c["block_table"].long()),
     FlashAttnTypeError, r"block_table must have dtype torch.int32"),
    ("cu_seqlens_q-strided", 2, "full", varlen_call(),
     _map("cu_seqlens_q", lambda c: torch.zeros(6, dtype=torch.int32)[::2]), FlashAttnInputError,
     r"cu_seqlens_q must be contiguous"),
    ("block_table-strided", 3, "full", paged_call(),
     _map("block_table", lambda c: c["block_table"].t().contiguous().t()), FlashAttnInputError,
     r"block_table must have a contiguous last dimension"),
    ("seqused_k-shape", 3, "full", paged_call(), _with(seqused_k=torch.tensor([5, 20, 1], dtype=torch.int32)),
     FlashAttnInputError, r"seqused_k must have shape \(2,\), got \(3,\)"),
    ("cu_seqlens_k-shape", 2, "full", varlen_call(), _with(cu_seqlens_k=torch.tensor([0, 12], dtype=torch.int32)),
     FlashAttnInputError, r"cu_seqlens_k must have shape \(3,\)"),
    ("cu_seqlens_q-too-short", 2, "full", varlen_call(), _with(cu_seqlens_q=torch.tensor([0], dtype=torch.int32)),
     FlashAttnInputError, r"cu_seqlens_q must be 1-D with batch_size \+ 1 >= 2"),
    # KV layout
    ("block_table-without-seqused_k", 3, "full", paged_call(),
     lambda c: {**_drop("seqused_k")(c), "cu_seqlens_k": torch.tensor([0, 5, 25], dtype=torch.int32)},
     FlashAttnInputError, r"block_table \(paged KV cache\) needs seqused_k"),
    ("block_table-without-seqused_k-fa2", 2, "full", paged_call(), _drop("seqused_k"),
     FlashAttnInputError, r"block_table \(paged KV cache\) needs seqused_k"),
    ("both-cu_seqlens_k-and-seqused_k", 3, "full", varlen_call(),
     _with(seqused_k=torch.tensor([5, 7], dtype=torch.int32)), FlashAttnInputError,
     r"either cu_seqlens_k or seqused_k, not both"),
    ("neither", 2, "full", varlen_call(), _drop("cu_seqlens_k"), FlashAttnInputError,
     r"pass cu_seqlens_k .* or seqused_k .*got neither"),
    ("fa2-seqused_k-unpaged", 2, "full", paged_call(), _drop("block_table"), FlashAttnInputError,
     r"FA2 needs cu_seqlens_k for an unpaged K/V"),
    ("block_table-rows", 3, "full", paged_call(),
     _map("block_table", lambda c: torch.zeros(3, 4, dtype=torch.int32)), FlashAttnInputError,
     r"block_table has 3 rows but cu_seqlens_q describes 2 sequences"),
    ("fa2-block-size", 2, "full", paged_call(block_size=8, num_blocks=20), None, FlashAttnInputError,
     r"FA2 needs a paged KV block size divisible by 16, got 8"),
    ("paged-k-3d", 3, "full", paged_call(), _map("k", lambda c: c["k"][0]), FlashAttnInputError,
     r"k must be 4-D \(num_blocks, block_size, num_heads_k, head_size\)"),
    ("varlen-k-4d", 2, "full", varlen_call(), _map("k", lambda c: c["k"][None]), FlashAttnInputError,
     r"k must be 3-D \(total_k, num_heads_k, head_size\)"),
    ("q-2d", 2, "full", varlen_call(), _map("q", lambda c: c["q"][0]), FlashAttnInputError,
     r"q must be 3-D \(total_q, num_heads, head_size\)"),
    # heads and head sizes
    ("gqa-ratio", 3, "full", varlen_call(heads=8, kv_heads=3), None, FlashAttnInputError,
     r"q has 8 heads and k/v have 3; the number of q heads must be a multiple"),
    ("k-head-size", 2, "full", varlen_call(), _map("k", lambda c: c["k"][..., :64]), FlashAttnInputError,
     r"k has head size 64 but q has 128"),
    ("fa3-head-size-not-multiple-of-8", 3, "full", varlen_call(d=100), None, FlashAttnInputError,
     r"multiples of 8, got 100"),
    ("fa3-fp8-head-size-multiple-of-16", 3, "full", varlen_call(FP8, d=72), None, FlashAttnInputError,
     r"multiples of 16 for FP8, got 72"),
    ("fa2-head-size-too-large", 2, "full", varlen_call(d=264), None, FlashAttnInputError,
     r"FA2 supports head sizes that are multiples of 8 up to 256, got 264"),
    ("fa2-head-dim-not-built", 2, "minimal", varlen_call(d=64), None, FlashAttnInputError,
     r"head size 64 needs the FA2 hdim64 kernels.*built: 128.*VFA_PRESET=full.*VFA_FA2_HEAD_DIMS"),
    ("fa3-head-dim-not-built", 3, "minimal", varlen_call(d=256), None, FlashAttnInputError,
     r"head size 256 is larger than the largest FA3 head dim in this wheel \(128\)"),
    ("fa2-hdimdiff", 2, "full", varlen_call(d=128, dv=64), None, FlashAttnInputError,
     r"FA2 needs the same head size for V"),
    ("fa3-hdimdiff-unsupported-pair", 3, "full", varlen_call(d=128, dv=64), None, FlashAttnInputError,
     r"Q/K 128, V 64"),
    ("fa3-hdimdiff-not-built", 3, NO_FEATURES, varlen_call(d=192, dv=128), None, FlashAttnInputError,
     r"'hdimdiff' kernels"),
    ("fa3-fp8-hdimdiff-64", 3, "full", varlen_call(FP8, d=64, dv=256), None, FlashAttnInputError,
     r"\(16-bit only\)"),
    # out=
    ("out-shape", 2, "full", varlen_call(), _map("out", lambda c: torch.empty(6, 8, 64, dtype=BF16)),
     FlashAttnInputError, r"out must have shape \(6, 8, 128\), got \(6, 8, 64\)"),
    ("out-dtype", 3, "full", varlen_call(), _map("out", lambda c: torch.empty(6, 8, 128, dtype=FP16)),
     FlashAttnTypeError, r"out has dtype torch.float16; it must be torch.bfloat16 like q"),
    ("fp8-out-must-be-bf16", 3, "full", paged_call(FP8), _map("out", lambda c: torch.empty(6, 8, 128).to(FP8)),
     FlashAttnTypeError, r"FP8 attention writes bf16"),
    ("out-strided", 2, "full", varlen_call(),
     _map("out", lambda c: torch.empty(6, 8, 256, dtype=BF16)[..., ::2]), FlashAttnInputError,
     r"out must have a contiguous last dimension"),
    # version-specific arguments
    ("alibi-fa3", 3, "full", varlen_call(), _with(alibi_slopes=torch.zeros(8)), FlashAttnInputError,
     r"ALiBi \(alibi_slopes\) is not supported by FA3; pass fa_version=2"),
    ("alibi-dtype", 2, "full", varlen_call(), _with(alibi_slopes=torch.zeros(8, dtype=BF16)),
     FlashAttnTypeError, r"alibi_slopes must be float32"),
    ("alibi-shape", 2, "full", varlen_call(), _with(alibi_slopes=torch.zeros(4)), FlashAttnInputError,
     r"alibi_slopes must have shape \(8,\) or \(2, 8\)"),
    ("s_aux-fa2", 2, "full", varlen_call(), _with(s_aux=torch.zeros(8, dtype=BF16)), FlashAttnInputError,
     r"s_aux \(attention sinks\) needs FA3"),
    ("s_aux-dtype", 3, "full", varlen_call(), _with(s_aux=torch.zeros(8)), FlashAttnTypeError,
     r"s_aux must be bfloat16"),
    ("num_splits-fa2", 2, "full", paged_call(), _with(num_splits=4), FlashAttnInputError,
     r"FA2 does not take num_splits > 1 \(got 4\)"),
    ("num_splits-not-built", 3, NO_FEATURES, varlen_call(), _with(num_splits=4), FlashAttnInputError,
     r"split-KV \(num_splits > 1\) needs the FA3 'split' kernels.*or pass fa_version=2"),
    ("softcap-not-built", 3, "minimal", varlen_call(), _with(softcap=30.0), FlashAttnInputError,
     r"softcap > 0 needs the FA3 'softcap' kernels.*features built: paged, split, local"),
    ("local-not-built", 3, NO_FEATURES, varlen_call(), _with(window_size=[127, 0], causal=True),
     FlashAttnInputError, r"sliding-window \(local\) attention needs the FA3 'local' kernels"),
    ("paged-not-built", 3, NO_FEATURES, paged_call(), None, FlashAttnInputError,
     r"a paged KV cache \(block_table\) needs the FA3 'paged' kernels"),
    ("scheduler_metadata-fa2", 2, "full", varlen_call(),
     _with(scheduler_metadata=torch.zeros(4, dtype=torch.int32)), FlashAttnInputError,
     r"scheduler_metadata .* is FA3-only"),
    ("q_v-fa2", 2, "full", varlen_call(), _with(q_v=torch.zeros(6, 8, 128, dtype=BF16)),
     FlashAttnInputError, r"q_v needs FA3"),
    ("cp-without-total", 3, "full", paged_call(), _with(cp_world_size=2, cp_rank=1), FlashAttnInputError,
     r"cp_world_size > 1\) needs cp_tot_seqused_k"),
    # FP8 descales
    ("descale-shape", 3, "full", paged_call(FP8),
     _with(q_descale=torch.ones(2, 8)), FlashAttnInputError,
     r"q_descale must have shape \(num_seqs, num_kv_heads\) = \(2, 2\), got \(2, 8\).*make_fp8_descales"),
    ("descale-dtype", 3, "full", paged_call(FP8),
     _with(k_descale=torch.ones(2, 2, dtype=BF16)), FlashAttnTypeError, r"k_descale must be float32"),
    ("descale-scalar", 3, "full", paged_call(FP8),
     _with(v_descale=torch.ones(())), FlashAttnInputError, r"v_descale must have shape"),
    # scalars
    ("max_seqlen-tensor", 2, "full", varlen_call(), _with(max_seqlen_q=torch.tensor(4)), FlashAttnTypeError,
     r"max_seqlen_q must be a Python int, got a tensor"),
    ("dropout", 2, "full", varlen_call(), _with(dropout_p=0.1), FlashAttnInputError,
     r"dropout_p must be 0.0"),
    ("negative-softcap", 2, "full", varlen_call(), _with(softcap=-1.0), FlashAttnInputError,
     r"softcap must be >= 0"),
    ("window-size-length", 3, "full", varlen_call(), _with(window_size=[1, 2, 3]), FlashAttnInputError,
     r"window_size must be \(left, right\)"),
    ("fa_version-5", 5, "full", varlen_call(), None, FlashAttnInputError,
     r"fa_version must be 2, 3, 4 or None"),
    ("fa_version-tensor", torch.tensor(3), "full", varlen_call(), None, FlashAttnInputError,
     r"fa_version must be 2, 3, 4 or None"),
    # not hashable: refused before it is looked up (it was a TypeError from the resolution cache)
    ("fa_version-list", [3], "full", varlen_call(), None, FlashAttnInputError, r"fa_version must be 2, 3, 4 or None"),
    ("fa_version-bool", True, "full", varlen_call(), None, FlashAttnInputError, r"fa_version must be 2, 3, 4 or None"),
    ("k-not-a-tensor", 2, "full", varlen_call(), _with(k=[1, 2]), FlashAttnTypeError,
     r"k must be a torch.Tensor, got list"),
]


@pytest.mark.parametrize("version, build, call, change, error, pattern",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_call_is_refused_before_the_op(describe, fake_ops, version, build, call, change, error, pattern):
    describe(caps=(HOPPER,), build=build)
    kwargs = change(call) if change else call
    with pytest.raises(error, match=pattern):
        flash_attn_varlen_func(**kwargs, fa_version=version)
    assert fake_ops.calls == []


def test_input_errors_are_value_errors():
    assert issubclass(FlashAttnInputError, ValueError)
    assert issubclass(FlashAttnTypeError, TypeError) and issubclass(FlashAttnTypeError, ValueError)


def test_q_must_be_on_cuda(describe, fake_ops):
    describe(caps=(HOPPER,), device_type="cuda")  # the real rule: CPU tensors are wrong
    with pytest.raises(FlashAttnInputError, match=r"q is on cpu, but FlashAttention runs on CUDA devices"):
        flash_attn_varlen_func(**varlen_call())
    assert fake_ops.calls == []


def test_all_tensors_on_q_device(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = varlen_call()
    call["cu_seqlens_k"] = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(FlashAttnInputError, match=r"cu_seqlens_k is on meta but q is on cpu"):
        flash_attn_varlen_func(**call, fa_version=3)


@pytest.mark.parametrize("caps, version, pattern", [
    ((AMPERE,), 3, r"fa_version=3 cannot run here: FA3 runs on sm90 only"),
    ((), 2, r"no CUDA GPU is visible"),
    ((), None, r"no usable FlashAttention version: no CUDA GPU is visible"),
])
def test_version_not_usable_here(describe, fake_ops, caps, version, pattern):
    describe(caps=caps)
    with pytest.raises(FlashAttnUnavailableError, match=pattern):
        flash_attn_varlen_func(**varlen_call(), fa_version=version)


def test_module_that_fails_to_import(describe, fake_ops):
    describe(caps=(AMPERE,), module_errors={2: "ImportError: undefined symbol: foo"})
    with pytest.raises(FlashAttnUnavailableError, match="undefined symbol: foo"):
        flash_attn_varlen_func(**varlen_call(), fa_version=2)


def test_selector_picks_none_for_fp8_on_ampere(describe, fake_ops):
    describe(caps=(AMPERE,))
    with pytest.raises(FlashAttnUnavailableError, match="FA2 supports dtypes .*FP8"):
        flash_attn_varlen_func(**paged_call(FP8), **descales())


# Expensive checks: only with VFA_DEBUG_CHECKS=1.
DEBUG_CASES = [
    ("block-id-out-of-range", paged_call(), lambda c: {**c, "block_table": torch.tensor(
        [[0, 1, 2, 3], [4, 99, 6, -1]], dtype=torch.int32)},
     r"block_table\[1, 1\] = 99 is outside the KV cache \(num_blocks = 10\)"),
    ("seqused-beyond-capacity", paged_call(), _with(seqused_k=torch.tensor([5, 70], dtype=torch.int32),
                                                   max_seqlen_k=70),
     r"seqused_k has an entry 70 larger than the KV capacity 64"),
    ("max_seqlen_k-too-small", paged_call(), _with(max_seqlen_k=10), r"max_seqlen_k=10 is smaller"),
    ("cu_seqlens-decreasing", varlen_call(), _with(cu_seqlens_k=torch.tensor([0, 7, 5], dtype=torch.int32)),
     r"cu_seqlens_k must be non-decreasing"),
    ("cu_seqlens-past-end", varlen_call(), _with(cu_seqlens_q=torch.tensor([0, 2, 9], dtype=torch.int32),
                                                 max_seqlen_q=7),
     r"cu_seqlens_q ends at 9 but q has only 6 rows"),
    ("cu_seqlens-not-from-zero", varlen_call(), _with(cu_seqlens_k=torch.tensor([1, 5, 12], dtype=torch.int32)),
     r"cu_seqlens_k must start at 0"),
    ("max_seqlen_q-too-small", varlen_call(), _with(max_seqlen_q=3), r"max_seqlen_q=3 is smaller"),
]


@pytest.mark.parametrize("call, change, pattern", [c[1:] for c in DEBUG_CASES], ids=[c[0] for c in DEBUG_CASES])
def test_debug_checks(describe, fake_ops, call, change, pattern):
    kwargs = change(call)
    describe(caps=(HOPPER,))  # off by default: the cheap path does not read values
    flash_attn_varlen_func(**kwargs, fa_version=3)
    assert len(fake_ops.calls) == 1
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "1"})
    for _ in range(2):  # and again, the kind of call resolved: every call is checked
        with pytest.raises(FlashAttnInputError, match=pattern):
            flash_attn_varlen_func(**kwargs, fa_version=3)
    assert len(fake_ops.calls) == 1


@pytest.mark.parametrize("value, on", [("ON", True), ("yes", True), ("0", False), ("", False)])
def test_debug_checks_take_the_bool_words(describe, value, on):
    from vendored_flash_attn.call.debug_checks import debug_checks_enabled
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": value})
    assert debug_checks_enabled() is on


def test_debug_checks_warn_about_any_other_word(describe):
    from vendored_flash_attn.call.debug_checks import debug_checks_enabled
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "enable"})
    with pytest.warns(UserWarning, match=r"VFA_DEBUG_CHECKS='enable' is not a valid value; the debug checks stay off"):
        assert debug_checks_enabled() is False


def test_debug_checks_pass_a_good_call(describe, fake_ops):
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "1"})
    flash_attn_varlen_func(**paged_call(), fa_version=3)
    flash_attn_varlen_func(**varlen_call(), fa_version=2)
    assert len(fake_ops.calls) == 2


@pytest.mark.parametrize("change, error, pattern", [
    (dict(qkv_dtype=torch.float16), FlashAttnInputError, r"no FA3 kernels for float16"),
    (dict(headdim=256), FlashAttnInputError, r"larger than the largest FA3 head dim"),
    (dict(num_heads_kv=3), FlashAttnInputError, r"num_heads_q \(8\) must be a multiple of num_heads_kv \(3\)"),
    (dict(cache_seqlens=torch.tensor([1, 2], dtype=torch.int64)), FlashAttnTypeError,
     r"cache_seqlens must have dtype torch.int32"),
    (dict(cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32)), FlashAttnInputError,
     r"cache_seqlens must have shape \(2,\)"),
    # Read by the op's prepare kernel through raw pointers: batch_size + 1 (or batch_size)
    # contiguous int32 entries, or it reads past them.
    (dict(cu_seqlens_q=torch.tensor([0, 4], dtype=torch.int32)), FlashAttnInputError,
     r"cu_seqlens_q must have shape \(3,\) for batch_size=2, got \(2,\)"),
    (dict(cu_seqlens_q=[0, 4, 8]), FlashAttnTypeError,
     r"cu_seqlens_q must be a torch.Tensor or None, got list"),
    (dict(cache_leftpad=torch.zeros(2, 2, dtype=torch.int32)[:, 0]), FlashAttnInputError,
     r"cache_leftpad must be contiguous"),
    (dict(cu_seqlens_k_new=torch.zeros(2, dtype=torch.int32)), FlashAttnInputError,
     r"cu_seqlens_k_new must have shape \(3,\)"),
])
def test_scheduler_metadata_checks(describe, fake_ops, change, error, pattern):
    describe(caps=(HOPPER,), build="minimal")
    args = dict(batch_size=2, max_seqlen_q=4, max_seqlen_k=20, num_heads_q=8, num_heads_kv=2,
                headdim=128, cache_seqlens=torch.tensor([5, 20], dtype=torch.int32))
    with pytest.raises(error, match=pattern):
        get_scheduler_metadata(**{**args, **change})
    assert fake_ops.calls == []


def test_scheduler_metadata_needs_hopper(describe, fake_ops):
    describe(caps=(AMPERE,))
    with pytest.raises(FlashAttnUnavailableError, match="get_scheduler_metadata needs FA3"):
        get_scheduler_metadata(2, 4, 20, 8, 2, 128, torch.tensor([5, 20], dtype=torch.int32))


# A call wrong in two ways: the earlier rule's message, whichever step of check_varlen_call
# holds each (the steps run in one order; this pins it at each boundary between two).
# (id, build, base call, change, exception, message pattern of the earlier rule)
TWICE_WRONG = [
    ("tensor-before-dtype", "full", varlen_call(torch.float32), _with(k=[0.0]), FlashAttnTypeError,
     r"k must be a torch.Tensor, got list"),
    ("dtype-before-kv-layout", "full", varlen_call(torch.float32), _drop("cu_seqlens_k"), FlashAttnTypeError,
     r"q: FA3 supports dtypes"),
    ("kv-layout-before-shapes", "full", paged_call(),
     lambda c: {**c, "cu_seqlens_k": c["cu_seqlens_q"], "q": c["q"][0]}, FlashAttnInputError,
     r"block_table \(paged KV cache\) needs seqused_k"),
    ("shapes-before-kv-indexes", "full", varlen_call(heads=6, kv_heads=4),
     _map("cu_seqlens_k", lambda c: c["cu_seqlens_k"].long()), FlashAttnInputError,
     r"the number of q heads must be a multiple"),
    ("kv-indexes-before-max-seqlen", "full", paged_call(),
     lambda c: {**c, "block_table": c["block_table"][:1], "max_seqlen_q": 4.0}, FlashAttnInputError,
     r"block_table has 1 rows but cu_seqlens_q describes 2"),
    ("max-seqlen-before-out", "full", varlen_call(),
     lambda c: {**c, "max_seqlen_q": 4.0, "out": torch.empty(7, 8, 128, dtype=BF16)}, FlashAttnTypeError,
     r"max_seqlen_q must be an int, got float"),
    ("out-before-options", "full", varlen_call(),
     _with(out=torch.empty(7, 8, 128, dtype=BF16), dropout_p=0.1), FlashAttnInputError, r"out must have shape"),
    ("options-before-features", "full", varlen_call(), _with(dropout_p=0.1, alibi_slopes=torch.rand(8)),
     FlashAttnInputError, r"dropout_p must be 0.0"),
    ("features-before-their-arguments", "no-features", varlen_call(),
     _with(softcap=30.0, s_aux=torch.zeros(8)), FlashAttnInputError, r"softcap > 0 needs the FA3 'softcap' kernels"),
    ("descales-before-sinks", "full", paged_call(FP8),
     lambda c: {**c, **descales(batch=3), "s_aux": torch.zeros(8)}, FlashAttnInputError,
     r"q_descale must have shape \(num_seqs, num_kv_heads\)"),
    ("sinks-before-context-parallel", "full", varlen_call(), _with(s_aux=torch.zeros(8), cp_rank=1),
     FlashAttnTypeError, r"s_aux must be bfloat16"),
]


@pytest.mark.parametrize("build, call, change, error, pattern", [c[1:] for c in TWICE_WRONG],
                         ids=[c[0] for c in TWICE_WRONG])
def test_a_call_wrong_twice_is_refused_for_the_earlier_rule(build, call, change, error, pattern):
    from vendored_flash_attn.call.arguments import VarlenCall
    from vendored_flash_attn.declaration.families import registry
    from vendored_flash_attn.call.validation import check_varlen_call, window_tuple

    comp = (NO_FEATURES if build == "no-features" else make_build("full")).component(3)
    call = {"causal": True, **change(call)}
    with pytest.raises(error, match=pattern):
        check_varlen_call(registry()[3], comp, "cpu", VarlenCall(**call), window_tuple(call.get("window_size")))
