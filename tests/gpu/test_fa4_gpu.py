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


def test_fa4_softcap_matches_the_reference(rng):
    """vLLM's softcap (Gemma-2's 50, Grok's 30) through FA4: upstream's softcap score_mod."""
    q_lens, k_lens = prefill_lengths(rng)
    p = make_problem(rng, dtype="bf16", num_heads=16, num_heads_k=4, head_dim=128, q_lens=q_lens, k_lens=k_lens)
    run_checked(p, 4, "FA4 softcap 30 hd128", causal=True, softcap=30.0)


def test_fa4_sinks_match_the_reference(rng):
    """Attention sinks (vLLM's s_aux: one bf16 logit per query head that takes part in the
    softmax and adds no value; gpt-oss) through FA4's learnable_sink. The reference follows
    from the sink-free one: out * 1 / (1 + exp(sink - lse)), its LSE the natural log of the
    softmax's denominator."""
    import torch

    from gpu_helpers import check, reference, run_attention

    q_lens, k_lens = prefill_lengths(rng)
    p = make_problem(rng, dtype="bf16", num_heads=16, num_heads_k=4, head_dim=128, q_lens=q_lens, k_lens=k_lens,
                     page_size=128)
    sinks = (torch.randn(16, device="cuda") * 2).to(torch.bfloat16)
    out, _ = run_attention(p, version=4, causal=True, lse=False, s_aux=sinks)
    ref_out, ref_lse = reference(p, causal=True)
    kept = torch.sigmoid(ref_lse.float() - sinks.float()[:, None])  # (heads, total_q)
    ref_sinks = ref_out.float() * kept.transpose(0, 1)[..., None]
    check(p, out, None, ref_sinks.to(ref_out.dtype), ref_lse, label="FA4 sinks hd128 paged")
    # the sinks changed the output: a kernel that ignored s_aux would not pass the check above
    assert float((ref_sinks - ref_out.float()).norm() / ref_out.float().norm()) > 0.01


def test_fa4_refuses_what_it_cannot_do_before_any_kernel(rng):
    """ALiBi is FA2's: refused with the family that can, no kernel launched."""
    import torch

    from gpu_helpers import expect_refused, run_attention

    p = make_problem(rng, dtype="bf16", num_heads=16, num_heads_k=4, head_dim=128,
                     q_lens=[5, 9], k_lens=[5, 9])
    expect_refused(lambda: run_attention(p, version=4, alibi_slopes=torch.ones(16, device="cuda")),
                   "fa_version=2")


# --- FP8 KV (FA4's sm90 path: bf16 q, FP8 K/V in a paged cache, dequantized in the kernel) ---

def _fp8_accuracy():
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))  # its `import common`
    spec = importlib.util.spec_from_file_location("vfa_bench_fp8_accuracy_fa4", bench / "fp8_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fp8_accuracy = _fp8_accuracy()


def _fp8_kv_head_dims():
    from vendored_flash_attn.families import registry

    return registry().by_name("fa4").call.fp8_kv_head_dims or (128,)


@pytest.mark.parametrize("dist", fp8_accuracy.BAR_DISTRIBUTIONS)
@pytest.mark.parametrize("shape", list(fp8_accuracy.LONG_CONTEXT_SHAPES))
@pytest.mark.parametrize("head_dim", _fp8_kv_head_dims())
def test_fa4_fp8_kv_long_context_accuracy(head_dim, shape, dist):
    """The long-context FP8 cases of fp8_accuracy.py (non-zero-mean V up to 128k keys) on FA4's
    FP8 KV path at each head dim its declaration takes it at, against float64, held to FA3's
    bar: <= 0.5 % and <= 3x the bf16 kernel's error on the same values."""
    import zlib

    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FA4's FP8 KV path (bf16 q with FP8 K/V) is sm90-only at the pin")
    row = fp8_accuracy.long_context_case(shape, dist, seed=zlib.crc32(f"{shape}/{dist}".encode()) % 1000,
                                         head_dim=head_dim, version=4)
    assert row["finite"], row
    fp8_err, bf16_err = row["fp8_kernel"], row["bf16_same_inputs"]
    bar = fp8_accuracy.LONG_CONTEXT_BAR
    assert fp8_err <= bar["max_rel_l2"], (
        f"{shape} {dist}: FA4 FP8 KV relative L2 error {fp8_err:.3e} > {bar['max_rel_l2']:.0e} "
        f"(bf16 on the same values: {bf16_err:.3e})")
    assert fp8_err <= bar["max_ratio_to_bf16"] * bf16_err, (
        f"{shape} {dist}: FA4 FP8 KV error {fp8_err:.3e} is more than {bar['max_ratio_to_bf16']}x the bf16 "
        f"error {bf16_err:.3e} on the same values")


def test_fa4_fp8_kv_is_refused_at_a_head_dim_it_computes_wrong():
    """Head dim 128 (Llama's) on FA4's FP8 KV path gave 40 % error at the pin (docs/fa4.md):
    refused before any kernel, naming FA3."""
    import torch

    from vendored_flash_attn import flash_attn_varlen_func
    from vendored_flash_attn.errors import FlashAttnInputError

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FA4's FP8 KV path is sm90-only at the pin")
    assert 128 not in _fp8_kv_head_dims()
    x = fp8_accuracy.long_context_inputs("v_mean", (1, 1), (300, 200), seed=1, page=128)
    ones = x["descale"]
    with pytest.raises(FlashAttnInputError, match=r"FA4 takes it at head size .* FA3 \(fa_version=3\)"):
        flash_attn_varlen_func(x["q"].to(torch.bfloat16), x["k_cache"], x["v_cache"], 1, x["cu_seqlens_q"], 300,
                               seqused_k=x["seqused_k"], block_table=x["block_table"], causal=True,
                               q_descale=ones, k_descale=ones, v_descale=ones, fa_version=4)


# --- the wheel's precompiled kernels ---

def test_the_precompiled_kernels_run_with_no_compile(tmp_path):
    """Every FA4 kernel the wheel precompiled for this Python and this GPU, called through
    the public function on real data in a fresh process whose user cache starts empty:
    nothing may compile (cmake/fa4_precompile.py check-installed). Skipped, with the build
    record's words, for a wheel built without precompiled kernels for them."""
    import json
    import os
    import subprocess
    import sys
    from importlib import resources
    from pathlib import Path

    import torch

    record = json.loads(resources.files("vendored_flash_attn._fa4").joinpath("build_info.json").read_text())
    precompile = record.get("precompile", {})
    major, minor = torch.cuda.get_device_capability()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    shipped = [r for r in precompile.get("runs", [])
               if r.get("arch") == f"sm_{major}{minor}a" and r.get("python") == python and r.get("kernels")]
    if not shipped:
        pytest.skip(f"this wheel ships no FA4 kernels for sm_{major}{minor}a and Python {python} "
                    f"(precompile {precompile.get('state')}: {precompile.get('reason') or 'other Pythons/archs'})")
    script = Path(__file__).resolve().parents[2] / "cmake" / "fa4_precompile.py"
    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp_path / "user-cache")}
    report = tmp_path / "check.json"
    result = subprocess.run([sys.executable, str(script), "check-installed", "--report", str(report)],
                            env=env, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    checked = json.loads(report.read_text())
    assert len(checked["calls"]) >= 1 and not checked["failed"]
    out = os.environ.get("OUT")
    if out:  # the device run brings the per-call figures back
        Path(out, "fa4_check_installed.json").write_text(report.read_text())
