"""Paged KV cache on the GPU: block_table (shuffled, non-contiguous block ids, spare
columns and spare blocks) + seqused_k, page sizes 16 and 256, decode (one query token per
sequence) and chunked prefill mixed with decode; FA3 split-KV (num_splits > 1) and
scheduler metadata. Unused cache slots hold large finite garbage, so reading past
seqused_k or through a wrong block id shows up as a large error.

Page 16 runs FA3's cp.async paged path; page 256 with causal chunked prefill runs its TMA
paged path (page size a multiple of the 128-wide K block and more than one M block of
packed query heads).
"""

from __future__ import annotations

import pytest
import torch

from gpu_helpers import (TORCH_DTYPES, built_dtypes, chunked_lengths, decode_lengths, has_feature,
                         make_problem, prefill_lengths, primary_head_dim, require, run_checked)

pytestmark = pytest.mark.gpu

MODES = {
    "decode-gqa32_8": dict(heads=(32, 8), lens="decode", causal=True),
    "chunked-mqa8_1": dict(heads=(8, 1), lens="chunked", causal=True),
    "chunked-gqa32_8-window128": dict(heads=(32, 8), lens="chunked", causal=True, window=(128, 0)),
}


def paged_cases():
    cases = []
    for version in (2, 3):
        for dtype in built_dtypes(version):
            for page in (16, 256):
                for mode in MODES:
                    if "window" in mode and page != 16:
                        continue
                    cases.append(pytest.param(version, dtype, page, mode,
                                              id=f"fa{version}-{dtype}-page{page}-{mode}"))
    return cases


def make_paged(rng, dtype, head_dim, mode, page):
    spec = MODES[mode]
    hq, hk = spec["heads"]
    q_lens, k_lens = decode_lengths(rng) if spec["lens"] == "decode" else chunked_lengths(rng)
    return make_problem(rng, dtype=dtype, num_heads=hq, num_heads_k=hk, head_dim=head_dim,
                        q_lens=q_lens, k_lens=k_lens, page_size=page)


@pytest.mark.parametrize("version,dtype,page,mode", paged_cases())
def test_paged(version, dtype, page, mode, rng):
    p = make_paged(rng, dtype, primary_head_dim(version), mode, page)
    spec = MODES[mode]
    run_checked(p, version, f"FA{version} paged{page} {mode}", causal=spec["causal"],
                window=spec.get("window"))


@pytest.mark.parametrize("layout,num_splits", [
    ("varlen-prefill-gqa32_8", 4),
    ("paged16-decode-gqa32_8", 3),
    ("paged16-chunked-mqa8_1", 2),
])
def test_fa3_num_splits(layout, num_splits, rng):
    """Split-KV with an explicit num_splits > 1 (the combine kernel writes out and LSE)."""
    require(3)
    dtype, head_dim = built_dtypes(3)[0], primary_head_dim(3)
    if layout.startswith("varlen"):
        q_lens, k_lens = prefill_lengths(rng)
        p = make_problem(rng, dtype=dtype, num_heads=32, num_heads_k=8, head_dim=head_dim,
                         q_lens=q_lens, k_lens=k_lens)
    elif "decode" in layout:
        p = make_paged(rng, dtype, head_dim, "decode-gqa32_8", 16)
    else:
        p = make_paged(rng, dtype, head_dim, "chunked-mqa8_1", 16)
    run_checked(p, 3, f"FA3 {layout} num_splits={num_splits}", causal=True, num_splits=num_splits)


def test_fa3_scheduler_metadata(rng):
    """get_scheduler_metadata for a paged chunked-prefill batch, then the call with it (how
    vLLM drives FA3), twice: the metadata is reusable."""
    require(3)
    if not has_feature("paged"):
        pytest.skip("this wheel has no FA3 'paged' kernels")
    from vendored_flash_attn import get_scheduler_metadata

    dtype, head_dim = built_dtypes(3)[0], primary_head_dim(3)
    p = make_paged(rng, dtype, head_dim, "chunked-mqa8_1", 16)
    metadata = get_scheduler_metadata(
        p.batch, p.max_seqlen_q, p.max_seqlen_k, p.num_heads, p.num_heads_k, head_dim,
        p.seqused_k, qkv_dtype=TORCH_DTYPES[dtype], cu_seqlens_q=p.cu_seqlens_q,
        page_size=p.page_size, causal=True, window_size=(-1, -1), num_splits=0)
    assert isinstance(metadata, torch.Tensor) and metadata.dtype == torch.int32
    for attempt in range(2):
        run_checked(p, 3, f"FA3 paged16 chunked-mqa8_1 scheduler_metadata (call {attempt + 1})",
                    causal=True, scheduler_metadata=metadata)
