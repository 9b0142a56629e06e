"""``import vendored_flash_attn`` is cheap and never fails; names resolve on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import vendored_flash_attn

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = ["flash_attn_varlen_func", "get_scheduler_metadata", "get_flash_attn_version",
          "select_flash_attn_version", "flash_attn_version_reason", "is_fa_version_supported",
          "fa_version_unsupported_reason", "flash_attn_supports_fp8", "make_fp8_descales",
          "FlashAttnInputError", "FlashAttnUnavailableError"]


def test_import_loads_neither_torch_nor_modules():
    code = ("import sys, vendored_flash_attn as v; "
            "print('torch' in sys.modules, any(m.endswith(('_fa2_C', '_fa3_C')) for m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_public_names():
    for name in PUBLIC:
        assert callable(getattr(vendored_flash_attn, name)), name
    assert set(PUBLIC) <= set(vendored_flash_attn.__all__)
    assert isinstance(vendored_flash_attn.__version__, str)


def test_signature_matches_upstream_order():
    import inspect

    params = list(inspect.signature(vendored_flash_attn.flash_attn_varlen_func).parameters.values())
    names = [p.name for p in params]
    assert names == [
        "q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k", "cu_seqlens_k", "seqused_k",
        "q_v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs", "block_table", "return_softmax_lse", "out",
        "scheduler_metadata", "q_descale", "k_descale", "v_descale", "num_splits", "fa_version",
        "s_aux", "cp_world_size", "cp_rank", "cp_tot_seqused_k"]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    assert defaults["fa_version"] is None and defaults["num_splits"] == 0
    assert defaults["dropout_p"] == 0.0 and defaults["cp_world_size"] == 1
