"""The version selector on the real GPU: FA3 by default on Hopper, FA2 under
VLLM_FLASH_ATTN_VERSION=2, FP8 reported supported, and a call with fa_version=None really
running the version the selector names.

Each test starts from the real machine with the selector's caches and warning memory
cleared (the ``real_machine`` fixture: environment.set_environment(None)), and sets the
variable through monkeypatch.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gpu_helpers import (BUILD, built_dtypes, check, chunked_lengths, has_feature, make_problem,
                         primary_head_dim, reference, require, run_attention)

pytestmark = pytest.mark.gpu

ENV = "VLLM_FLASH_ATTN_VERSION"


@pytest.fixture
def hopper_with_both(real_machine):
    require(2)
    require(3)
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"needs a Hopper GPU (compute capability 9.x), this one is {major}.{minor}")
    return real_machine


def fresh(monkeypatch, value):
    """Set (or unset, value None) the variable and clear the selector's caches."""
    from vendored_flash_attn.selection.environment import set_environment

    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    set_environment(None)


def test_default_is_fa3_and_fp8_is_supported(hopper_with_both, monkeypatch):
    from vendored_flash_attn import (FlashAttnFallbackWarning, flash_attn_supports_fp8,
                                     flash_attn_version_reason, get_flash_attn_version,
                                     is_fa_version_supported, select_flash_attn_version)

    fresh(monkeypatch, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashAttnFallbackWarning)  # none on the plain default
        assert get_flash_attn_version() == 3, flash_attn_version_reason()
        selection = select_flash_attn_version()
    assert selection.fallbacks == ()
    assert "FA3 is built and loads" in selection.reason
    assert get_flash_attn_version(head_size=primary_head_dim(3), dtype=torch.bfloat16) == 3
    assert get_flash_attn_version(device=torch.device("cuda", 0)) == 3
    assert get_flash_attn_version(device="cuda") == 3
    assert is_fa_version_supported(3) and is_fa_version_supported(2)
    if "e4m3" in BUILD.fa3.dtypes:
        assert flash_attn_supports_fp8() is True
        assert flash_attn_supports_fp8(device=0) is True
        assert get_flash_attn_version(head_size=primary_head_dim(3), dtype=torch.float8_e4m3fn) == 3
    else:
        assert flash_attn_supports_fp8() is False


@pytest.mark.parametrize("value,expected", [("2", 2), ("3", 3), ("", 3), (" 2 ", 2)])
def test_environment_variable_overrides(hopper_with_both, monkeypatch, value, expected):
    from vendored_flash_attn import flash_attn_supports_fp8, get_flash_attn_version

    fresh(monkeypatch, value)
    assert get_flash_attn_version() == expected
    if expected == 2:
        assert flash_attn_supports_fp8() is False  # FP8 needs FA3, and FA2 was asked for


@pytest.mark.parametrize("value", ["1", "5", "fa3", "3.0"])
def test_invalid_environment_variable_is_a_clear_error(hopper_with_both, monkeypatch, value):
    from vendored_flash_attn import get_flash_attn_version

    fresh(monkeypatch, value)
    with pytest.raises(ValueError, match=ENV):
        get_flash_attn_version()


def test_alibi_falls_back_to_fa2_with_one_warning(hopper_with_both, monkeypatch):
    from vendored_flash_attn import FlashAttnFallbackWarning, get_flash_attn_version

    fresh(monkeypatch, None)
    with pytest.warns(FlashAttnFallbackWarning, match="ALiBi"):
        assert get_flash_attn_version(requires_alibi=True) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashAttnFallbackWarning)  # once per reason per process
        assert get_flash_attn_version(requires_alibi=True) == 2


@pytest.mark.parametrize("value", [None, "2"], ids=["default", "env2"])
def test_call_without_fa_version_runs_the_selected_version(hopper_with_both, monkeypatch, value, rng):
    """fa_version=None: the result is right, and the version that ran is the selector's
    (num_splits > 1 is accepted by FA3 and refused by FA2 before any kernel)."""
    from vendored_flash_attn import FlashAttnInputError, get_flash_attn_version

    fresh(monkeypatch, value)
    version = get_flash_attn_version()
    assert version == (3 if value is None else 2)
    dtypes = [d for d in built_dtypes(2) if d in built_dtypes(3)]
    dims = [h for h in BUILD.fa2.head_dims if h in BUILD.fa3.head_dims]
    if not dtypes or not dims:
        pytest.skip("FA2 and FA3 of this wheel share no dtype and head dim")
    q_lens, k_lens = chunked_lengths(rng)
    p = make_problem(rng, dtype=dtypes[0], num_heads=32, num_heads_k=8, head_dim=dims[0],
                     q_lens=q_lens, k_lens=k_lens)
    out, lse = run_attention(p, version=None, causal=True)
    ref_out, ref_lse = reference(p, causal=True)
    check(p, out, lse, ref_out, ref_lse, label=f"fa_version=None ({ENV}={value}) -> FA{version}")
    if not has_feature("split"):
        return
    if version == 3:
        out, lse = run_attention(p, version=None, causal=True, num_splits=2)
        check(p, out, lse, ref_out, ref_lse, label="fa_version=None -> FA3, num_splits=2")
    else:
        with pytest.raises(FlashAttnInputError, match="FA2 does not take num_splits"):
            run_attention(p, version=None, causal=True, num_splits=2)
