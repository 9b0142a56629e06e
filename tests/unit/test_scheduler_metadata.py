"""Scheduler metadata computed for another call is refused before the op runs; metadata
FA3 would derive the same schedule from is accepted; the op's own refusal of a copied
buffer is translated. Over fake ops on CPU (a GPU test checks the equivalences against
the real get_scheduler_metadata)."""

from __future__ import annotations

import gc

import pytest
import torch

from calls import paged_call, varlen_call
from runtime_fakes import HOPPER, make_build
from vendored_flash_attn import flash_attn_varlen_func, get_scheduler_metadata
from vendored_flash_attn.call import scheduler_metadata as sm
from vendored_flash_attn.errors import FlashAttnInputError

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
FULL_FA3 = make_build("full").fa3
SIZE_CHECK = "scheduler_metadata must have shape (metadata_size)"  # upstream's CHECK_SHAPE


def metadata_for(call: dict, **change):
    """get_scheduler_metadata for exactly this call (as vLLM computes it), with ``change``."""
    q, k = call["q"], call["k"]
    paged = call.get("block_table") is not None
    seqlens = call["seqused_k"] if paged else torch.diff(call["cu_seqlens_k"])
    args = dict(batch_size=call["cu_seqlens_q"].shape[0] - 1, max_seqlen_q=call["max_seqlen_q"],
                max_seqlen_k=call["max_seqlen_k"], num_heads_q=q.shape[1], num_heads_kv=k.shape[-2],
                headdim=q.shape[-1], headdim_v=call["v"].shape[-1], cache_seqlens=seqlens,
                qkv_dtype=q.dtype, cu_seqlens_q=call["cu_seqlens_q"],
                page_size=k.shape[1] if paged else None, causal=call.get("causal", False),
                window_size=call.get("window_size", (-1, -1)),
                has_softcap=call.get("softcap", 0.0) > 0, num_splits=call.get("num_splits", 0))
    args.update(change)
    return get_scheduler_metadata(**args)


def test_matching_metadata_is_passed_to_the_op(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    metadata = metadata_for(call)
    for _ in range(3):  # checked once, then a lookup
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    assert fake_ops.last("fwd")["scheduler_metadata"] is metadata
    assert [name for name, _ in fake_ops.calls] == ["get_scheduler_metadata"] + ["fwd"] * 3


def test_chunked_prefill_with_decode_metadata_is_refused(describe, fake_ops):
    """Upstream's own test: metadata for max_seqlen_q=1 (no cu_seqlens_q, no page_size)
    used for a chunked prefill."""
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)  # max_seqlen_q 4
    metadata = metadata_for(call, max_seqlen_q=1, cu_seqlens_q=None, page_size=None)
    with pytest.raises(FlashAttnInputError) as info:
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    message = str(info.value)
    assert "scheduler_metadata was computed for another call: get_scheduler_metadata(batch_size=2, " \
           "max_seqlen_q=1, max_seqlen_k=20" in message
    assert "max_seqlen_q: 1 for the metadata, 4 for this call" in message
    assert ("Compute it for this call, get_scheduler_metadata(batch_size=2, max_seqlen_q=4, "
            "max_seqlen_k=20, num_heads_q=8, num_heads_kv=2, headdim=128, cache_seqlens=seqused_k, "
            "qkv_dtype=torch.bfloat16, cu_seqlens_q=cu_seqlens_q, page_size=16, causal=True, "
            "window_size=(-1, -1), has_softcap=False, num_splits=0), or pass "
            "scheduler_metadata=None") in message
    assert "fwd" not in [name for name, _ in fake_ops.calls]


# (id, change to the metadata's arguments, fragment of the message)
MISMATCHES = [
    ("batch", dict(batch_size=1, cache_seqlens=torch.tensor([5], dtype=torch.int32),
                   cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32)), "batch_size: 1 for the metadata, 2"),
    ("max_seqlen_k", dict(max_seqlen_k=19), "max_seqlen_k: 19 for the metadata, 20"),
    ("heads", dict(num_heads_q=4), "num_heads_q: 4 for the metadata, 8"),
    ("kv-heads", dict(num_heads_kv=1), "num_heads_kv: 1 for the metadata, 2"),
    ("fp8", dict(qkv_dtype=FP8), "fp8: True for the metadata, False"),
    ("not-causal", dict(causal=False), "mask: none for the metadata, causal for this call"),
    ("window", dict(window_size=(7, 0)), "mask: local (7, 0) for the metadata, causal"),
    ("splits", dict(num_splits=4), "num_splits: 4 for the metadata, 0"),
    ("sm-margin", dict(sm_margin=8), "sm_margin: 8 for the metadata, 0"),
    ("appended-kv", dict(max_seqlen_k_new=4), "appended_kv: True for the metadata, False"),
    ("leftpad", dict(cache_leftpad=torch.zeros(2, dtype=torch.int32)), "cache_leftpad: True"),
]


@pytest.mark.parametrize("change, fragment", [c[1:] for c in MISMATCHES], ids=[c[0] for c in MISMATCHES])
def test_metadata_for_another_shape_is_refused(describe, fake_ops, change, fragment):
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    metadata = metadata_for(call, **change)
    with pytest.raises(FlashAttnInputError, match="scheduler_metadata was computed for another call") as info:
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    assert fragment in str(info.value)
    assert "fwd" not in [name for name, _ in fake_ops.calls]


def test_a_call_shape_that_changes_after_a_good_one_is_refused(describe, fake_ops):
    """The per-tensor verdict cache is keyed on the call's shape, not only the tensor."""
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    metadata = metadata_for(call)
    flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    with pytest.raises(FlashAttnInputError, match="max_seqlen_q: 4 for the metadata, 3"):
        flash_attn_varlen_func(**{**call, "max_seqlen_q": 3}, scheduler_metadata=metadata)
    with pytest.raises(FlashAttnInputError, match="mask: causal for the metadata, none"):
        flash_attn_varlen_func(**{**call, "causal": False}, scheduler_metadata=metadata)


def test_verdicts_are_redone_for_another_build(describe, fake_ops):
    """A verdict belongs to the build info it read. FP8 local attention with metadata that
    omits has_softcap: the same tile with two-level accumulation (the default), another
    one without it; after the environment changes, the cached verdict must not answer."""
    call = dict(varlen_call(FP8), causal=True, window_size=(3, 0), softcap=30.0)
    describe(caps=(HOPPER,))
    metadata = metadata_for(call, has_softcap=False)
    flash_attn_varlen_func(**call, scheduler_metadata=metadata)  # accepted, and remembered
    two_level_off = make_build("full", fa3={"defines": [
        "FLASHATTENTION_PACKGQA_ONLY", "FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION"]})
    describe(caps=(HOPPER,), build=two_level_off)
    with pytest.raises(FlashAttnInputError, match=r"tile: \(128, 224\) for the metadata, \(128, 192\)"):
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)


# Omissions FA3 derives the same schedule from: accepted.
def test_vllm_omits_has_softcap(describe, fake_ops):
    # vLLM's FlashAttention backend computes the metadata without has_softcap and calls with
    # the model's softcap; 16-bit tiles do not depend on softcap.
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True, softcap=30.0)
    metadata = metadata_for(call, has_softcap=False)
    flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    assert fake_ops.last("fwd")["scheduler_metadata"] is metadata


def test_decode_metadata_without_page_size_where_it_does_not_matter(describe, fake_ops):
    """Upstream's decode test computes the metadata without page_size and cu_seqlens_q:
    for head dim 256 FA3 picks the same tile and mask either way; for head dim 128 it
    keeps causal only for a paged call (a different mask and tile): refused."""
    describe(caps=(HOPPER,))
    decode = dict(paged_call(d=256), causal=True, max_seqlen_q=1,
                  cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    decode["q"] = decode["q"][:2]
    metadata = metadata_for(decode, page_size=None, cu_seqlens_q=None)
    flash_attn_varlen_func(**decode, scheduler_metadata=metadata)
    assert fake_ops.last("fwd")["scheduler_metadata"] is metadata

    decode = dict(paged_call(d=128), causal=True, max_seqlen_q=1,
                  cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    decode["q"] = decode["q"][:2]
    metadata = metadata_for(decode, page_size=None, cu_seqlens_q=None)
    with pytest.raises(FlashAttnInputError, match="mask: none for the metadata, causal for this call"):
        flash_attn_varlen_func(**decode, scheduler_metadata=metadata)


def test_hdimdiff_metadata_needs_cu_seqlens_q(describe, fake_ops):
    # Different head sizes: PackGQA is not forced, and without cu_seqlens_q FA3's
    # heuristic may decide it differently from the (varlen) call.
    describe(caps=(HOPPER,))
    call = dict(varlen_call(d=192, dv=128), causal=True)
    metadata = metadata_for(call)
    flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    metadata = metadata_for(call, cu_seqlens_q=None)
    with pytest.raises(FlashAttnInputError, match="pack_gqa"):
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)
    metadata = metadata_for(call, pack_gqa=False)
    with pytest.raises(FlashAttnInputError, match="pack_gqa"):
        flash_attn_varlen_func(**call, scheduler_metadata=metadata)


# --- a tensor get_scheduler_metadata did not return -----------------------------------

def test_copied_buffer_refused_by_the_op_is_translated(describe, fake_ops):
    """vLLM's CUDA-graph path copies the metadata into a persistent buffer and passes a
    view; only the op can check it, and its refusal becomes a FlashAttnInputError."""
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    metadata = metadata_for(call, max_seqlen_q=1)
    buffer = torch.zeros(64, dtype=torch.int32)
    buffer[:metadata.shape[0]] = metadata
    fake_ops.errors["fwd"] = SIZE_CHECK
    with pytest.raises(FlashAttnInputError) as info:
        flash_attn_varlen_func(**call, scheduler_metadata=buffer[:metadata.shape[0]])
    message = str(info.value)
    assert f"scheduler_metadata does not fit this call (FA3: {SIZE_CHECK})" in message
    assert "get_scheduler_metadata(batch_size=2, max_seqlen_q=4, max_seqlen_k=20" in message
    assert "scheduler_metadata=None" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_other_op_errors_are_not_translated(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    fake_ops.errors["fwd"] = "CUDA error: an illegal memory access was encountered"
    with pytest.raises(RuntimeError, match="illegal memory access") as info:
        flash_attn_varlen_func(**call, scheduler_metadata=torch.zeros(9, dtype=torch.int32))
    assert not isinstance(info.value, FlashAttnInputError)
    with pytest.raises(RuntimeError, match="illegal memory access") as info:
        flash_attn_varlen_func(**call)  # no metadata: nothing to translate
    assert not isinstance(info.value, FlashAttnInputError)


def test_records_die_with_their_tensor(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = dict(paged_call(), causal=True)
    metadata = metadata_for(call, max_seqlen_q=1)
    assert sm.recorded_args(metadata).max_seqlen_q == 1
    key = id(metadata)
    assert key in sm._records
    del metadata
    gc.collect()
    assert key not in sm._records
    assert sm.recorded_args(torch.zeros(3, dtype=torch.int32)) is None


# --- what FA3 derives --------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    # (max_q, max_k, causal, window, headdim, paged) -> (is_causal, is_local, window)
    ((4, 20, True, (-1, -1), 128, True), (True, False, None)),
    ((4, 20, False, (-1, 0), 128, False), (True, False, None)),        # (-1, 0) is causal
    ((4, 20, True, (7, 0), 128, False), (False, True, (7, 0))),
    ((4, 20, True, (19, 0), 128, False), (True, False, None)),         # window >= max_k - 1
    ((4, 20, False, (5, -1), 128, False), (False, True, (5, 3))),      # right -> max_q - 1
    ((1, 20, True, (-1, -1), 128, True), (True, False, None)),         # paged hdim-128 decode
    ((1, 20, True, (-1, -1), 128, False), (False, False, None)),       # decode: causal dropped
    ((1, 20, True, (-1, -1), 256, True), (False, False, None)),
    ((1, 20, True, (-1, -1), 64, True), (False, False, None)),
])
def test_mask_normalisation_like_upstream(args, expected):
    assert sm._mask(*args) == expected


@pytest.mark.parametrize("args, expected", [
    # d, dv, causal, local, fp8, paged_non_tma, softcap, one_mma_wg, two_level
    ((128, 128, False, False, False, False, False, False, True), (128, 160)),
    ((128, 128, False, False, False, True, False, False, True), (128, 128)),
    ((128, 128, False, False, False, False, False, True, True), (64, 176)),
    ((256, 256, False, False, False, True, True, False, True), (128, 80)),
    ((192, 128, False, False, False, False, False, False, True), (128, 128)),
    ((192, 128, False, False, False, True, False, False, True), (128, 96)),
    ((64, 512, True, False, False, True, False, True, True), (64, 64)),
    ((128, 128, False, False, True, False, False, False, True), (128, 192)),
    ((128, 128, False, True, True, False, True, False, False), (128, 192)),   # FP8, no two-level
    ((128, 128, False, True, True, False, False, False, False), (128, 224)),
])
def test_tile_sizes_of_the_pin(args, expected):
    assert sm.tile_size_sm90(*args) == expected


def _args(**change):
    base = dict(batch_size=4, max_seqlen_q=1, max_seqlen_k=2048, num_heads_q=32, num_heads_kv=8,
                headdim=128, headdim_v=128, qkv_dtype=BF16, cu_seqlens_q=True, page_size=16,
                causal=True, window_size=(-1, -1), has_softcap=False, num_splits=0)
    base.update(change)
    return sm.MetadataArgs(**base)


def test_softcap_matters_only_where_the_tile_reads_it():
    two_level_off = make_build("full", fa3={"defines": ["FLASHATTENTION_PACKGQA_ONLY",
                                                        "FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION"]}).fa3
    prefill = dict(max_seqlen_q=512, window_size=(255, 0), qkv_dtype=FP8, page_size=None)
    assert sm.derive(_args(**prefill), FULL_FA3) == sm.derive(_args(**prefill, has_softcap=True), FULL_FA3)
    assert sm.derive(_args(**prefill), two_level_off).tile != sm.derive(
        _args(**prefill, has_softcap=True), two_level_off).tile
