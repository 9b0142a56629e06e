"""FA4's adapter (fa4/adapter.py) on a CPU: a fake ``vendored_flash_attn._fa4.cute`` (interface and
cache_utils) and a fake ``cutlass`` stand in for the staged sources and the DSL; the fake
``_flash_attn_fwd`` records what it was called with, by name."""

from __future__ import annotations

# One file over 500 lines, on purpose: one module under test (fa4/adapter.py) and the one stand-in for the
# DSL its cases share.

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from runtime_fakes import AMPERE, BLACKWELL, BLACKWELL_12, FA4_RECORD, HOPPER, make_build
from vendored_flash_attn.families.fa4 import adapter as fa4, cache as fa4_cache, deps as fa4_deps
from vendored_flash_attn import flash_attn_varlen_func, interface
from vendored_flash_attn.errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
HEADS, KV_HEADS, D, PAGE, SEQS = 8, 2, 128, 128, 3
SM110 = (11, 0)  # Blackwell of another generation number: FA4's sm100 kernels, not its FP8 ones

# Upstream checks what its kernels need with `assert` (interface.py and the kernel classes at
# the pin), which `python -O` removes. The stand-in's copy of those checks is compiled like
# upstream's module is, so under -O it vanishes too: a call the adapter does not refuse itself
# then reaches the "kernel" (test_the_adapter_checks_hold_under_python_O).
_UPSTREAM_ASSERTS = compile("""
def check(q, k, v, kw):
    arch, head_dim, head_dim_v = kw["_arch"], q.shape[-1], v.shape[-1]
    alignment = 16 // v.element_size()
    if arch // 10 == 9:
        assert 8 <= head_dim <= 512 and 8 <= head_dim_v <= 512 and not head_dim % alignment \\
            and not head_dim_v % alignment, "head dims on SM90"
        assert kw["page_table"] is None or k.shape[1] == 128 or not (head_dim % 16 or head_dim_v % 16), \\
            "Paged KV does not support irregular head dim"
    elif arch // 10 in (10, 11):
        assert ((8 <= head_dim <= 128 and 8 <= head_dim_v <= 128) or (head_dim, head_dim_v) == (192, 128)
                or (head_dim in (64, head_dim_v) and head_dim_v == 512) or head_dim == head_dim_v == 256) \\
            and not head_dim % alignment and not head_dim_v % alignment, "head dims on SM100/SM110"
        if head_dim == head_dim_v == 256:
            assert kw["softcap"] == 0 and kw["learnable_sink"] is None and kw["seqused_k"] is None, "hd256"
            assert kw["window_size_left"] is None and kw["q_descale"] is None and kw["num_splits"] <= 1, "hd256"
        assert not (kw["num_splits"] > 1 and -(-head_dim_v // 16) * 16 >= 192), "split with hdim_v >= 192"
    if q.dtype == torch.float8_e4m3fn:
        assert arch // 10 == 10, "FP8 is only supported on SM100"
""", "<the stand-in's copy of upstream's asserts>", "exec")
_UPSTREAM = {"torch": torch}
exec(_UPSTREAM_ASSERTS, _UPSTREAM)


def fa4_call(*args, **kwargs):
    """A call as vLLM makes it, with fa_version=4: the interface, its shared and debug checks,
    then FA4's adapter (fa4.forward)."""
    return flash_attn_varlen_func(*args, fa_version=4, **kwargs)


@pytest.fixture
def describe(describe):
    """The runtime's describe, with FA4 in the wheel (its build record) unless a build is given."""
    def install(caps=(HOPPER,), build=None, **kwargs):
        return describe(caps=caps, build=make_build("full", fa4=FA4_RECORD) if build is None else build, **kwargs)

    return install


class FakeFA4:
    def __init__(self, tile_n=128):
        self.calls: list[tuple[tuple, dict]] = []
        self.tile_n = tile_n
        self.deps_checked = 0
        self.assertion = None

    def _flash_attn_fwd(self, q, k, v, **kwargs):
        if self.assertion:
            raise AssertionError(self.assertion)
        _UPSTREAM["check"](q, k, v, kwargs)  # gone under python -O, as upstream's asserts are
        self.calls.append(((q, k, v), kwargs))  # what reached the kernels
        out = kwargs["out"] if kwargs["out"] is not None else torch.zeros(q.shape[0], q.shape[1], v.shape[-1])
        lse = torch.zeros(q.shape[1], q.shape[0]) if kwargs["return_lse"] else None
        return out, lse, None, None

    def _resolve_causal_local_window(self, causal, left, right):
        self.window_asked = (causal, left, right)
        return causal, left is not None and not causal, left, right

    def _tile_size_fwd_sm90(self, head_dim, head_dim_v, causal, local):
        self.tile_asked = (head_dim, head_dim_v, causal, local)
        return types.SimpleNamespace(n_block_size=self.tile_n)


@pytest.fixture
def fake(monkeypatch, describe, tmp_path):
    describe(caps=(HOPPER,))
    state = FakeFA4()
    interface = types.ModuleType(f"{fa4.SUBPACKAGE}.interface")
    for name in ("_flash_attn_fwd", "_resolve_causal_local_window", "_tile_size_fwd_sm90"):
        # Plain functions, as upstream's: the kernel cache is an attribute of _flash_attn_fwd.
        setattr(interface, name, lambda *a, _method=getattr(state, name), **kw: _method(*a, **kw))
    cache_utils = types.ModuleType(f"{fa4.SUBPACKAGE}.cache_utils")
    cache_utils.JITPersistentCache = type("JITPersistentCache", (), {
        "EXPORT_FUNCTION_PREFIX": "func", "__init__": lambda self, path: setattr(self, "cache", {})})
    cache_utils._compute_source_fingerprint = lambda: "0" * 64
    cutlass = types.ModuleType("cutlass")
    cutlass.CUDA_VERSION = types.SimpleNamespace(major=12, minor=9)
    cutlass.cute = types.ModuleType("cutlass.cute")
    for name, module in ((f"{fa4.SUBPACKAGE}.interface", interface), (f"{fa4.SUBPACKAGE}.cache_utils", cache_utils),
                         ("cutlass", cutlass), ("cutlass.cute", cutlass.cute)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(fa4, "_loaded", None)
    monkeypatch.setattr(fa4_cache, "shipped_root", lambda: None)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(tmp_path / "fa4-cache"))

    def check():
        state.deps_checked += 1

    monkeypatch.setattr(fa4_deps, "check", check)
    state.interface = interface
    return state


def _paged(q_dtype=BF16, kv_dtype=BF16, page=PAGE, d=D):
    q = torch.zeros(SEQS, HEADS, d, dtype=q_dtype)
    k = torch.zeros(SEQS * 4, page, KV_HEADS, d, dtype=kv_dtype)
    v = torch.zeros(SEQS * 4, page, KV_HEADS, d, dtype=kv_dtype)
    return dict(q=q, k=k, v=v, max_seqlen_q=1, cu_seqlens_q=torch.arange(SEQS + 1, dtype=torch.int32),
                max_seqlen_k=4 * page, seqused_k=torch.full((SEQS,), 300, dtype=torch.int32),
                block_table=torch.arange(SEQS * 4, dtype=torch.int32).reshape(SEQS, 4))


def _descales():
    return {name: torch.ones(SEQS, KV_HEADS) for name in ("q_descale", "k_descale", "v_descale")}


def test_every_argument_of_a_paged_call_reaches_fa4_by_name(fake):
    call = _paged()
    out = torch.empty(SEQS, HEADS, D, dtype=BF16)
    sinks = torch.zeros(HEADS, dtype=BF16)
    result = fa4_call(
        **call, softmax_scale=0.1, causal=True, window_size=[127, 0], softcap=30.0, out=out,
        return_softmax_lse=True, num_splits=0, s_aux=sinks, **_descales())
    assert fake.deps_checked == 1
    (q, k, v), kwargs = fake.calls[-1]
    assert (q, k, v) == (call["q"], call["k"], call["v"])
    assert kwargs["page_table"] is call["block_table"]
    assert kwargs["seqused_k"] is call["seqused_k"]
    assert kwargs["cu_seqlens_q"] is call["cu_seqlens_q"]
    assert kwargs["cu_seqlens_k"] is None
    assert (kwargs["max_seqlen_q"], kwargs["max_seqlen_k"]) == (1, 4 * PAGE)
    assert kwargs["softmax_scale"] == 0.1
    assert kwargs["causal"] is True
    assert kwargs["softcap"] == 30.0
    assert (kwargs["window_size_left"], kwargs["window_size_right"]) == (127, 0)
    assert kwargs["learnable_sink"] is sinks
    assert kwargs["num_splits"] == 0  # vLLM's 0 = upstream's heuristic (< 1)
    assert kwargs["return_lse"] is True
    assert kwargs["out"] is out
    # bf16 data: vLLM's descales are dropped (FA4 asserts None for 16-bit inputs).
    assert (kwargs["q_descale"], kwargs["k_descale"], kwargs["v_descale"]) == (None, None, None)
    assert kwargs["fp8_kv_dequant"] is False
    assert kwargs["_arch"] == 90
    assert set(kwargs) == {"cu_seqlens_q", "cu_seqlens_k", "seqused_k", "max_seqlen_q", "max_seqlen_k",
                           "page_table", "softmax_scale", "causal", "softcap", "window_size_left",
                           "window_size_right", "learnable_sink", "num_splits", "return_lse", "out",
                           "q_descale", "k_descale", "v_descale", "fp8_kv_dequant", "_arch"}
    assert result[0] is out and result[1].shape == (HEADS, SEQS)


def test_a_varlen_call_with_defaults(fake, describe):
    describe(caps=(BLACKWELL,))
    q = torch.zeros(10, HEADS, 64, dtype=BF16)
    k = v = torch.zeros(12, KV_HEADS, 64, dtype=BF16)
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    out = fa4_call(q, k, v, 6, cu_q, 7, cu_seqlens_k=cu_k)
    _, kwargs = fake.calls[-1]
    assert isinstance(out, torch.Tensor)  # no LSE asked for: out alone
    assert kwargs["cu_seqlens_k"] is cu_k and kwargs["page_table"] is None and kwargs["seqused_k"] is None
    assert (kwargs["window_size_left"], kwargs["window_size_right"]) == (None, None)  # (-1, -1): unbounded
    assert kwargs["softmax_scale"] == 64 ** -0.5
    assert kwargs["return_lse"] is False and kwargs["_arch"] == 100


# FA4's FP8 KV path is declared for head size 512 only (cmake/knobs.json, measured on the H200).
FP8_KV_D = 512


def test_fp8_kv_with_a_bf16_q_takes_upstreams_in_kernel_dequant_on_sm90(fake):
    descales = _descales()
    fa4_call(**_paged(kv_dtype=E4M3, d=FP8_KV_D), causal=True, **descales)
    _, kwargs = fake.calls[-1]
    assert kwargs["fp8_kv_dequant"] is True
    assert all(kwargs[name] is descales[name] for name in descales)
    assert fake.tile_asked == (FP8_KV_D, FP8_KV_D, True, False)


def test_fp8_kv_at_a_head_size_fa4_computes_wrong_is_refused_naming_fa3(fake):
    # head size 128: 40 % error on the H200 at the pin (tests/gpu/fa4_fp8_probe.py)
    with pytest.raises(fa4.FA4Unsupported, match=r"head size 128: FA4 takes it at head size 512 only \(at the "
                                                 r"pin.*40 % error.*Use FP8 q, k and v with FA3 \(fa_version=3\)"):
        fa4_call(**_paged(kv_dtype=E4M3), causal=True, **_descales())
    assert fake.calls == []


def test_fp8_kv_with_a_page_size_other_than_fa4s_tile_is_refused_before_the_kernel(fake):
    with pytest.raises(fa4.FA4Unsupported, match=r"page size of 128 .* got 64; or FP8 q, k and v with FA3"):
        fa4_call(**_paged(kv_dtype=E4M3, page=64, d=FP8_KV_D), **_descales())
    assert fake.calls == []


def test_fp8_q_k_v_on_sm100_passes_the_descales(fake, describe):
    describe(caps=(BLACKWELL,))
    descales = _descales()
    fa4_call(**_paged(q_dtype=E4M3, kv_dtype=E4M3), **descales)
    _, kwargs = fake.calls[-1]
    assert kwargs["fp8_kv_dequant"] is False and kwargs["k_descale"] is descales["k_descale"]


REFUSALS = [
    ("FP8 q needs FA3", HOPPER, lambda: _paged(q_dtype=E4M3, kv_dtype=E4M3), {}),
    ("FP8 KV with a torch.bfloat16 q is FA4's sm90 path only", BLACKWELL, lambda: _paged(kv_dtype=E4M3), {}),
]


@pytest.mark.parametrize("message, cap, make, extra", REFUSALS, ids=[r[0].split()[0] + str(r[1]) for r in REFUSALS])
def test_what_fa4_cannot_do_is_refused_before_fa4_is_even_imported(fake, describe, message, cap, make, extra):
    describe(caps=(cap,))
    with pytest.raises(fa4.FA4Unsupported, match=message) as refused:
        fa4_call(**make(), **extra)
    assert isinstance(refused.value, FlashAttnInputError)
    assert fake.deps_checked == 0 and fake.calls == []


GENERATION_REFUSALS = [
    (AMPERE, r"FA4 runs on sm90, sm100 only .* compute capability 8.0"),
    # sm120 is excluded by the declaration: its kernel does not compile at the pin
    (BLACKWELL_12, r"does not run on compute capability 12.x in this package: at the pin, FA4's sm120 forward "
                   r"kernel does not compile"),
]


@pytest.mark.parametrize("cap, message", GENERATION_REFUSALS, ids=["sm80", "sm120"])
def test_a_gpu_fa4_does_not_run_on_is_refused_by_the_interface_and_by_the_adapter(fake, describe, cap, message):
    """fa_version=4 on such a GPU: the interface refuses it (the declaration's words); fa4.run,
    which the precompile step calls per arch without the interface, refuses it as well, naming
    the declared fallback."""
    describe(caps=(cap,))
    with pytest.raises(FlashAttnUnavailableError, match="fa_version=4 cannot run here: .*" + message):
        fa4_call(**_paged())
    with pytest.raises(fa4.FA4Unsupported, match=message + r".*; use FA2 \(fa_version=2\)"):
        fa4.run(cap[0] * 10 + cap[1], **_paged())
    assert fake.deps_checked == 0 and fake.calls == []


def _fp16(name):
    return lambda call: {**call, name: call[name].half()}


# What every family refuses, refused for FA4 by the same checks (validation.check_varlen_call,
# against FA4's declaration) with the same messages, before FA4's own and before any import.
# Before FA4 went through them, each of these reached upstream's _flash_attn_fwd.
SHARED_REFUSALS = [
    ("q-float32", lambda c: {**c, "q": c["q"].float()}, FlashAttnTypeError,
     r"q: FA4 supports dtypes bfloat16, float16, float8_e4m3fn, got float32"),
    ("v-dtype", _fp16("v"), FlashAttnTypeError, r"v has dtype torch.float16 but q has torch.bfloat16"),
    ("gqa-ratio", lambda c: {**c, "q": torch.zeros(SEQS, 3, D, dtype=BF16)}, FlashAttnInputError,
     r"q has 3 heads and k/v have 2"),
    ("k-v-shapes", lambda c: {**c, "v": c["v"][:, :64]}, FlashAttnInputError, r"k and v must agree"),
    ("cu_seqlens_q-int64", lambda c: {**c, "cu_seqlens_q": c["cu_seqlens_q"].long()}, FlashAttnTypeError,
     r"cu_seqlens_q must have dtype torch.int32"),
    ("seqused_k-length", lambda c: {**c, "seqused_k": c["seqused_k"][:2]}, FlashAttnInputError,
     r"seqused_k must have shape \(3,\)"),
    ("block_table-rows", lambda c: {**c, "block_table": c["block_table"][:2]}, FlashAttnInputError,
     r"block_table has 2 rows but cu_seqlens_q describes 3 sequences"),
    ("block_table-int64", lambda c: {**c, "block_table": c["block_table"].long()}, FlashAttnTypeError,
     r"block_table must have dtype torch.int32"),
    ("cu_seqlens_k-with-block_table", lambda c: {**c, "cu_seqlens_k": torch.zeros(SEQS + 1, dtype=torch.int32)},
     FlashAttnInputError, r"block_table \(paged KV cache\) needs seqused_k .* and no cu_seqlens_k"),
    ("out-dtype", lambda c: {**c, "out": torch.empty(SEQS, HEADS, D, dtype=torch.float16)}, FlashAttnTypeError,
     r"out has dtype torch.float16; it must be torch.bfloat16"),
    ("out-shape", lambda c: {**c, "out": torch.empty(SEQS, HEADS, 64, dtype=BF16)}, FlashAttnInputError,
     r"out must have shape \(3, 8, 128\)"),
    ("max_seqlen_k-tensor", lambda c: {**c, "max_seqlen_k": torch.tensor(512)}, FlashAttnTypeError,
     r"max_seqlen_k must be a Python int"),
    ("fp8-kv-descale-shape", lambda c: {**_paged(kv_dtype=E4M3), "k_descale": torch.ones(SEQS)},
     FlashAttnInputError, r"k_descale must have shape \(num_seqs, num_kv_heads\) = \(3, 2\)"),
    ("dropout", lambda c: {**c, "dropout_p": 0.1}, FlashAttnInputError, r"dropout_p must be 0.0"),
    ("sinks-dtype", lambda c: {**c, "s_aux": torch.zeros(HEADS)}, FlashAttnTypeError,
     r"s_aux must be bfloat16, got torch.float32"),
    # The arguments of features FA4 does not declare, refused naming the families that do.
    ("alibi", lambda c: {**c, "alibi_slopes": torch.zeros(HEADS)}, FlashAttnInputError,
     r"ALiBi \(alibi_slopes\) is not supported by FA4; pass fa_version=2 .* picks FA2"),
    ("q_v", lambda c: {**c, "q_v": torch.zeros(SEQS, HEADS, D)}, FlashAttnInputError,
     r"q_v needs FA3; FA4 does not support it"),
    ("scheduler_metadata", lambda c: {**c, "scheduler_metadata": torch.zeros(4, dtype=torch.int32)},
     FlashAttnInputError, r"scheduler_metadata .* is FA3-only; pass None with FA4"),
    ("cp_world_size", lambda c: {**c, "cp_world_size": 2}, FlashAttnInputError,
     r"context parallelism \(cp_world_size > 1\) needs FA3"),
    ("cp_rank", lambda c: {**c, "cp_rank": 1}, FlashAttnInputError, r"cp_rank must be 0 without context parallelism"),
]


@pytest.mark.parametrize("change, error, message", [r[1:] for r in SHARED_REFUSALS],
                         ids=[r[0] for r in SHARED_REFUSALS])
def test_fa4_calls_pass_the_checks_every_family_passes(fake, change, error, message):
    with pytest.raises(error, match=message) as refused:
        fa4_call(**change(_paged()))
    assert not isinstance(refused.value, fa4.FA4Unsupported)  # the shared refusal, not FA4's own
    assert fake.deps_checked == 0 and fake.calls == []


def test_the_dependency_check_comes_before_the_import(fake, monkeypatch):
    def missing():
        raise fa4_deps.FA4DependencyError("nvidia-cutlass-dsl 4.7.0 is installed, ==4.6.0.dev0 is required")

    monkeypatch.setattr(fa4_deps, "check", missing)
    monkeypatch.delitem(sys.modules, f"{fa4.SUBPACKAGE}.interface")  # an import would now fail otherwise
    with pytest.raises(fa4_deps.FA4DependencyError, match="4.7.0 is installed"):
        fa4_call(**_paged())
    assert fa4._loaded is None


def test_fa4_is_loaded_once_with_its_kernel_cache(fake, tmp_path):
    fa4_call(**_paged())
    fa4_call(**_paged())
    assert fake.deps_checked == 1
    layout = fa4._loaded.cache_layout
    assert layout["flavour"] == "cu12.9"
    assert layout["kinds"]["fwd"]["user"] == str(tmp_path / "fa4-cache/cu12.9" / ("0" * 64) / "fwd")


def test_an_upstream_assertion_becomes_a_clear_error(fake):
    fake.assertion = "head_dim must be between 8 and 256"
    with pytest.raises(fa4.FA4Unsupported, match="FA4 refused the call: head_dim must be between 8 and 256"):
        fa4_call(**_paged())


def test_a_wheel_without_fa4_says_how_to_get_it(fake, monkeypatch):
    monkeypatch.delitem(sys.modules, f"{fa4.SUBPACKAGE}.interface")
    with pytest.raises(FlashAttnUnavailableError, match="VFA_BUILD_FA4"):
        fa4.load()


# --- VFA_DEBUG_CHECKS: the index checks every family gets ---------------------------------------

def _bad_block_id():
    call = _paged()
    call["block_table"] = call["block_table"].clone()
    call["block_table"][1, 2] = 1_000_000  # a block the sequence reads (300 tokens: blocks 0-2)
    return call


def test_debug_checks_refuse_an_out_of_range_block_id_before_fa4_runs(fake, describe):
    """Measured on the H200 before: FA2/FA3 refused this under VFA_DEBUG_CHECKS=1, while
    fa_version=4 ran it and the CUDA context died (cudaErrorInvalidAddressSpace)."""
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "1"})
    with pytest.raises(FlashAttnInputError, match=r"block_table\[1, 2\] = 1000000 is outside the KV cache "
                                                  r"\(num_blocks = 12\)"):
        fa4_call(**_bad_block_id())
    assert fake.calls == [] and fake.deps_checked == 0
    fa4_call(**_paged())  # a good call passes them
    assert len(fake.calls) == 1


@pytest.mark.parametrize("change, message", [
    (lambda c: {**c, "seqused_k": torch.full((SEQS,), 600, dtype=torch.int32), "max_seqlen_k": 600},
     r"seqused_k has an entry 600 larger than the KV capacity 512"),
    (lambda c: {**c, "cu_seqlens_q": torch.tensor([0, 2, 1, 3], dtype=torch.int32)},
     r"cu_seqlens_q must be non-decreasing"),
])
def test_debug_checks_refuse_bad_offsets_and_lengths_for_fa4(fake, describe, change, message):
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "on"})
    with pytest.raises(FlashAttnInputError, match=message):
        fa4_call(**change(_paged()))
    assert fake.calls == []


def test_without_debug_checks_fa4_reads_no_index_values(fake, describe, monkeypatch):
    # Off (the default): nothing is copied to the host on a call (it would sync the GPU).
    describe(caps=(HOPPER,))
    monkeypatch.setattr(interface, "run_debug_checks", lambda **kw: pytest.fail("debug checks ran while off"))
    fa4_call(**_bad_block_id())
    assert len(fake.calls) == 1


# --- FA4's own rules, checked by the adapter (no `assert` left to upstream) ----------------------

def _packed(d=D, d_v=None, dtype=BF16, seqs=2):
    q = torch.zeros(seqs * 5, HEADS, d, dtype=dtype)
    k = torch.zeros(seqs * 6, KV_HEADS, d, dtype=dtype)
    v = torch.zeros(seqs * 6, KV_HEADS, d if d_v is None else d_v, dtype=dtype)
    return dict(q=q, k=k, v=v, max_seqlen_q=5, cu_seqlens_q=torch.arange(0, seqs * 5 + 1, 5, dtype=torch.int32),
                max_seqlen_k=6, cu_seqlens_k=torch.arange(0, seqs * 6 + 1, 6, dtype=torch.int32))


# (id, GPU, call, message): each one of upstream's asserts that such a call reaches.
OWN_RULES = [
    ("head-size-160-sm100", BLACKWELL, lambda: _packed(160),
     r"FA4 takes head sizes \(Q/K x V\) on sm100: 8-128 x 8-128, 192 x 128, .*got 160; use FA2 \(fa_version=2\)"),
    ("head-size-192x192-sm100", BLACKWELL, lambda: _packed(192),
     r"on sm100: .*got 192; use FA2"),
    ("fp8-head-size-136-sm100", BLACKWELL, lambda: _packed(136, dtype=E4M3), r"multiples of 16 for FP8.*got 136"),
    ("fp8-on-sm110", SM110, lambda: _packed(dtype=E4M3), r"FP8 attention on sm110: FA4's FP8 kernels are sm100's"),
    ("hd256-paged-sm100", BLACKWELL, lambda: _paged(d=256),
     r"head-size-256 kernel on sm100 does not take seqused_k \(a paged or batched KV cache\)"),
    ("hd256-softcap-sm100", BLACKWELL, lambda: {**_packed(256), "softcap": 30.0},
     r"head-size-256 kernel on sm100 does not take softcap"),
    ("hd256-sinks-sm100", BLACKWELL, lambda: {**_packed(256), "s_aux": torch.zeros(HEADS, dtype=BF16)},
     r"does not take attention sinks"),
    ("hd256-window-sm100", BLACKWELL, lambda: {**_packed(256), "window_size": [64, 0]}, r"does not take a sliding window"),
    ("hd256-split-sm100", BLACKWELL, lambda: {**_packed(256), "num_splits": 4}, r"does not take num_splits=4"),
    ("hd512-split-sm100", BLACKWELL, lambda: {**_packed(512), "num_splits": 4},
     r"num_splits=4 at V head size 512: FA4 on sm100 has no split-KV there"),
    ("paged-head-size-72-sm90", HOPPER, lambda: _paged(d=72, page=16),
     r"a paged KV cache at head size 72 \(not a multiple of 16\) needs a page size of 128 .* got 16"),
]


@pytest.mark.parametrize("cap, make, message", [r[1:] for r in OWN_RULES], ids=[r[0] for r in OWN_RULES])
def test_fa4s_own_rules_are_refused_by_the_adapter_not_left_to_upstreams_asserts(fake, describe, cap, make,
                                                                                 message):
    describe(caps=(cap,))
    with pytest.raises(FlashAttnInputError, match=message):  # FA4Unsupported, or the shared checks' refusal
        fa4_call(**make())
    assert fake.calls == []


def test_the_declared_head_sizes_let_through_what_upstream_takes(fake, describe):
    for cap, d, d_v in ((BLACKWELL, 128, 128), (BLACKWELL, 192, 128), (BLACKWELL, 256, 256), (BLACKWELL, 64, 512),
                        (HOPPER, 256, 256), (HOPPER, 192, 192), (HOPPER, 72, 72)):
        describe(caps=(cap,))
        fa4_call(**_packed(d, d_v))
        assert fake.calls[-1][0][0].shape[-1] == d


@pytest.mark.parametrize("d, expected", [(256, 1), (512, 1), (128, 0)])
def test_upstreams_split_heuristic_is_kept_off_kernels_without_split_kv(fake, describe, d, expected):
    # num_splits=0 asks upstream's heuristic, which on sm100 could pick a split that the kernel
    # for head sizes 256 and 512 asserts against: one split there; elsewhere the heuristic.
    describe(caps=(BLACKWELL,))
    fa4_call(**_packed(d), num_splits=0)
    assert fake.calls[-1][1]["num_splits"] == expected


def test_the_python_O_run_below_is_the_optimised_one():
    # In the child that test starts, VFA_TEST_PYTHON_O=1 and asserts are off.
    assert sys.flags.optimize == int(os.environ.get("VFA_TEST_PYTHON_O", "0"))


def test_the_adapter_checks_hold_under_python_O():
    """upstream's asserts are gone under `python -O`; the adapter's own checks must still
    refuse every call above before the kernels (the stand-in's copy of upstream's asserts is
    gone there too). Run this file's refusal tests in such a process."""
    project = Path(__file__).resolve().parents[2]
    env = {**os.environ, "VFA_TEST_PYTHON_O": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-O", "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider",
         "-k", "refuse or refused or python_O_run or split_heuristic or declared_head_sizes"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= len(OWN_RULES) + 10, summary


# --- what FA4's calls cost: decided once per kind of call, never at the price of a check -----------

def test_common_fa4_calls_take_the_quick_path(fake, monkeypatch):
    """FA4's common calls take the interface's quick path once their kind is resolved, as every
    family's: the full check is not asked (spied on) after the first call of each kind, and an
    unusual call still is, every time."""
    full = []
    real = interface.check_varlen_call
    monkeypatch.setattr(interface, "check_varlen_call", lambda *a, **k: full.append(a[3]) or real(*a, **k))
    calls = (_paged(), _packed(), {**_paged(), "out": torch.empty(SEQS, HEADS, D, dtype=BF16)})
    for call in calls:  # the first of each kind: resolved on the full path
        fa4_call(**call, causal=True)
    assert len(full) == 2 and len(fake.calls) == 3  # out= is no other kind
    for call in calls:
        fa4_call(**call, causal=True)
    assert len(full) == 2 and len(fake.calls) == 6
    for _ in range(2):
        fa4_call(**_paged(), s_aux=torch.zeros(HEADS, dtype=BF16))
    assert len(full) == 4 and len(fake.calls) == 8


def test_the_quick_path_hands_fa4_what_the_full_path_does(fake, monkeypatch):
    """A vLLM-shaped call twice: the first on the full path (call object, shared checks,
    fa4.forward), the second on the quick path (fa4.launch with the call's own arguments): the
    kernels get the same arguments, of the same types (softcap=0 comes as an int from vLLM)."""
    full = []
    real = interface.check_varlen_call
    monkeypatch.setattr(interface, "check_varlen_call", lambda *a, **k: full.append(a) or real(*a, **k))
    for call in (dict(_paged(), causal=True, softcap=0, window_size=(-1, -1), softmax_scale=0.125, num_splits=0,
                      out=torch.empty(SEQS, HEADS, D, dtype=BF16), **_descales()),
                 dict(_packed(), causal=False, window_size=[3, 2], softcap=1, return_softmax_lse=True)):
        for _ in range(2):
            full.clear()
            fa4_call(**call)
        assert full == []  # the second call was quick
        (args_a, kw_a), (args_b, kw_b) = fake.calls[-2:]
        assert all(a is b for a, b in zip(args_a, args_b)) and list(kw_a) == list(kw_b)
        differ = [n for n in kw_a if not (kw_a[n] is kw_b[n] if isinstance(kw_a[n], torch.Tensor) or kw_a[n] is None
                                          else (type(kw_a[n]), kw_a[n]) == (type(kw_b[n]), kw_b[n]))]
        assert differ == []


def _verdict(arch, call, window=(-1, -1)):
    """What fa4.check_call answers: ("ok", fp8_kv_dequant) or the refusal's type and message."""
    from vendored_flash_attn.call.arguments import VarlenCall

    try:
        c = VarlenCall(**call)
        return ("ok", fa4.check_call(fa4.FAMILY, arch, c.q, c.k, c.v, c.block_table, c.seqused_k, c.softcap,
                                     c.num_splits, c.s_aux, c.causal, window))
    except (FlashAttnInputError, FlashAttnTypeError) as exc:
        return (type(exc).__name__, str(exc))


def _kinds():
    """Calls that differ from a neighbour in one thing check_call's verdict depends on."""
    fp8_kv = _paged(kv_dtype=E4M3, d=FP8_KV_D)
    return [
        (100, _packed(), (-1, -1)), (100, _packed(160), (-1, -1)), (100, _packed(256), (-1, -1)),
        (100, {**_packed(256), "softcap": 30.0}, (-1, -1)),
        (100, {**_packed(256), "s_aux": torch.zeros(HEADS, dtype=BF16)}, (-1, -1)),
        (100, {**_packed(256), "causal": True}, (64, 0)), (100, {**_packed(256), "num_splits": 2}, (-1, -1)),
        (100, _paged(d=256), (-1, -1)), (100, _paged(), (-1, -1)),
        (90, fp8_kv, (-1, -1)), (90, _paged(d=FP8_KV_D), (-1, -1)),
        (90, {**fp8_kv, "v": fp8_kv["v"].to(BF16)}, (-1, -1)), (90, {**fp8_kv, "k": fp8_kv["k"].to(BF16)}, (-1, -1)),
        (90, _paged(q_dtype=E4M3, kv_dtype=E4M3), (-1, -1)), (100, _paged(q_dtype=E4M3, kv_dtype=E4M3), (-1, -1)),
        (110, _paged(q_dtype=E4M3, kv_dtype=E4M3), (-1, -1)), (80, _paged(), (-1, -1)),
        (100, _packed(512), (-1, -1)), (100, {**_packed(512), "num_splits": 3}, (-1, -1)),
        (100, _packed(192, 128), (-1, -1)), (100, _packed(192), (-1, -1)),
    ]


def test_check_calls_kept_verdict_is_the_one_it_would_give_afresh(fake):
    """check_call keeps what it accepted per kind of call; a call of another kind, differing in
    any one thing its rules read, gets the verdict a fresh check gives it, in any order."""
    kinds = _kinds()
    fresh = []
    for arch, call, window in kinds:
        fa4._ACCEPTED.clear()
        fresh.append(_verdict(arch, call, window))
    assert {v[0] for v in fresh} == {"ok", "FA4Unsupported", "FlashAttnTypeError"}
    assert ("ok", True) in fresh and ("ok", False) in fresh
    fa4._ACCEPTED.clear()
    for order in (kinds, kinds[::-1], kinds):
        warm = [_verdict(*kind) for kind in order]
        assert warm == (fresh if order is kinds else fresh[::-1])
    assert fa4._ACCEPTED  # it did keep verdicts


def test_the_device_arch_is_each_devices_own(describe):
    describe(caps=(HOPPER, BLACKWELL))
    on = lambda index: types.SimpleNamespace(get_device=lambda: index)  # noqa: E731 - q's device index
    assert [fa4.device_arch(on(i)) for i in (0, 1, 0, 1, -1)] == [90, 100, 90, 100, 90]
    describe(caps=(BLACKWELL, HOPPER))  # another machine: nothing kept from the last one
    assert [fa4.device_arch(on(i)) for i in (0, 1, -1)] == [100, 90, 100]
