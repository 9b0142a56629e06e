"""FA3's kernels for a V head size different from the Q/K one (the 'hdimdiff' feature)
against the float64 reference, and the selector's answer for them.

* 192/128 (Q/K 192, V 128; DeepSeek-style MLA prefill: nope 128 + rope 64 against V 128),
  bf16/fp16/e4m3: packed varlen (MHA: the kernel without PackGQA; GQA: with it), paged,
  split-KV (packed and paged decode), a sliding window, softcap.
* 64/512 with ``q_v`` (vLLM's MLA decode: Q/K = the rope part 64, V = the latent 512,
  ``q_v`` = the nope query absorbed into the latent, one KV head, a paged cache, its own
  softmax scale), 64/512 without ``q_v`` and 64/256, bf16/fp16: paged decode, paged
  chunked prefill, paged split-KV, packed prefill, unpaged decode and split-KV; and softcap
  in each of those (without ``q_v``).

Each kernel the build info lists must run and match the reference; one it does not list
must be refused before any kernel (a FlashAttention input error naming the cause), and
the case is skipped with the build info's reason (gpu_helpers.hdimdiff_unbuilt).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gpu_helpers import (HDIMDIFF_KERNELS, SIXTEEN_BIT, TORCH_DTYPES, Rand, check, chunked_lengths,
                         decode_lengths, expect_refused, fa3_missing_feature, hdimdiff_unbuilt,
                         make_problem, prefill_lengths, require, run_attention)
from reference import attention_ref

pytestmark = pytest.mark.gpu

# name -> (num_heads, num_heads_k, lengths, page_size, num_splits, window)
SCENARIOS_192 = {
    "mha-prefill": (8, 8, prefill_lengths, None, 0, None),
    "gqa-chunked": (16, 2, chunked_lengths, None, 0, None),
    "gqa-paged": (16, 2, chunked_lengths, 16, 0, None),
    "gqa-split": (16, 2, chunked_lengths, None, 3, None),
    "decode-paged-split": (16, 2, decode_lengths, 16, 4, None),
    "gqa-window": (16, 2, chunked_lengths, None, 0, (48, 0)),
}
# vLLM's MLA: 16 q heads over one latent KV head, pages of 64 tokens.
SCENARIOS_64 = {
    "mla-decode-paged": (16, 1, decode_lengths, 64, 0, None),
    "mla-chunked-paged": (16, 1, chunked_lengths, 64, 0, None),
    "mla-decode-split": (16, 1, decode_lengths, 64, 4, None),
    "prefill-packed": (16, 1, prefill_lengths, None, 0, None),
    # Unpaged decode and split-KV: each head dim's files are picked by paged (without TMA),
    # split and PackGQA, so these reach the packgqa and the unpaged split files.
    "decode-packed": (16, 1, decode_lengths, None, 0, None),
    "chunked-packed-split": (16, 1, chunked_lengths, None, 3, None),
}
# (V head dim, with q_v)
CALLS_64 = {"512-q_v": (512, True), "512": (512, False), "256": (256, False)}
# vLLM's MLA backend passes its model's scale (1 / sqrt(qk_nope + qk_rope), DeepSeek 192);
# any fixed scale other than the package's default tests that the call passes it through.
MLA_SCALE = 192 ** -0.5


def _require_kernel(head_dim: int, head_dim_v: int, dtype: str, call) -> None:
    """Skip (after checking the refusal) when the build info does not list the kernel."""
    require(3)
    unbuilt = hdimdiff_unbuilt(head_dim, head_dim_v, dtype)
    if unbuilt is not None:
        reason, fragment = unbuilt
        message = expect_refused(call, fragment)
        pytest.skip(f"no FA3 {head_dim}/{head_dim_v} {dtype} kernel: {reason}; checked that the "
                    f"call is refused: {message}")


def _run(rng: Rand, dtype: str, head_dim: int, head_dim_v: int, scenario, *, causal: bool,
         with_q_v: bool = False, softcap: float = 0.0, softmax_scale=None, label: str):
    heads, heads_k, lengths, page_size, num_splits, window = scenario
    q_lens, k_lens = lengths(rng)
    p = make_problem(rng, dtype=dtype, num_heads=heads, num_heads_k=heads_k, head_dim=head_dim,
                     head_dim_v=head_dim_v, q_lens=q_lens, k_lens=k_lens, page_size=page_size)
    q_v, qv_seqs = None, None
    if with_q_v:
        qv_seqs = [rng.activations(n, heads, head_dim_v).to(TORCH_DTYPES[dtype]) for n in q_lens]
        q_v = torch.cat(qv_seqs)
        qv_seqs = [x.float() for x in qv_seqs]
    extra = {} if q_v is None else {"q_v": q_v}
    if softmax_scale is not None:
        extra["softmax_scale"] = softmax_scale
    opts = dict(causal=causal, window=window, softcap=softcap, num_splits=num_splits)

    def call():
        return run_attention(p, version=3, **opts, **extra)

    _require_kernel(head_dim, head_dim_v, dtype, call)
    missing = fa3_missing_feature(3, dict(opts, paged=page_size is not None))
    if missing:
        message = expect_refused(call, f"'{missing}'")
        pytest.skip(f"this wheel has no FA3 '{missing}' kernels; checked that the call is refused: {message}")
    out, lse = call()
    assert out.shape == (p.total_q, heads, head_dim_v)
    ref_out, ref_lse = attention_ref(p.q_ref, p.k_ref, p.v_ref, softmax_scale=softmax_scale, causal=causal,
                                     window=window, softcap=softcap, qv_seqs=qv_seqs)
    check(p, out, lse, ref_out, ref_lse, label=label, softcap=softcap > 0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scenario", SCENARIOS_192)
@pytest.mark.parametrize("dtype", HDIMDIFF_KERNELS[(192, 128)])
def test_hdimdiff_192_128(rng, dtype, scenario, causal):
    _run(rng, dtype, 192, 128, SCENARIOS_192[scenario], causal=causal,
         label=f"FA3 192/128 {dtype} {scenario} {'causal' if causal else 'full'}")


@pytest.mark.parametrize("dtype", HDIMDIFF_KERNELS[(192, 128)])
def test_hdimdiff_192_128_softcap(rng, dtype):
    _run(rng, dtype, 192, 128, SCENARIOS_192["gqa-chunked"], causal=True, softcap=20.0,
         label=f"FA3 192/128 {dtype} softcap 20")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scenario", SCENARIOS_64)
@pytest.mark.parametrize("call", CALLS_64)
@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_hdimdiff_64(rng, dtype, call, scenario, causal):
    head_dim_v, with_q_v = CALLS_64[call]
    _run(rng, dtype, 64, head_dim_v, SCENARIOS_64[scenario], causal=causal, with_q_v=with_q_v,
         softmax_scale=MLA_SCALE, label=f"FA3 64/{call} {dtype} {scenario} {'causal' if causal else 'full'}")


@pytest.mark.parametrize("scenario", SCENARIOS_64)
@pytest.mark.parametrize("head_dim_v", [512, 256])
@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_hdimdiff_64_softcap(rng, dtype, head_dim_v, scenario):
    """The softcap files of 64/256 and 64/512 (plain, paged, split, paged split, PackGQA)."""
    _run(rng, dtype, 64, head_dim_v, SCENARIOS_64[scenario], causal=True, softcap=20.0,
         softmax_scale=MLA_SCALE, label=f"FA3 64/{head_dim_v} {dtype} {scenario} softcap 20")


@pytest.mark.parametrize("pair,dtype", [(f"{d}/{dv}", dtype) for (d, dv), dtypes in HDIMDIFF_KERNELS.items()
                                        for dtype in dtypes])
def test_selector_answer(real_machine, monkeypatch, pair, dtype):
    """get_flash_attn_version(head_size=, head_size_v=, dtype=): FA3 (3, with no fallback
    warning) where the build info lists the kernel; else None (FA2 takes no different V
    head size), with FA3's refusal among the fallbacks."""
    from vendored_flash_attn import (FlashAttnFallbackWarning, get_flash_attn_version,
                                     select_flash_attn_version)
    from vendored_flash_attn.selection.environment import set_environment

    head_dim, head_dim_v = (int(x) for x in pair.split("/"))
    require(3)
    monkeypatch.delenv("VLLM_FLASH_ATTN_VERSION", raising=False)
    set_environment(None)
    args = dict(head_size=head_dim, head_size_v=head_dim_v, dtype=TORCH_DTYPES[dtype])
    unbuilt = hdimdiff_unbuilt(head_dim, head_dim_v, dtype)
    if unbuilt is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FlashAttnFallbackWarning)
            selection = select_flash_attn_version(**args)
        assert selection.version == 3, selection.reason
        assert selection.fallbacks == ()
        assert get_flash_attn_version(**args) == 3
        # vLLM's positional call: (requires_alibi, head_size, head_size_v, has_sinks)
        assert get_flash_attn_version(False, head_dim, head_dim_v, False, dtype=TORCH_DTYPES[dtype]) == 3
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlashAttnFallbackWarning)
        selection = select_flash_attn_version(**args)
    assert selection.version is None, (
        f"the build info has no {pair} {dtype} kernel ({unbuilt[0]}) but the selector picks "
        f"FA{selection.version}: {selection.reason}")
    said = " ".join(selection.fallbacks) + " " + selection.reason
    assert "FA3" in said and unbuilt[1].lower() in said.lower(), said
