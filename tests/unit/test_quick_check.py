"""The hot-path check must never accept a call the full check refuses, and must agree
with it on what it accepts."""

from __future__ import annotations

import itertools

import pytest
import torch

from calls import descales, paged_call, varlen_call
from runtime_fakes import make_build
from vendored_flash_attn.families import registry
from vendored_flash_attn.call import VarlenCall
from vendored_flash_attn.validation import check_varlen_call, quick_check_varlen_call, window_tuple


def _mutations():
    """(label, builder) pairs: valid calls and one-thing-wrong variants of them."""
    def base(kind, **kw):
        return (varlen_call if kind == "varlen" else paged_call)(**kw)

    for kind in ("varlen", "paged"):
        yield f"{kind}-valid", lambda kind=kind: base(kind)
        yield f"{kind}-gqa-8/1", lambda kind=kind: base(kind, kv_heads=1)
        yield f"{kind}-bad-gqa", lambda kind=kind: base(kind, heads=6, kv_heads=4)
        yield f"{kind}-fp16", lambda kind=kind: base(kind, dtype=torch.float16)
        yield f"{kind}-fp8", lambda kind=kind: {**base(kind, dtype=torch.float8_e4m3fn), **descales()}
        yield f"{kind}-fp8-bad-descale", lambda kind=kind: {
            **base(kind, dtype=torch.float8_e4m3fn), **descales(batch=3)}
        yield f"{kind}-fp8-f16-descale", lambda kind=kind: {
            **base(kind, dtype=torch.float8_e4m3fn),
            **{k: d.half() for k, d in descales().items()}}
        yield f"{kind}-hdim64", lambda kind=kind: base(kind, d=64)
        yield f"{kind}-hdim72", lambda kind=kind: base(kind, d=72)
        yield f"{kind}-dv-diff", lambda kind=kind: base(kind, d=192, dv=128)

        def k_dtype(kind=kind):
            call = base(kind)
            call["k"] = call["k"].half()
            return call
        yield f"{kind}-k-dtype", k_dtype

        def idx64(kind=kind):
            call = base(kind)
            call["cu_seqlens_q"] = call["cu_seqlens_q"].long()
            return call
        yield f"{kind}-cu-int64", idx64

        def short_cu(kind=kind):
            call = base(kind)
            call["cu_seqlens_q"] = call["cu_seqlens_q"][:2]
            return call
        yield f"{kind}-cu-short", short_cu

        def out_ok(kind=kind):
            call = base(kind)
            call["out"] = torch.empty_like(call["q"])
            return call
        yield f"{kind}-out", out_ok

        def out_bad(kind=kind):
            call = base(kind)
            call["out"] = torch.empty(call["q"].shape[0] + 1, *call["q"].shape[1:], dtype=call["q"].dtype)
            return call
        yield f"{kind}-out-shape", out_bad

        def on_meta(kind=kind):
            call = base(kind)
            call["cu_seqlens_q"] = torch.empty(3, dtype=torch.int32, device="meta")
            return call
        yield f"{kind}-meta-index", on_meta

        for name, extra in (("softcap", {"softcap": 30.0}), ("window", {"window_size": (64, 0)}),
                            ("splits", {"num_splits": 4}), ("max-seqlen-float", {"max_seqlen_q": 4.0}),
                            ("dropout", {"dropout_p": 0.1}),
                            ("scheduler", {"scheduler_metadata": torch.zeros(3, dtype=torch.int32)}),
                            ("scheduler-int64", {"scheduler_metadata": torch.zeros(3, dtype=torch.int64)}),
                            # what only some families take: the quick check leaves each to the full one
                            ("q_v", {"q_v": torch.zeros(6, 8, 128)}), ("alibi", {"alibi_slopes": torch.rand(8)}),
                            ("sinks", {"s_aux": torch.zeros(8, dtype=torch.bfloat16)}),
                            ("cp-world-2", {"cp_world_size": 2}), ("cp-rank-1", {"cp_rank": 1}),
                            ("cp-world-bool", {"cp_world_size": True}), ("num-splits-bool", {"num_splits": True}),
                            ("cp-tot", {"cp_tot_seqused_k": torch.zeros(2, dtype=torch.int32)})):
            yield f"{kind}-{name}", lambda kind=kind, extra=extra: {**base(kind), **extra}

    def paged_no_seqused():
        call = paged_call()
        del call["seqused_k"]
        return call
    yield "paged-no-seqused", paged_no_seqused

    def paged_with_cu():
        call = paged_call()
        call["cu_seqlens_k"] = torch.tensor([0, 5, 25], dtype=torch.int32)
        return call
    yield "paged-and-cu", paged_with_cu

    def paged_rows():
        call = paged_call()
        call["block_table"] = call["block_table"][:1]
        return call
    yield "paged-block-rows", paged_rows

    yield "paged-block-12", lambda: paged_call(block_size=12)


def _full_args(call):
    """(the call object, its window) of a call's keywords."""
    return VarlenCall(**{"causal": True, **call}), window_tuple(call.get("window_size"))


CASES = list(_mutations())


def _quick(version, comp, args):
    call, window = args
    return quick_check_varlen_call(registry()[version], comp, -1, call.q.shape, call.v.shape, call.q.dtype, call,
                                   window)


def _full(version, comp, args):
    try:
        return check_varlen_call(registry()[version], comp, "cpu", *args)
    except (ValueError, TypeError) as exc:
        return exc


@pytest.mark.parametrize("preset, version", list(itertools.product(("minimal", "full"), (2, 3))) + [("-", 4)])
def test_quick_check_agrees_with_the_full_check(preset, version):
    # FA4 has no build record of kernels (comp None): its declaration alone decides
    comp = None if version == 4 else make_build(preset).component(version)
    accepted = refused = 0
    for label, build in CASES:
        args = _full_args(build())
        full = _full(version, comp, args)
        refused += isinstance(full, Exception)
        if not _quick(version, comp, args):
            continue
        accepted += 1
        assert not isinstance(full, Exception), \
            f"{label}: the quick check accepted what the full check refused: {full!r}"
    # The common calls do take the quick path, and the corpus does break calls.
    assert accepted >= 4, accepted
    assert refused >= 20, refused


# --- the quick path is taken -------------------------------------------------------------

def _common_calls(fp8: bool):
    """The shapes a serving engine sends on every layer: packed prefill, paged decode
    and chunked prefill, with and without out=, GQA, a sliding window; FP8 paged on Hopper."""
    calls = [dict(varlen_call(), causal=True),
             dict(paged_call(), causal=True),
             dict(paged_call(kv_heads=1), causal=True, out=torch.empty(6, 8, 128, dtype=torch.bfloat16)),
             dict(varlen_call(), causal=True, window_size=(63, 0))]
    if fp8:
        calls.append(dict(paged_call(torch.float8_e4m3fn), causal=True, **descales()))
    return calls


@pytest.mark.parametrize("caps, fa_version", [((9, 0), 3), ((9, 0), None), ((8, 0), 2), ((8, 0), None)],
                         ids=["fa3", "hopper-selector", "fa2", "ampere-selector"])
def test_common_calls_skip_the_full_check(describe, fake_ops, monkeypatch, caps, fa_version):
    """The quick check is what keeps the per-call cost low: the common calls must not
    reach check_varlen_call (spied on), and one unusual call must (the spy works)."""
    from vendored_flash_attn import flash_attn_varlen_func, interface

    describe(caps=(caps,))
    full_checks = []
    real = interface.check_varlen_call

    def spy(*args, **kwargs):
        full_checks.append(args[3].q.shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(interface, "check_varlen_call", spy)
    calls = _common_calls(fp8=caps == (9, 0))
    for call in calls:
        flash_attn_varlen_func(**call, fa_version=fa_version)
    assert full_checks == [], f"{len(full_checks)} of {len(calls)} common calls took the full check"
    assert len(fake_ops.calls) == len(calls)
    unusual = dict(alibi_slopes=torch.rand(8)) if caps == (8, 0) else dict(
        s_aux=torch.zeros(8, dtype=torch.bfloat16))
    flash_attn_varlen_func(**varlen_call(), **unusual, fa_version=fa_version)
    assert len(full_checks) == 1


# --- verdicts belong to the ComponentInfo they were made for ------------------------------

def test_verdict_is_not_inherited_by_a_component_at_a_reused_address():
    """A verdict cached for one build's ComponentInfo must not answer for another one,
    even when the first is gone and the second lives at its address (CPython hands a
    freed object's memory to the next object of that size)."""
    import gc

    from vendored_flash_attn.build_info import ComponentInfo

    call = _full_args(varlen_call(torch.float16))

    def fa3(dtypes):
        return ComponentInfo(built=True, module="_vendored_fa3_C", head_dims=(128,),
                             dtypes=dtypes, features=("paged", "split", "local"))

    with_fp16 = fa3(("bf16", "fp16", "e4m3"))
    assert _quick(3, with_fp16, call)  # fp16 accepted, and remembered
    old_id = id(with_fp16)
    del with_fp16
    gc.collect()
    # Look for a ComponentInfo without fp16 at the freed address: allocate until one
    # lands there (the first one does, when nothing holds the old object).
    keep = []
    for _ in range(1000):
        candidate = fa3(("bf16", "e4m3"))
        if id(candidate) == old_id:
            break
        keep.append(candidate)
    else:
        candidate = None
    if candidate is not None:
        assert not _quick(3, candidate, call), \
            "fp16 accepted for a build without fp16: the verdict of a freed ComponentInfo"
    else:
        # The old object is still alive somewhere (the verdict cache holds it): its
        # address cannot be reused, which is the fix. Check the verdict anyway.
        assert not _quick(3, fa3(("bf16", "e4m3")), call)
    assert isinstance(_full(3, fa3(("bf16", "e4m3")), call), Exception)
