"""make_fp8_descales: descales of shape (num_seqs, num_kv_heads) from checkpoint scales."""

from __future__ import annotations

import pytest
import torch

from vendored_flash_attn import FlashAttnInputError, FlashAttnTypeError, make_fp8_descales


def test_per_tensor_floats_expand_without_copies():
    q, k, v = make_fp8_descales(0.25, 0.5, 2.0, num_seqs=3, num_kv_heads=4, device="cpu")
    for d, value in ((q, 0.25), (k, 0.5), (v, 2.0)):
        assert d.shape == (3, 4) and d.dtype == torch.float32 and d.stride() == (0, 0)
        assert torch.all(d == value)


def test_missing_q_scale_reuses_k_scale():
    k_scale = torch.tensor(0.5)
    q, k, v = make_fp8_descales(None, k_scale, torch.tensor([1.5]), num_seqs=2, num_kv_heads=2)
    assert q.data_ptr() == k.data_ptr() == k_scale.data_ptr()
    assert torch.all(v == 1.5)


def test_per_head_scales():
    per_head = torch.tensor([1.0, 2.0, 3.0])
    _, k, _ = make_fp8_descales(None, per_head, 1.0, num_seqs=5, num_kv_heads=3)
    assert k.shape == (5, 3) and k.stride() == (0, 1)
    assert torch.equal(k[4], per_head)


def test_full_descales_pass_through():
    full = torch.rand(2, 3)
    q, _, _ = make_fp8_descales(full, full, full, num_seqs=2, num_kv_heads=3)
    assert q is full


def test_wrong_shape_and_dtype():
    with pytest.raises(FlashAttnInputError, match=r"k_scale must be a scalar, per-KV-head \(3,\)"):
        make_fp8_descales(None, torch.ones(4), 1.0, num_seqs=2, num_kv_heads=3)
    with pytest.raises(FlashAttnTypeError, match="v_scale must be float32"):
        make_fp8_descales(None, 1.0, torch.ones(1, dtype=torch.float16), num_seqs=2, num_kv_heads=3,
                          device="cpu")
    with pytest.raises(FlashAttnInputError, match="num_seqs and num_kv_heads must be >= 1"):
        make_fp8_descales(None, 1.0, 1.0, num_seqs=0, num_kv_heads=3, device="cpu")
