"""FA4's adapter (fa4.py) on a CPU: a fake ``vendored_flash_attn._fa4.cute`` (interface and
cache_utils) and a fake ``cutlass`` stand in for the staged sources and the DSL; the fake
``_flash_attn_fwd`` records what it was called with, by name."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from runtime_fakes import AMPERE, BLACKWELL, BLACKWELL_12, HOPPER
from vendored_flash_attn import fa4, fa4_cache, fa4_deps
from vendored_flash_attn.errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
HEADS, KV_HEADS, D, PAGE, SEQS = 8, 2, 128, 128, 3


class FakeFA4:
    def __init__(self, tile_n=128):
        self.calls: list[tuple[tuple, dict]] = []
        self.tile_n = tile_n
        self.deps_checked = 0
        self.assertion = None

    def _flash_attn_fwd(self, q, k, v, **kwargs):
        self.calls.append(((q, k, v), kwargs))
        if self.assertion:
            raise AssertionError(self.assertion)
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
    result = fa4.flash_attn_varlen_func(
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
    out = fa4.flash_attn_varlen_func(q, k, v, 6, cu_q, 7, cu_seqlens_k=cu_k)
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
    fa4.flash_attn_varlen_func(**_paged(kv_dtype=E4M3, d=FP8_KV_D), causal=True, **descales)
    _, kwargs = fake.calls[-1]
    assert kwargs["fp8_kv_dequant"] is True
    assert all(kwargs[name] is descales[name] for name in descales)
    assert fake.tile_asked == (FP8_KV_D, FP8_KV_D, True, False)


def test_fp8_kv_at_a_head_size_fa4_computes_wrong_is_refused_naming_fa3(fake):
    # head size 128: 40 % error on the H200 at the pin (tests/gpu/fa4_fp8_probe.py)
    with pytest.raises(fa4.FA4Unsupported, match=r"head size 128: FA4 takes it at head size 512 only \(at the "
                                                 r"pin.*40 % error.*Use FP8 q, k and v with FA3 \(fa_version=3\)"):
        fa4.flash_attn_varlen_func(**_paged(kv_dtype=E4M3), causal=True, **_descales())
    assert fake.calls == []


def test_fp8_kv_with_a_page_size_other_than_fa4s_tile_is_refused_before_the_kernel(fake):
    with pytest.raises(fa4.FA4Unsupported, match=r"page size of 128 .* got 64; or FP8 q, k and v with FA3"):
        fa4.flash_attn_varlen_func(**_paged(kv_dtype=E4M3, page=64, d=FP8_KV_D), **_descales())
    assert fake.calls == []


def test_fp8_q_k_v_on_sm100_passes_the_descales(fake, describe):
    describe(caps=(BLACKWELL,))
    descales = _descales()
    fa4.flash_attn_varlen_func(**_paged(q_dtype=E4M3, kv_dtype=E4M3), **descales)
    _, kwargs = fake.calls[-1]
    assert kwargs["fp8_kv_dequant"] is False and kwargs["k_descale"] is descales["k_descale"]


def test_sm120_asks_upstream_for_one_split_once_the_declaration_lets_it_in(fake, describe, monkeypatch):
    # What FA4's sm120 path needs when a pin whose sm120 kernel compiles takes it off the
    # declaration's `excluded`: one split (upstream has no heuristic there), no paged KV.
    monkeypatch.setitem(fa4.GENERATIONS, 12, "sm120")
    describe(caps=(BLACKWELL_12,))
    with pytest.raises(fa4.FA4Unsupported, match="paged KV cache .* on sm120 needs FA2"):
        fa4.flash_attn_varlen_func(**_paged())
    q = torch.zeros(10, HEADS, D, dtype=BF16)
    k = v = torch.zeros(10, KV_HEADS, D, dtype=BF16)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    fa4.flash_attn_varlen_func(q, k, v, 10, cu, 10, cu_seqlens_k=cu, num_splits=0)
    assert fake.calls[-1][1]["num_splits"] == 1


REFUSALS = [
    ("FP8 q needs FA3", HOPPER, lambda: _paged(q_dtype=E4M3, kv_dtype=E4M3), {}),
    (r"FA4 runs on sm90, sm100 only .* compute capability 8.0; use FA2 \(fa_version=2\)", AMPERE, _paged, {}),
    # sm120 is excluded by the declaration: its kernel does not compile at the pin
    (r"does not run on compute capability 12.x in this package: at the pin, FA4's sm120 forward kernel does "
     r"not compile .*; use FA2 \(fa_version=2\)", BLACKWELL_12, _paged, {}),
    ("FP8 KV with a torch.bfloat16 q is FA4's sm90 path only", BLACKWELL, lambda: _paged(kv_dtype=E4M3), {}),
]


@pytest.mark.parametrize("message, cap, make, extra", REFUSALS, ids=[r[0].split()[0] + str(r[1]) for r in REFUSALS])
def test_what_fa4_cannot_do_is_refused_before_fa4_is_even_imported(fake, describe, message, cap, make, extra):
    describe(caps=(cap,))
    with pytest.raises(fa4.FA4Unsupported, match=message) as refused:
        fa4.flash_attn_varlen_func(**make(), **extra)
    assert isinstance(refused.value, FlashAttnInputError)
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
        fa4.flash_attn_varlen_func(**change(_paged()))
    assert not isinstance(refused.value, fa4.FA4Unsupported)  # the shared refusal, not FA4's own
    assert fake.deps_checked == 0 and fake.calls == []


def test_the_dependency_check_comes_before_the_import(fake, monkeypatch):
    def missing():
        raise fa4_deps.FA4DependencyError("nvidia-cutlass-dsl 4.7.0 is installed, ==4.6.0.dev0 is required")

    monkeypatch.setattr(fa4_deps, "check", missing)
    monkeypatch.delitem(sys.modules, f"{fa4.SUBPACKAGE}.interface")  # an import would now fail otherwise
    with pytest.raises(fa4_deps.FA4DependencyError, match="4.7.0 is installed"):
        fa4.flash_attn_varlen_func(**_paged())
    assert fa4._loaded is None


def test_fa4_is_loaded_once_with_its_kernel_cache(fake, tmp_path):
    fa4.flash_attn_varlen_func(**_paged())
    fa4.flash_attn_varlen_func(**_paged())
    assert fake.deps_checked == 1
    layout = fa4._loaded.cache_layout
    assert layout["flavour"] == "cu12.9"
    assert layout["kinds"]["fwd"]["user"] == str(tmp_path / "fa4-cache/cu12.9" / ("0" * 64) / "fwd")


def test_an_upstream_assertion_becomes_a_clear_error(fake):
    fake.assertion = "head_dim must be between 8 and 256"
    with pytest.raises(fa4.FA4Unsupported, match="FA4 refused the call: head_dim must be between 8 and 256"):
        fa4.flash_attn_varlen_func(**_paged())


def test_a_wheel_without_fa4_says_how_to_get_it(fake, monkeypatch):
    monkeypatch.delitem(sys.modules, f"{fa4.SUBPACKAGE}.interface")
    with pytest.raises(FlashAttnUnavailableError, match="VFA_BUILD_FA4"):
        fa4.load()
