"""FA4's kernels as a stand-in, for the tests that send calls down the quick and the full path
(conftest.py exposes the fixture): ``fa4_kernels`` puts in FA4's place a module whose forward
returns a zero output of the call's shape and records each call's q, so a test sees which calls
reached FA4. FA4's own rules (the adapter's refusals) still run; only its kernels are stood in for.
"""

from __future__ import annotations

import types

import pytest
import torch


@pytest.fixture
def fa4_kernels(monkeypatch):
    """The list of the q tensors of the calls that reached FA4's stand-in kernels."""
    from vendored_flash_attn.families.fa4 import adapter as fa4

    reached = []

    def fwd(q, k, v, **kwargs):
        reached.append(q)
        return torch.zeros(q.shape[0], q.shape[1], v.shape[-1]), None, None, None

    stand_in = types.SimpleNamespace(
        _flash_attn_fwd=fwd, _resolve_causal_local_window=lambda causal, left, right: (causal, False, left, right),
        _tile_size_fwd_sm90=lambda *args: types.SimpleNamespace(n_block_size=128))
    monkeypatch.setattr(fa4, "_loaded", fa4.Loaded(stand_in, {}))
    return reached
