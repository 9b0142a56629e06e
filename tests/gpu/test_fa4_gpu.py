"""FA4 (upstream's CuTe DSL kernels, vendored_flash_attn._fa4) through the package's
``flash_attn_varlen_func(..., fa_version=4)`` against the float64-free float32 reference of
the other GPU tests (gpu_helpers.reference), with the shared problem builder: packed varlen
and paged K/V (shuffled block_table, garbage in unused slots), GQA, causal and local, head
dims 64, 128 and 192, bf16 and fp16. Each case JIT-compiles its kernel on first use (2-6 s on
the H200) unless the wheel or the user cache holds it.

Skipped, with the selector's reason, where FA4 cannot run (no FA4 in the wheel, its
dependencies missing: `pip install "vendored-flash-attn[fa4]"`, a GPU it has no kernels for).
"""

from __future__ import annotations

import pytest

from gpu_helpers import chunked_lengths, decode_lengths, make_problem, prefill_lengths, run_checked

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_fa4():
    import vendored_flash_attn

    reason = vendored_flash_attn.fa_version_unsupported_reason(4)
    if reason:
        pytest.skip(f"FA4 not usable: {reason}")


LAYOUTS = {
    # name: (lengths, page size or None, heads q/kv, causal, window)
    "varlen-prefill-full": ("prefill", None, (16, 4), False, None),
    "varlen-prefill-causal": ("prefill", None, (16, 4), True, None),
    "varlen-prefill-local128": ("prefill", None, (16, 4), True, (128, 0)),
    "paged128-decode": ("decode", 128, (32, 8), True, None),
    "paged128-chunked": ("chunked", 128, (8, 1), True, None),
}
LENGTHS = {"prefill": prefill_lengths, "decode": decode_lengths, "chunked": chunked_lengths}


def cases():
    out = [pytest.param(128, "bf16", layout, id=f"hd128-bf16-{layout}") for layout in LAYOUTS]
    out.append(pytest.param(128, "fp16", "varlen-prefill-causal", id="hd128-fp16-varlen-prefill-causal"))
    for head_dim in (64, 192):
        for layout in ("varlen-prefill-causal", "paged128-decode"):
            out.append(pytest.param(head_dim, "bf16", layout, id=f"hd{head_dim}-bf16-{layout}"))
    return out


@pytest.mark.parametrize("head_dim,dtype,layout", cases())
def test_fa4_matches_the_reference(head_dim, dtype, layout, rng):
    lengths, page, (hq, hk), causal, window = LAYOUTS[layout]
    q_lens, k_lens = LENGTHS[lengths](rng)
    p = make_problem(rng, dtype=dtype, num_heads=hq, num_heads_k=hk, head_dim=head_dim,
                     q_lens=q_lens, k_lens=k_lens, page_size=page)
    run_checked(p, 4, f"FA4 {layout} hd{head_dim}", causal=causal, window=window)


def test_fa4_refuses_what_it_cannot_do_before_any_kernel(rng):
    """ALiBi is FA2's: refused with the family that can, no kernel launched."""
    import torch

    from gpu_helpers import expect_refused, run_attention

    p = make_problem(rng, dtype="bf16", num_heads=16, num_heads_k=4, head_dim=128,
                     q_lens=[5, 9], k_lens=[5, 9])
    expect_refused(lambda: run_attention(p, version=4, alibi_slopes=torch.ones(16, device="cuda")),
                   "fa_version=2")
