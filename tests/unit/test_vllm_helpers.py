"""The helpers vLLM's attention backends call, and the FA3 -> FA2 fallback for kernel
features this wheel's FA3 lacks, over described machines and builds."""

from __future__ import annotations

import contextlib
import inspect
import warnings

import pytest
import torch

from calls import paged_call, varlen_call
from runtime_fakes import AMPERE, BLACKWELL, HOPPER, TURING, make_build
import vendored_flash_attn
from vendored_flash_attn.selection import selector
from vendored_flash_attn.errors import FlashAttnFallbackWarning, FlashAttnInputError

LOAD_ERROR = "ImportError: undefined symbol: _ZN5flash12run_mha_fwd"
NO_E4M3 = make_build("full", fa3={"dtypes": ["bf16", "fp16"]})
NO_HDIMDIFF = make_build("full", fa3={"features": ["paged", "split", "softcap", "local"]})
NO_PAGED = make_build("full", fa3={"features": ["split", "softcap", "local", "hdimdiff"]})
NO_64 = make_build("full", fa3={"head_dims": [96, 128, 192, 256]})
NO_192 = make_build("full", fa3={"head_dims": [64, 96, 128, 256]})
NO_FA3 = make_build("full", fa3={"built": False, "reason": "nvcc 12.2 is older than 12.3"})


@contextlib.contextmanager
def _no_fallback_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashAttnFallbackWarning)
        yield


# (id, capabilities, build, module errors, env) -> sinks, mla, quant query input, varlen available
HELPER_CASES = [
    ("hopper-full", (HOPPER,), "full", {}, {}, True, True, True, True),
    ("hopper-minimal", (HOPPER,), "minimal", {}, {}, True, False, True, True),
    ("hopper-env-2", (HOPPER,), "full", {}, {"VLLM_FLASH_ATTN_VERSION": "2"}, False, True, False, True),
    ("hopper-no-e4m3", (HOPPER,), NO_E4M3, {}, {}, True, True, False, True),
    ("hopper-no-hdimdiff", (HOPPER,), NO_HDIMDIFF, {}, {}, True, False, True, True),
    ("hopper-no-paged", (HOPPER,), NO_PAGED, {}, {}, True, False, True, True),
    ("hopper-no-hdim64", (HOPPER,), NO_64, {}, {}, True, False, True, True),
    ("hopper-no-hdim192", (HOPPER,), NO_192, {}, {}, True, False, True, True),
    ("hopper-no-fa3", (HOPPER,), NO_FA3, {}, {}, False, False, False, True),
    ("hopper-fa3-import-fails", (HOPPER,), "full", {3: LOAD_ERROR}, {}, False, False, False, True),
    ("hopper-nothing-loads", (HOPPER,), "full", {2: LOAD_ERROR, 3: LOAD_ERROR}, {}, False, False,
     False, False),
    ("ampere", (AMPERE,), "full", {}, {}, False, False, False, True),
    ("blackwell", (BLACKWELL,), "full", {}, {}, False, False, False, True),
    ("turing", (TURING,), "full", {}, {}, False, False, False, False),
    ("no-gpu", (), "full", {}, {}, False, False, False, False),
    ("no-build-info", (HOPPER,), None, {}, {}, False, False, False, False),
]


@pytest.mark.parametrize("caps, build, errors, env, sinks, mla, quant_q, varlen",
                         [case[1:] for case in HELPER_CASES], ids=[case[0] for case in HELPER_CASES])
def test_helpers_answer_for_this_wheel_and_gpu(describe, caps, build, errors, env, sinks, mla,
                                               quant_q, varlen):
    describe(caps=caps, build=build, module_errors=errors, env=env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlashAttnFallbackWarning)
        answers = (vendored_flash_attn.flash_attn_supports_sinks(),
                   vendored_flash_attn.flash_attn_supports_mla(),
                   vendored_flash_attn.flash_attn_supports_quant_query_input(),
                   vendored_flash_attn.is_flash_attn_varlen_func_available())
    assert answers == (sinks, mla, quant_q, varlen)
    reason = vendored_flash_attn.flash_attn_mla_unsupported_reason()
    assert (reason is None) == mla, reason


@pytest.mark.parametrize("build, fragment", [
    ("minimal", "hdimdiff"), (NO_PAGED, "'paged'"), (NO_64, "64/512"), (NO_192, "192/128")])
def test_mla_reason_names_what_is_missing(describe, build, fragment):
    describe(caps=(HOPPER,), build=build)
    assert fragment in vendored_flash_attn.flash_attn_mla_unsupported_reason()


def test_helpers_take_a_device(describe):
    describe(caps=(AMPERE, HOPPER))
    assert not vendored_flash_attn.flash_attn_supports_sinks(device=0)
    assert vendored_flash_attn.flash_attn_supports_sinks(device=1)
    assert vendored_flash_attn.flash_attn_supports_mla(device="cuda:1")
    assert not vendored_flash_attn.flash_attn_supports_mla(device=torch.device("cuda", 0))
    assert vendored_flash_attn.flash_attn_supports_quant_query_input(device=1)
    assert not vendored_flash_attn.is_flash_attn_varlen_func_available(device=7)


@pytest.mark.parametrize("helper", ["flash_attn_supports_sinks", "flash_attn_supports_mla",
                                    "flash_attn_supports_quant_query_input",
                                    "is_flash_attn_varlen_func_available"])
def test_helpers_raise_only_on_a_malformed_override(describe, helper):
    describe(caps=(HOPPER,), env={"VLLM_FLASH_ATTN_VERSION": "fa3"})
    fn = getattr(vendored_flash_attn, helper)
    if helper == "flash_attn_supports_mla":  # MLA passes fa_version=3: the override does not enter
        assert fn() is True
    else:
        with pytest.raises(ValueError, match="VLLM_FLASH_ATTN_VERSION='fa3'"):
            fn()


def test_get_flash_attn_version_takes_vllms_positional_arguments(describe):
    """vLLM's fa_utils: get_flash_attn_version(requires_alibi, head_size, head_size_v,
    has_sinks, requires_local_attention)."""
    names = list(inspect.signature(vendored_flash_attn.get_flash_attn_version).parameters)
    assert names[:5] == ["requires_alibi", "head_size", "head_size_v", "has_sinks",
                         "requires_local_attention"]
    describe(caps=(HOPPER,))
    with _no_fallback_warning():
        assert vendored_flash_attn.get_flash_attn_version(False, 128, 128, True) == 3
        assert vendored_flash_attn.get_flash_attn_version(False, 192, 128, False) == 3
        assert vendored_flash_attn.get_flash_attn_version(False, 128, 128, False, True) == 3
    with pytest.warns(FlashAttnFallbackWarning, match="ALiBi"):
        assert vendored_flash_attn.get_flash_attn_version(True, 128, 128, False) == 2
    # Sinks need FA3, which does not take them with different head sizes; FA2 has none.
    selection = selector.select_flash_attn_version(False, 192, 128, True)
    assert selection.version is None and "sinks" in selection.reason


def test_requires_local_attention_falls_back_where_fa3_lacks_local(describe):
    describe(caps=(HOPPER,), build=make_build("full", fa3={"features": ["paged", "split"]}))
    with pytest.warns(FlashAttnFallbackWarning, match="sliding-window.*'local'.*using FA2"):
        assert vendored_flash_attn.get_flash_attn_version(False, 128, None, False, True) == 2
    with _no_fallback_warning():
        assert vendored_flash_attn.get_flash_attn_version(False, 128) == 3


# --- feature fallback in the selector ----------------------------------------------------

NO_SOFTCAP = "minimal"  # FA3: paged, split, local; FA2: hdim 128 bf16
FA2_NO_128 = make_build("minimal", fa2={"head_dims": [64]})

# (id, build, env, features asked, request) -> version, warning fragment or None
FALLBACK_CASES = [
    ("softcap-missing", NO_SOFTCAP, {}, ("softcap",), {}, 2, "softcap > 0 ('softcap')"),
    ("softcap-as-a-string", NO_SOFTCAP, {}, "softcap", {}, 2, "softcap > 0 ('softcap')"),
    ("softcap-paged-missing", NO_SOFTCAP, {}, ("paged", "softcap"), {}, 2, "'softcap'"),
    ("softcap-env-3", NO_SOFTCAP, {"VLLM_FLASH_ATTN_VERSION": "3"}, ("softcap",), {}, 2, "'softcap'"),
    ("softcap-built", "full", {}, ("softcap",), {}, 3, None),
    ("paged-built", NO_SOFTCAP, {}, ("paged", "local", "split"), {}, 3, None),
    # FA2 cannot take num_splits > 1: stay on FA3, whose refusal names the kernels to build.
    ("softcap-with-split", NO_SOFTCAP, {}, ("softcap", "split"), {}, 3, None),
    ("split-missing", make_build("minimal", fa3={"features": ["paged"]}), {}, ("split",), {}, 3, None),
    # FA2 of this wheel cannot serve the call either: stay on FA3.
    ("fa2-lacks-head-dim", FA2_NO_128, {}, ("softcap",), {"head_size": 128}, 3, None),
    ("fa2-lacks-dtype", NO_SOFTCAP, {}, ("softcap",), {"dtype": torch.float8_e4m3fn}, 3, None),
    ("sinks", NO_SOFTCAP, {}, ("softcap",), {"has_sinks": True}, 3, None),
    ("fa2-import-fails", NO_SOFTCAP, {}, ("softcap",), {}, 3, None),
]


@pytest.mark.parametrize("build, env, features, request_, version, warning",
                         [case[1:] for case in FALLBACK_CASES], ids=[case[0] for case in FALLBACK_CASES])
def test_feature_fallback(describe, build, env, features, request_, version, warning, request):
    errors = {2: LOAD_ERROR} if "import-fails" in request.node.name else {}
    describe(caps=(HOPPER,), build=build, env=env, module_errors=errors)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        selection = selector.select_flash_attn_version(features=features, **request_)
        again = selector.get_flash_attn_version(features=features, **request_)
    emitted = [str(w.message) for w in record if issubclass(w.category, FlashAttnFallbackWarning)]
    assert (selection.version, again) == (version, version)
    if warning is None:
        assert emitted == []
    else:
        assert len(emitted) == 1 and warning in emitted[0], emitted


# --- feature fallback on calls (fa_version=None) -------------------------------------------

def test_call_needing_a_feature_fa3_lacks_runs_on_fa2(describe, fake_ops):
    """softcap is not in the minimal FA3 build: with fa_version=None the call runs on FA2
    (one warning), the calls without softcap stay on FA3."""
    describe(caps=(HOPPER,), build="minimal")
    with pytest.warns(FlashAttnFallbackWarning, match="'softcap'"):
        flash = vendored_flash_attn.flash_attn_varlen_func(**paged_call(), causal=True, softcap=30.0)
    assert flash.shape == (6, 8, 128)
    with _no_fallback_warning():
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), causal=True)
        vendored_flash_attn.flash_attn_varlen_func(**varlen_call(), softcap=30.0)
        vendored_flash_attn.flash_attn_varlen_func(**varlen_call(), window_size=(8, 0))
    assert [name for name, _ in fake_ops.calls] == ["varlen_fwd", "fwd", "varlen_fwd", "fwd"]
    assert fake_ops.calls[0][1]["softcap"] == 30.0


def test_call_fa2_cannot_serve_is_refused_with_the_fa3_message(describe, fake_ops):
    describe(caps=(HOPPER,), build="minimal")
    with _no_fallback_warning(), pytest.raises(FlashAttnInputError, match="'softcap' kernels"):
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), softcap=30.0, num_splits=2)
    with pytest.raises(FlashAttnInputError, match="'softcap' kernels"):  # explicit FA3: no fallback
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), softcap=30.0, fa_version=3)
    assert fake_ops.calls == []


def test_call_fallback_follows_the_local_window(describe, fake_ops):
    describe(caps=(HOPPER,), build=make_build("minimal", fa3={"features": ["paged", "split"]}))
    with pytest.warns(FlashAttnFallbackWarning, match="'local'"):
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), causal=True, window_size=(8, 0))
    with _no_fallback_warning():
        # (-1, 0) with causal is plain causal; a window wider than the keys is still local
        # for the kernels' choice (validation._is_local), so it falls back too.
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), causal=True, window_size=(-1, 0))
        vendored_flash_attn.flash_attn_varlen_func(**paged_call(), causal=True, window_size=(8, 0))
    assert [name for name, _ in fake_ops.calls] == ["varlen_fwd", "fwd", "varlen_fwd"]
