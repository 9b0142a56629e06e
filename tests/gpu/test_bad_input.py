"""Bad input on the real GPU: every call in BAD raises a clear Python exception (a
FlashAttnInputError / FlashAttnTypeError naming the problem) before any kernel runs, and
after all of them the same process still computes correct results (the CUDA context is
intact: torch.cuda.synchronize() succeeds and a valid call matches the reference).

The DEBUG group are calls whose index *values* point outside the tensors (a wild read in
the kernel); they are caught only with VFA_DEBUG_CHECKS=1, which these cases set. FA4 gets
them too (the -fa4 cases): measured on the H200 before it did, one block id out of range
under VFA_DEBUG_CHECKS=1 was refused for FA2 and FA3 while fa_version=4 ran it and the CUDA
context died (cudaErrorInvalidAddressSpace). FA4's own checks (what upstream asserts, which
python -O removes) run here on real tensors as well; a bad FA4 call must not reach upstream's
kernel entry point (fa4_launches).
"""

from __future__ import annotations

# One file over 500 lines, on purpose: one table of bad calls (BAD) and the few tests that run it;
# the table is most of the file.

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import pytest
import torch

from vendored_flash_attn.declaration.families import registry

from gpu_helpers import (BUILD, FA2_BUCKETS, Rand, built_dtypes, built_head_dims, check,
                         chunked_lengths, fa3_has_fp8, has_feature, make_problem,
                         primary_head_dim, reference, run_attention, version_skip_reason)

pytestmark = pytest.mark.gpu

B, HQ, HK = 3, 8, 2  # batch 3 != HK 2, so a transposed descale has the wrong shape


class Base:
    """Small valid calls to break: packed and paged, for FA2 and FA3, bf16/fp16 and FP8."""

    def __init__(self, rng: Rand):
        self.rng = rng
        self._cache = {}

    def problem(self, version: int, *, paged: bool = False, fp8: bool = False, page: int = 16,
                head_dim: Optional[int] = None):
        key = (version, paged, fp8, page, head_dim)
        if key not in self._cache:
            compiled = registry()[version].compiled  # FA4 selects no kernels: bf16, head dim 128
            dtype = "e4m3" if fp8 else (built_dtypes(version)[0] if compiled else "bf16")
            self._cache[key] = make_problem(
                self.rng, dtype=dtype, num_heads=HQ, num_heads_k=HK,
                head_dim=head_dim or (primary_head_dim(version) if compiled else 128), q_lens=[5, 1, 9],
                k_lens=[40, 17, 9], page_size=page if paged else None)
        return self._cache[key]

    def call(self, version: Optional[int], *, paged: bool = False, fp8: bool = False,
             page: int = 16, head_dim: Optional[int] = None, **changes) -> dict:
        """Keyword arguments of a valid call, with ``changes`` applied (a value of DROP
        removes the argument)."""
        p = self.problem(version if registry().get(version) else 3, paged=paged, fp8=fp8, page=page,
                         head_dim=head_dim)
        kw = dict(p.kwargs(), causal=True, fa_version=version)
        for name, value in changes.items():
            if value is DROP:
                kw.pop(name, None)
            else:
                kw[name] = value(kw) if callable(value) and not isinstance(value, torch.Tensor) else value
        return kw


DROP = object()


def heads(kw, name, n):
    """``kw[name]`` with its head dimension cut or repeated to ``n`` heads."""
    x = kw[name]
    reps = -(-n // x.shape[-2])
    return x.repeat_interleave(reps, dim=-2)[..., :n, :].contiguous()


def head_size(kw, name, d):
    x = kw[name]
    out = torch.zeros(*x.shape[:-1], d, dtype=torch.float32, device=x.device)
    n = min(d, x.shape[-1])
    out[..., :n] = x[..., :n].float()
    return out.to(x.dtype)


_VERSIONS = registry().versions
UNDECLARED = max(_VERSIONS) + 1
FA_VERSION_MESSAGE = f"fa_version must be {', '.join(map(str, _VERSIONS))} or None"


@dataclass(frozen=True)
class Bad:
    id: str
    version: Optional[int]  # fa_version passed (None: the selector)
    make: Callable[[Base], dict]
    fragment: str           # part of the message (case-insensitive)
    type_error: bool = False  # must also be a TypeError (FlashAttnTypeError)
    needs: Tuple[str, ...] = ()  # "fa2", "fa3", "fp8", "paged", "split", "no-softcap", ...
    debug: bool = False     # run with VFA_DEBUG_CHECKS=1
    unavailable_ok: bool = False  # FlashAttnUnavailableError is also a clear answer


def cpu(name):
    return lambda kw: kw[name].cpu()


def int64(name):
    return lambda kw: kw[name].to(torch.int64)


def noncontiguous(x):
    wide = torch.stack([x, x], dim=-1).reshape(-1)
    view = wide[::2]
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


def fa2_missing_bucket():
    built = built_head_dims(2)
    return next((b for b in FA2_BUCKETS if b not in built), None)


def fa3_too_large():
    built = built_head_dims(3)
    return 256 if max(built, default=256) < 256 else None


BAD = [
    # --- devices
    Bad("q-on-cpu", 3, lambda b: b.call(3, q=cpu("q")), "q is on cpu"),
    Bad("k-on-cpu", 3, lambda b: b.call(3, k=cpu("k")), "k is on cpu"),
    Bad("v-on-cpu-fa2", 2, lambda b: b.call(2, v=cpu("v")), "v is on cpu"),
    Bad("cu_seqlens_q-on-cpu", 3, lambda b: b.call(3, cu_seqlens_q=cpu("cu_seqlens_q")),
        "cu_seqlens_q is on cpu"),
    Bad("cu_seqlens_k-on-cpu-fa2", 2, lambda b: b.call(2, cu_seqlens_k=cpu("cu_seqlens_k")),
        "cu_seqlens_k is on cpu"),
    Bad("block_table-on-cpu", 3, lambda b: b.call(3, paged=True, block_table=cpu("block_table")),
        "block_table is on cpu", needs=("paged",)),
    Bad("seqused_k-on-cpu-fa2", 2, lambda b: b.call(2, paged=True, seqused_k=cpu("seqused_k")),
        "seqused_k is on cpu"),
    Bad("out-on-cpu", 3, lambda b: b.call(3, out=lambda kw: torch.empty(
        kw["q"].shape, dtype=kw["q"].dtype)), "out is on cpu"),
    Bad("fp8-descale-on-cpu", 3, lambda b: b.call(3, fp8=True, k_descale=cpu("k_descale")),
        "k_descale is on cpu", needs=("fp8",)),
    # --- types and dtypes
    Bad("q-is-a-list", 3, lambda b: b.call(3, q=lambda kw: kw["q"].tolist()),
        "q must be a torch.Tensor", type_error=True),
    Bad("q-float32", 3, lambda b: b.call(3, q=lambda kw: kw["q"].float(), k=lambda kw: kw["k"].float(),
                                         v=lambda kw: kw["v"].float()), "float32", type_error=True),
    Bad("q-float32-default-version", None, lambda b: b.call(
        None, q=lambda kw: kw["q"].float(), k=lambda kw: kw["k"].float(),
        v=lambda kw: kw["v"].float()), "float32", unavailable_ok=True),
    Bad("k-fp16-q-bf16", 3, lambda b: b.call(3, k=lambda kw: kw["k"].half()), "k has dtype",
        type_error=True),
    Bad("v-float32-fa2", 2, lambda b: b.call(2, v=lambda kw: kw["v"].float()), "v has dtype",
        type_error=True),
    Bad("cu_seqlens_q-int64", 3, lambda b: b.call(3, cu_seqlens_q=int64("cu_seqlens_q")),
        "cu_seqlens_q must have dtype torch.int32", type_error=True),
    Bad("cu_seqlens_k-int64-fa2", 2, lambda b: b.call(2, cu_seqlens_k=int64("cu_seqlens_k")),
        "cu_seqlens_k must have dtype torch.int32", type_error=True),
    Bad("seqused_k-int64", 3, lambda b: b.call(3, paged=True, seqused_k=int64("seqused_k")),
        "seqused_k must have dtype torch.int32", type_error=True, needs=("paged",)),
    Bad("block_table-int64-fa2", 2, lambda b: b.call(2, paged=True, block_table=int64("block_table")),
        "block_table must have dtype torch.int32", type_error=True),
    Bad("fp8-to-fa2", 2, lambda b: b.call(2, fp8=True), "FP8", type_error=True),
    Bad("fp8-q-bf16-kv", 3, lambda b: b.call(3, fp8=True, k=lambda kw: kw["k"].to(torch.bfloat16),
                                             v=lambda kw: kw["v"].to(torch.bfloat16)),
        "k has dtype", type_error=True, needs=("fp8",)),
    Bad("fp8-out-e4m3", 3, lambda b: b.call(3, fp8=True, out=lambda kw: torch.empty_like(kw["q"])),
        "bf16", type_error=True, needs=("fp8",)),
    Bad("fp8-descale-float16", 3, lambda b: b.call(3, fp8=True, v_descale=lambda kw: kw["v_descale"].half()),
        "v_descale must be float32", type_error=True, needs=("fp8",)),
    Bad("fp8-descale-per-q-head", 3, lambda b: b.call(3, fp8=True, q_descale=lambda kw: torch.ones(
        B, HQ, device="cuda")), "q_descale must have shape (num_seqs, num_kv_heads)", needs=("fp8",)),
    Bad("fp8-descale-1d", 3, lambda b: b.call(3, fp8=True, k_descale=lambda kw: torch.ones(
        B, device="cuda")), "k_descale must have shape", needs=("fp8",)),
    Bad("fp8-descale-transposed", 3, lambda b: b.call(3, fp8=True, k_descale=lambda kw: kw["k_descale"].t()),
        "k_descale must have shape", needs=("fp8",)),
    Bad("fp8-head-size-not-multiple-of-16", 3, lambda b: b.call(
        3, fp8=True, q=lambda kw: head_size(kw, "q", 120), k=lambda kw: head_size(kw, "k", 120),
        v=lambda kw: head_size(kw, "v", 120)), "multiples of 16", needs=("fp8",)),
    Bad("alibi-float16-fa2", 2, lambda b: b.call(2, alibi_slopes=torch.ones(HQ, device="cuda").half()),
        "alibi_slopes must be float32", type_error=True),
    Bad("s_aux-float32", 3, lambda b: b.call(3, s_aux=torch.zeros(HQ, device="cuda")),
        "s_aux must be bfloat16", type_error=True),
    Bad("max_seqlen_q-tensor", 3, lambda b: b.call(3, max_seqlen_q=lambda kw: torch.tensor(
        kw["max_seqlen_q"], device="cuda")), "max_seqlen_q must be a Python int", type_error=True),
    Bad("max_seqlen_k-float", 2, lambda b: b.call(2, max_seqlen_k=lambda kw: float(kw["max_seqlen_k"])),
        "max_seqlen_k must be an int", type_error=True),
    # --- shapes
    Bad("q-2d", 3, lambda b: b.call(3, q=lambda kw: kw["q"].flatten(1)), "q must be 3-D"),
    Bad("k-4d-with-cu_seqlens_k", 3, lambda b: b.call(3, k=lambda kw: kw["k"].unsqueeze(0),
                                                      v=lambda kw: kw["v"].unsqueeze(0)),
        "k must be 3-D"),
    Bad("k-head-size-differs", 3,
        lambda b: b.call(3, k=lambda kw: head_size(kw, "k", kw["k"].shape[-1] // 2)),
        "k has head size"),
    Bad("heads-not-a-multiple", 3, lambda b: b.call(3, q=lambda kw: heads(kw, "q", 7)),
        "multiple of the number of k/v heads"),
    Bad("heads-not-a-multiple-fa2", 2, lambda b: b.call(2, k=lambda kw: heads(kw, "k", 3),
                                                        v=lambda kw: heads(kw, "v", 3)),
        "multiple of the number of k/v heads"),
    Bad("k-v-heads-differ", 3, lambda b: b.call(3, v=lambda kw: heads(kw, "v", 1)),
        "k and v must agree"),
    # Half the base's head size: never a pair of the hdimdiff kernels (64 -> 256/512,
    # 192 -> 128), so refused whatever head dim the wheel's base call has.
    Bad("v-head-size-differs-fa3", 3, lambda b: b.call(3, v=lambda kw: head_size(kw, "v", kw["v"].shape[-1] // 2)),
        "V head size"),
    Bad("v-head-size-differs-fa2", 2, lambda b: b.call(2, v=lambda kw: head_size(kw, "v", kw["v"].shape[-1] // 2)),
        "same head size for V"),
    Bad("cu_seqlens_q-2d", 3, lambda b: b.call(3, cu_seqlens_q=lambda kw: kw["cu_seqlens_q"].view(1, -1)),
        "cu_seqlens_q must be 1-D"),
    Bad("cu_seqlens_q-one-entry", 2, lambda b: b.call(2, cu_seqlens_q=lambda kw: kw["cu_seqlens_q"][:1]),
        "cu_seqlens_q must be 1-D"),
    Bad("cu_seqlens_q-noncontiguous", 3, lambda b: b.call(
        3, cu_seqlens_q=lambda kw: noncontiguous(kw["cu_seqlens_q"])), "cu_seqlens_q must be contiguous"),
    Bad("cu_seqlens_k-too-long", 3, lambda b: b.call(3, cu_seqlens_k=lambda kw: torch.cat(
        [kw["cu_seqlens_k"], kw["cu_seqlens_k"][-1:]])), "cu_seqlens_k must have shape"),
    Bad("seqused_k-too-short-fa2", 2,
        lambda b: b.call(2, paged=True, seqused_k=lambda kw: kw["seqused_k"][:-1]),
        "seqused_k must have shape"),
    Bad("block_table-extra-row", 3, lambda b: b.call(3, paged=True, block_table=lambda kw: torch.cat(
        [kw["block_table"], kw["block_table"][:1]])), "block_table has 4 rows", needs=("paged",)),
    Bad("block_table-1d-fa2", 2, lambda b: b.call(2, paged=True, block_table=lambda kw: kw["block_table"][0]),
        "block_table must be 2-D"),
    Bad("out-wrong-shape", 3, lambda b: b.call(3, out=lambda kw: torch.empty(
        kw["q"].shape[0], HQ, kw["q"].shape[-1] + 8, dtype=kw["q"].dtype, device="cuda")),
        "out must have shape"),
    Bad("out-wrong-dtype-fa2", 2, lambda b: b.call(2, out=lambda kw: torch.empty(
        kw["q"].shape, dtype=torch.float32, device="cuda")), "out has dtype", type_error=True),
    Bad("out-strided-last-dim", 3, lambda b: b.call(3, out=lambda kw: torch.empty(
        *kw["q"].shape[:-1], 2 * kw["q"].shape[-1], dtype=kw["q"].dtype, device="cuda")[..., ::2]),
        "out must have a contiguous last dimension"),
    # --- head sizes
    Bad("head-size-100-fa3", 3, lambda b: b.call(3, q=lambda kw: head_size(kw, "q", 100),
                                                 k=lambda kw: head_size(kw, "k", 100),
                                                 v=lambda kw: head_size(kw, "v", 100)),
        "multiples of 8"),
    Bad("head-size-264-fa3", 3, lambda b: b.call(3, q=lambda kw: head_size(kw, "q", 264),
                                                 k=lambda kw: head_size(kw, "k", 264),
                                                 v=lambda kw: head_size(kw, "v", 264)),
        "larger than the largest FA3 head dim"),
    Bad("head-size-264-fa2", 2, lambda b: b.call(2, q=lambda kw: head_size(kw, "q", 264),
                                                 k=lambda kw: head_size(kw, "k", 264),
                                                 v=lambda kw: head_size(kw, "v", 264)),
        "up to 256"),
    Bad("head-size-not-built-fa2", 2, lambda b: b.call(2, head_dim=fa2_missing_bucket()),
        "which this wheel does not contain", needs=("fa2-missing-bucket",)),
    Bad("head-size-not-built-fa3", 3, lambda b: b.call(3, head_dim=fa3_too_large()),
        "larger than the largest FA3 head dim", needs=("fa3-below-256",)),
    # --- K/V layout
    Bad("block_table-without-seqused_k", 3, lambda b: b.call(3, paged=True, seqused_k=DROP),
        "needs seqused_k", needs=("paged",)),
    Bad("block_table-without-seqused_k-fa2", 2, lambda b: b.call(2, paged=True, seqused_k=DROP),
        "needs seqused_k"),
    Bad("block_table-with-cu_seqlens_k", 3, lambda b: b.call(
        3, paged=True, cu_seqlens_k=torch.zeros(B + 1, dtype=torch.int32, device="cuda")),
        "no cu_seqlens_k", needs=("paged",)),
    Bad("no-cu_seqlens_k-no-seqused_k", 3, lambda b: b.call(3, cu_seqlens_k=DROP), "got neither"),
    Bad("cu_seqlens_k-and-seqused_k", 3, lambda b: b.call(3, seqused_k=torch.ones(
        B, dtype=torch.int32, device="cuda")), "not both"),
    Bad("fa2-seqused_k-without-block_table", 2, lambda b: b.call(
        2, cu_seqlens_k=DROP, seqused_k=torch.full((B,), 8, dtype=torch.int32, device="cuda"),
        k=lambda kw: kw["k"][:B * 8].view(B, 8, HK, -1), v=lambda kw: kw["v"][:B * 8].view(B, 8, HK, -1)),
        "FA2 needs cu_seqlens_k"),
    Bad("fa2-page-size-8", 2, lambda b: b.call(2, paged=True, page=8), "divisible by 16"),
    # --- options
    Bad("dropout", 3, lambda b: b.call(3, dropout_p=0.1), "dropout_p must be 0.0"),
    Bad("dropout-fa2", 2, lambda b: b.call(2, dropout_p=0.1), "dropout_p must be 0.0"),
    Bad("softcap-negative", 2, lambda b: b.call(2, softcap=-1.0), "softcap must be >= 0"),
    Bad("softcap-not-built-fa3", 3, lambda b: b.call(3, softcap=30.0), "'softcap'",
        needs=("no-softcap",)),
    Bad("num_splits-fa2", 2, lambda b: b.call(2, num_splits=2), "FA2 does not take num_splits"),
    Bad("num_splits-300-fa3", 3, lambda b: b.call(3, num_splits=300), "up to 256", needs=("split",)),
    Bad("window-three-values", 3, lambda b: b.call(3, window_size=(8, 0, 1)),
        "window_size must be (left, right)"),
    # A version no family declares (one past the newest), and the right number as a string;
    # the message lists the declared versions (cmake/knobs.json's families).
    Bad("fa_version-undeclared", UNDECLARED, lambda b: b.call(UNDECLARED), FA_VERSION_MESSAGE),
    Bad("fa_version-string", "3", lambda b: b.call("3"), FA_VERSION_MESSAGE),
    Bad("max_seqlen_k-negative", 3, lambda b: b.call(3, max_seqlen_k=-1), "max_seqlen_k must be >= 0"),
    Bad("alibi-fa3", 3, lambda b: b.call(3, alibi_slopes=torch.ones(HQ, device="cuda")), "ALiBi"),
    Bad("alibi-wrong-shape-fa2", 2, lambda b: b.call(2, alibi_slopes=torch.ones(HQ + 1, device="cuda")),
        "alibi_slopes must have shape"),
    Bad("s_aux-fa2", 2, lambda b: b.call(2, s_aux=torch.zeros(HQ, device="cuda", dtype=torch.bfloat16)),
        "s_aux"),
    Bad("q_v-fa2", 2, lambda b: b.call(2, q_v=lambda kw: kw["q"]), "q_v needs FA3"),
    Bad("q_v-head-size-128-fa3", 3, lambda b: b.call(3, q_v=lambda kw: kw["q"]), "q_v needs"),
    Bad("scheduler_metadata-fa2", 2, lambda b: b.call(2, scheduler_metadata=torch.zeros(
        8, dtype=torch.int32, device="cuda")), "FA3-only"),
    Bad("cp_world_size-fa2", 2, lambda b: b.call(2, cp_world_size=2), "needs FA3"),
    Bad("cp_rank-without-cp", 3, lambda b: b.call(3, cp_rank=1), "cp_rank must be 0"),
    Bad("cp_world_size-without-tot_seqused_k", 3, lambda b: b.call(3, cp_world_size=2),
        "needs cp_tot_seqused_k"),
    # --- index values out of range: caught by the debug checks (VFA_DEBUG_CHECKS=1)
    Bad("debug-block-id-past-cache", 3, lambda b: b.call(3, paged=True, block_table=lambda kw: kw[
        "block_table"].clone().index_fill_(1, torch.tensor([0], device="cuda"), kw["k"].shape[0] + 5)),
        "outside the KV cache", needs=("paged",), debug=True),
    Bad("debug-block-id-negative-fa2", 2, lambda b: b.call(2, paged=True, block_table=lambda kw: kw[
        "block_table"].clone().index_fill_(1, torch.tensor([0], device="cuda"), -1)),
        "outside the KV cache", debug=True),
    Bad("debug-seqused_k-past-capacity", 3, lambda b: b.call(3, paged=True, seqused_k=lambda kw: kw[
        "seqused_k"] + kw["block_table"].shape[1] * kw["k"].shape[1]), "larger than the KV capacity",
        needs=("paged",), debug=True),
    Bad("debug-cu_seqlens_k-past-k-fa2", 2, lambda b: b.call(2, cu_seqlens_k=lambda kw: kw[
        "cu_seqlens_k"] * 100), "cu_seqlens_k ends at", debug=True),
    Bad("debug-cu_seqlens_q-not-from-0", 3, lambda b: b.call(3, cu_seqlens_q=lambda kw: kw[
        "cu_seqlens_q"] + 1), "cu_seqlens_q must start at 0", debug=True),
    Bad("debug-cu_seqlens_q-decreasing", 2, lambda b: b.call(2, cu_seqlens_q=lambda kw: kw[
        "cu_seqlens_q"][[0, 2, 1, 3]]), "non-decreasing", debug=True),
    Bad("debug-max_seqlen_q-too-small", 3, lambda b: b.call(3, max_seqlen_q=1),
        "max_seqlen_q=1 is smaller", debug=True),
    Bad("debug-max_seqlen_k-too-small-paged", 3, lambda b: b.call(3, paged=True, max_seqlen_k=2),
        "max_seqlen_k=2 is smaller", needs=("paged",), debug=True),
    # --- FA4: the debug checks (the call that killed the CUDA context before), and FA4's own
    # checks, which replace upstream's asserts (python -O removes those)
    Bad("debug-block-id-1000000-fa4", 4, lambda b: b.call(4, paged=True, page=128, block_table=lambda kw: kw[
        "block_table"].clone().index_fill_(1, torch.tensor([0], device="cuda"), 1_000_000)),
        "= 1000000 is outside the KV cache", debug=True),
    Bad("debug-block-id-negative-fa4", 4, lambda b: b.call(4, paged=True, page=128, block_table=lambda kw: kw[
        "block_table"].clone().index_fill_(1, torch.tensor([0], device="cuda"), -1)),
        "outside the KV cache", debug=True),
    Bad("debug-seqused_k-past-capacity-fa4", 4, lambda b: b.call(4, paged=True, page=128, seqused_k=lambda kw: kw[
        "seqused_k"] + kw["block_table"].shape[1] * kw["k"].shape[1]), "larger than the KV capacity", debug=True),
    Bad("debug-cu_seqlens_k-past-k-fa4", 4, lambda b: b.call(4, cu_seqlens_k=lambda kw: kw["cu_seqlens_k"] * 100),
        "cu_seqlens_k ends at", debug=True),
    Bad("debug-cu_seqlens_q-not-from-0-fa4", 4, lambda b: b.call(4, cu_seqlens_q=lambda kw: kw["cu_seqlens_q"] + 1),
        "cu_seqlens_q must start at 0", debug=True),
    Bad("head-size-520-fa4", 4, lambda b: b.call(4, q=lambda kw: head_size(kw, "q", 520),
                                                 k=lambda kw: head_size(kw, "k", 520),
                                                 v=lambda kw: head_size(kw, "v", 520)), "FA4 takes head sizes"),
    Bad("paged-head-size-72-page-16-fa4", 4, lambda b: b.call(4, paged=True, page=16, head_dim=72),
        "needs a page size of"),
    Bad("fp8-q-on-sm90-fa4", 4, lambda b: b.call(4, fp8=True), "FP8 q needs FA3", needs=("sm90",)),
    Bad("alibi-fa4", 4, lambda b: b.call(4, alibi_slopes=torch.ones(HQ, device="cuda")), "fa_version=2"),
]


def usable_reason(version: int) -> Optional[str]:
    """Why FA``version`` cannot run here (None: it can): gpu_helpers' answer, and for a family
    it does not know the GPUs of (FA4) the package's own (fa_version_unsupported_reason)."""
    reason = version_skip_reason(version)
    if reason is None and not registry()[version].compiled:
        from vendored_flash_attn import fa_version_unsupported_reason

        reason = fa_version_unsupported_reason(version)
    return reason


def bad_versions(bad: Bad) -> set:
    """The FA versions ``bad`` needs usable: the one it passes (an odd fa_version is built
    from an FA3 call), plus FA2 for an FA2 case (id ending in -fa2)."""
    versions = {bad.version} if registry().get(bad.version) else {3}
    if bad.version == 2 or "fa2" in bad.id:
        versions.add(2)
    return versions


def unmet(bad: Bad) -> Optional[str]:
    """Why ``bad`` does not apply to this wheel/machine; None when it does."""
    for v in sorted(bad_versions(bad)):
        reason = usable_reason(v)
        if reason:
            return f"FA{v} not usable: {reason}"
    fa3 = BUILD.fa3 if BUILD else None
    for need in bad.needs:
        if need == "fp8" and not fa3_has_fp8():
            return "no FA3 e4m3 kernels in this wheel"
        if need in ("paged", "split") and not has_feature(need):
            return f"no FA3 '{need}' kernels in this wheel"
        if need == "no-softcap" and has_feature("softcap"):
            return "this wheel has FA3 softcap kernels (test_varlen covers softcap)"
        if need == "fa2-missing-bucket" and fa2_missing_bucket() is None:
            return "this wheel has every FA2 head dim"
        if need == "fa3-below-256" and (fa3 is None or fa3_too_large() is None):
            return "this wheel has FA3 head dim 256"
        if need == "sm90" and torch.cuda.get_device_capability()[0] != 9:
            return "a Hopper GPU's refusal (FA4 takes FP8 q on sm100)"
    return None


def check_bad_calls_made(refused, skipped, usable) -> None:
    """The bar of test_context_intact_after_all_bad_calls, from what the wheel holds: every
    bad call that needs nothing beyond usable FA versions (no kernel feature, FP8 or head
    dim the selection may leave out) was made and refused, and there is at least one
    such call for each usable version. A wheel without FA3 still makes every FA2 one; a
    rule that skipped calls it should make fails here."""
    usable = set(usable)
    required = [bad for bad in BAD if not bad.needs and bad_versions(bad) <= usable]
    missing = [bad.id for bad in required if bad.id not in refused]
    assert not missing, (f"{len(missing)} bad calls that need only FA{sorted(usable)} were not "
                         f"made: {missing} (skipped: {skipped})")
    for version in sorted(usable):
        assert any(version in bad_versions(bad) for bad in required), (
            f"no bad call exercises FA{version}, which this wheel holds")


@contextlib.contextmanager
def debug_checks(on: bool):
    """VFA_DEBUG_CHECKS=1 for the duration (read once per process: caches are reset)."""
    if not on:
        yield
        return
    from vendored_flash_attn.selection.environment import set_environment

    old = os.environ.get("VFA_DEBUG_CHECKS")
    os.environ["VFA_DEBUG_CHECKS"] = "1"
    set_environment(None)
    try:
        yield
    finally:
        if old is None:
            del os.environ["VFA_DEBUG_CHECKS"]
        else:
            os.environ["VFA_DEBUG_CHECKS"] = old
        set_environment(None)


def call_bad(bad: Bad, base: Base) -> str:
    """Make and run the bad call; return the message of the exception it raised."""
    from vendored_flash_attn import (FlashAttnFallbackWarning, FlashAttnInputError,
                                     FlashAttnTypeError, FlashAttnUnavailableError,
                                     flash_attn_varlen_func)

    kwargs = bad.make(base)
    expected = (FlashAttnInputError, FlashAttnUnavailableError) if bad.unavailable_ok else FlashAttnInputError
    with debug_checks(bad.debug), warnings.catch_warnings():
        # The selector's fallback warning (default-version case) comes once per process.
        warnings.simplefilter("ignore", FlashAttnFallbackWarning)
        with pytest.raises(expected) as info:
            flash_attn_varlen_func(**kwargs)
    message = str(info.value)
    assert bad.fragment.lower() in message.lower(), f"{bad.id}: message lacks {bad.fragment!r}: {message}"
    if bad.type_error:
        assert isinstance(info.value, (FlashAttnTypeError, TypeError)), f"{bad.id}: {info.value!r}"
    return message


@pytest.fixture
def fa4_launches(monkeypatch):
    """The calls that reached FA4's kernels (upstream's ``_flash_attn_fwd``, after every check
    of the adapter): FA4's counterpart of ``op_versions``, which sees only that the adapter
    was called. Empty and inert where FA4 cannot run."""
    calls: list = []
    if usable_reason(4) is not None:
        yield calls
        return
    from vendored_flash_attn.families.fa4 import adapter as fa4

    real = fa4.load()

    class Counted:
        def __getattr__(self, name):
            return getattr(real.interface, name)

        def _flash_attn_fwd(self, *args, **kwargs):
            calls.append(kwargs.get("_arch"))
            return real.interface._flash_attn_fwd(*args, **kwargs)

    loaded = fa4.Loaded(Counted(), real.cache_layout)
    monkeypatch.setattr(fa4, "load", lambda: loaded)
    yield calls


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_input_is_refused(bad, rng, fa4_launches):
    reason = unmet(bad)
    if reason:
        pytest.skip(reason)
    call_bad(bad, Base(rng))
    torch.cuda.synchronize()
    assert fa4_launches == [], f"{bad.id}: refused only after FA4's kernel entry point was called"


def valid_call_is_correct(version: int, rng: Rand, label: str) -> float:
    q_lens, k_lens = chunked_lengths(rng)
    compiled = registry()[version].compiled
    p = make_problem(rng, dtype=built_dtypes(version)[0] if compiled else "bf16", num_heads=32, num_heads_k=8,
                     head_dim=primary_head_dim(version) if compiled else 128, q_lens=q_lens, k_lens=k_lens)
    out, lse = run_attention(p, version=version, causal=True)
    ref_out, ref_lse = reference(p, causal=True)
    return check(p, out, lse, ref_out, ref_lse, label=label)


def test_context_intact_after_all_bad_calls(rng, op_versions, fa4_launches):
    """All applicable bad calls in a row in this process, then synchronize and valid calls
    on every usable version, compared with the reference. The compiled forward ops are
    wrapped in a counter (op_versions), and FA4's kernel entry point in another
    (fa4_launches): no bad call may reach one (refused in Python, before any kernel), and
    the valid calls must (so the counters do count)."""
    usable = [v for v in registry().versions if usable_reason(v) is None]
    if not usable:
        pytest.skip("no usable FlashAttention version")
    compiled = [v for v in usable if registry()[v].compiled]
    op_calls = op_versions
    base = Base(rng)
    refused, skipped = [], []
    for bad in BAD:
        if unmet(bad):
            skipped.append(bad.id)
            continue
        call_bad(bad, base)
        refused.append(bad.id)
        assert [v for v in op_calls if v in compiled] == [], f"{bad.id}: refused only after the op ran"
        assert fa4_launches == [], f"{bad.id}: refused only after FA4's kernel entry point was called"
    print(f"{len(refused)} bad calls refused, {len(skipped)} not applicable to this wheel: {skipped}")
    check_bad_calls_made(refused, skipped, usable)
    torch.cuda.synchronize()  # a bad call that reached a kernel would surface here
    for version in usable:
        valid_call_is_correct(version, rng, f"FA{version} valid call after {len(refused)} bad calls")
    torch.cuda.synchronize()
    assert sorted({v for v in op_calls if v in compiled}) == compiled, op_calls
    assert bool(fa4_launches) == (4 in usable), fa4_launches
