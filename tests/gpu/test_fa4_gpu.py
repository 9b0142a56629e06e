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
    from vendored_flash_attn.declaration.families import registry

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
    nothing may compile (python -m vendored_flash_attn.release.wheel_check fa4-kernels). Skipped, with the build
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
    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp_path / "user-cache")}
    report = tmp_path / "check.json"
    result = subprocess.run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "fa4-kernels", "--report", str(report)],
                            env=env, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    checked = json.loads(report.read_text())
    assert len(checked["calls"]) >= 1 and not checked["failed"]
    out = os.environ.get("OUT")
    if out:  # the device run brings the per-call figures back
        Path(out, "fa4_check_installed.json").write_text(report.read_text())


# --- the debug checks and FA4's own checks, on the GPU ---

def test_fa4_debug_checks_refuse_an_out_of_range_block_id_and_the_process_goes_on(rng, real_machine, monkeypatch):
    """VFA_DEBUG_CHECKS=1 and one block id out of range, as measured before FA4 had the debug
    checks: FA2 and FA3 refused it, fa_version=4 ran it and the CUDA context died
    (cudaErrorInvalidAddressSpace). Now refused, and the same process computes right after."""
    import vendored_flash_attn as vfa
    from vendored_flash_attn.selection.environment import set_environment

    from gpu_helpers import expect_refused

    p = make_problem(rng, dtype="bf16", num_heads=16, num_heads_k=4, head_dim=128, q_lens=[5, 9],
                     k_lens=[300, 700], page_size=128)
    table = p.block_table.clone()
    table[1, 3] = 1_000_000  # sequence 1 reads blocks 0-5
    monkeypatch.setenv("VFA_DEBUG_CHECKS", "1")
    set_environment(None)  # read once per process: read it again
    expect_refused(lambda: vfa.flash_attn_varlen_func(**{**p.kwargs(), "block_table": table}, causal=True,
                                                      fa_version=4),
                   "block_table[1, 3] = 1000000 is outside the KV cache")
    run_checked(p, 4, "FA4 after a refused block id", causal=True)


# A child process: FA4 calls on real tensors, their error against SDPA in float32, FA4's
# RuntimeWarnings (the kernel cache's), and python -O's flag; one JSON line.
_CHILD = r"""
import json, sys, warnings
import torch
import vendored_flash_attn as vfa

mode = sys.argv[1]
torch.manual_seed(0)
h, hk, d, s = 8, 2, 128, 200
q, k, v = (torch.randn(s, n, d, device="cuda", dtype=torch.bfloat16) for n in (h, hk, hk))
cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
result = {"optimize": sys.flags.optimize}
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    if mode == "irregular-paged":
        # a head size off a multiple of 16 in a paged cache whose page is not the kernel's
        # tile: upstream asserts against it ("Paged KV does not support irregular head dim")
        qi = torch.randn(4, h, 72, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(8, 16, hk, 72, device="cuda", dtype=torch.bfloat16)
        try:
            vfa.flash_attn_varlen_func(qi, cache, cache, 1, torch.arange(5, dtype=torch.int32, device="cuda"), 32,
                                       seqused_k=torch.full((4,), 30, dtype=torch.int32, device="cuda"),
                                       block_table=torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2),
                                       causal=True, fa_version=4)
            result["refused"] = None
        except vfa.FlashAttnInputError as exc:
            result["refused"] = str(exc)
        torch.cuda.synchronize()
    out = vfa.flash_attn_varlen_func(q, k, v, s, cu, s, cu_seqlens_k=cu, causal=True, fa_version=4)
    torch.cuda.synchronize()
result["warnings"] = [str(w.message) for w in record  # the package's about its kernel cache
                      if issubclass(w.category, RuntimeWarning) and str(w.message).startswith("FA4")]
ref = torch.nn.functional.scaled_dot_product_attention(
    q.float().transpose(0, 1)[None], k.float().repeat_interleave(h // hk, 1).transpose(0, 1)[None],
    v.float().repeat_interleave(h // hk, 1).transpose(0, 1)[None], is_causal=True)[0].transpose(0, 1)
result["error"] = float((out.float() - ref).norm() / ref.norm())
print("RESULT " + json.dumps(result))
"""


def _child(mode: str, env: dict, optimize: bool = False) -> dict:
    import json
    import subprocess
    import sys

    command = [sys.executable] + (["-O"] if optimize else []) + ["-c", _CHILD, mode]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_fa4s_own_checks_hold_under_python_O(tmp_path):
    """Upstream checks what its kernels need with assert, which python -O removes; the adapter
    checks it itself. In a python -O process on this GPU, the call upstream would assert on is
    refused before any kernel, and a valid one after it is right."""
    import os

    from gpu_helpers import OUT_TOL

    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp_path / "user-cache")}
    result = _child("irregular-paged", env, optimize=True)
    assert result["optimize"] == 1
    assert result["refused"] and "needs a page size of" in result["refused"], result
    assert result["error"] <= OUT_TOL["bf16"], result


def test_the_user_kernel_cache_on_real_kernels(tmp_path):
    """The user cache with kernels the DSL compiled here, each step a fresh process with the
    shipped kernels off: (1) compiles and writes whole kernel files, no temporary left; (2)
    the files cut in half (what an in-place write killed midway left): one warning each,
    removed, compiled again, the same bytes written anew, results right; (3) loaded, nothing
    compiled or written; (4) the cache folder made writable by others: not loaded from, one
    warning, compiled in memory, results right, nothing written."""
    import os

    from gpu_helpers import OUT_TOL

    cache = tmp_path / "user-cache"
    env = {**os.environ, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(cache), "VFA_FA4_SHIPPED_KERNELS": "off"}
    tol = OUT_TOL["bf16"]

    first = _child("plain", env)
    assert first["error"] <= tol and first["warnings"] == [], first
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    assert files and all(p.suffix == ".o" and not p.name.startswith(".tmp-") for p in files), files
    whole = {p: p.read_bytes() for p in files}

    for p, data in whole.items():
        p.write_bytes(data[: len(data) // 2])
    second = _child("plain", env)
    assert second["error"] <= tol, second
    recovered = [w for w in second["warnings"] if "could not be loaded" in w and "removed" in w]
    assert len(recovered) == len(files) and len(second["warnings"]) == len(files), second["warnings"]
    assert {p: p.read_bytes() for p in files} == whole  # compiled again, byte for byte

    before = {p: p.stat().st_ino for p in files}
    third = _child("plain", env)
    assert third["error"] <= tol and third["warnings"] == [], third
    assert {p: p.stat().st_ino for p in sorted(p for p in cache.rglob("*") if p.is_file())} == before

    cache.chmod(0o777)
    fourth = _child("plain", env)
    assert fourth["error"] <= tol, fourth
    assert len(fourth["warnings"]) == 1 and "writable by" in fourth["warnings"][0], fourth["warnings"]
    assert {p: p.stat().st_ino for p in sorted(p for p in cache.rglob("*") if p.is_file())} == before
