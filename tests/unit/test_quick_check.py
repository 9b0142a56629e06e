"""The interface's quick path (interface._quick) must never accept a call the full check
(validation.check_varlen_call) refuses, and must take the common calls of a serving engine once
their kind of call is resolved."""

from __future__ import annotations

import itertools

import pytest
import torch

from calls import descales, paged_call, varlen_call
from runtime_fakes import FA4_RECORD, HOPPER, make_build
from vendored_flash_attn.families.fa4 import adapter as fa4
from vendored_flash_attn import flash_attn_varlen_func, interface
from vendored_flash_attn.call.arguments import VarlenCall
from vendored_flash_attn.errors import FlashAttnInputError, FlashAttnUnavailableError
from vendored_flash_attn.declaration.families import registry
from vendored_flash_attn.call.validation import check_varlen_call, window_tuple


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

        def q_on_meta(kind=kind):
            call = base(kind)
            call["q"] = torch.empty(call["q"].shape, dtype=call["q"].dtype, device="meta")
            return call
        yield f"{kind}-meta-q", q_on_meta

        for name, extra in (("softcap", {"softcap": 30.0}), ("window", {"window_size": (64, 0)}),
                            ("splits", {"num_splits": 4}), ("max-seqlen-float", {"max_seqlen_q": 4.0}),
                            ("dropout", {"dropout_p": 0.1}),
                            ("scheduler", {"scheduler_metadata": torch.zeros(3, dtype=torch.int32)}),
                            ("scheduler-int64", {"scheduler_metadata": torch.zeros(3, dtype=torch.int64)}),
                            # what only some families take: the quick path leaves each to the full one
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


def _full(version, comp, args):
    try:
        return check_varlen_call(registry()[version], comp, "cpu", *args)
    except (ValueError, TypeError) as exc:
        return exc


@pytest.mark.parametrize("preset, version", list(itertools.product(("minimal", "full"), (2, 3, None))) + [("full", 4)])
def test_the_quick_path_accepts_nothing_the_full_check_refuses(describe, fake_ops, fa4_kernels, monkeypatch,
                                                                preset, version):
    """Each call of the corpus twice through the public function, after valid calls of the two
    common shapes (their kinds resolved, as in an engine that ran fine until this call): a call
    of one of those kinds may take the quick path at once, one of another kind is resolved on the
    full path by its first call (which refuses it if it is wrong), and its second call may take
    the quick path. Where a call does (the full check was not asked, a kernel ran), the full
    check must accept it, for the family whose kernels ran."""
    build = make_build(preset, fa4=FA4_RECORD)
    describe(caps=(HOPPER,), build=build)
    asked = []
    real = interface.check_varlen_call
    monkeypatch.setattr(interface, "check_varlen_call", lambda *a, **k: asked.append(a[0]) or real(*a, **k))
    ops = {"varlen_fwd": 2, "fwd": 3}
    accepted = refused = 0
    for label, make in CASES:
        call = {"causal": True, **make()}
        interface._resolved.clear()
        for valid in (varlen_call(), paged_call()):  # an engine's calls before it: their kinds resolved
            flash_attn_varlen_func(**valid, causal=True, fa_version=version)
        for attempt in range(2):
            asked.clear()
            ran_before = (len(fake_ops.calls), len(fa4_kernels))
            fa4_refused = False
            try:
                flash_attn_varlen_func(**call, fa_version=version)
            except fa4.FA4Unsupported:
                fa4_refused = True  # FA4's own rules, after the shared checks or the quick path
            except (FlashAttnInputError, FlashAttnUnavailableError):
                pass  # refused: its message is test_validation's
            if asked:  # the full path: its verdict stands
                refused += attempt == 1 and isinstance(_full(asked[0].version, _comp(build, asked[0]),
                                                             _full_args(call)), Exception)
                continue
            if fa4_refused or ran_before[1] < len(fa4_kernels):
                family = registry()[4]
            elif ran_before[0] < len(fake_ops.calls):
                family = registry()[ops[fake_ops.calls[-1][0]]]
            else:
                continue  # refused before the checks: no family for it
            accepted += 1
            full = _full(family.version, _comp(build, family), _full_args(call))
            assert not isinstance(full, Exception), \
                f"{label}: the quick path accepted what the full check refuses: {full!r}"
    # The common calls do take the quick path, and the corpus does break calls.
    assert accepted >= 8, accepted
    assert refused >= 20, refused


def _comp(build, family):
    return build.component(family.version) if family.record_key is not None else None


# --- the quick path is taken -------------------------------------------------------------

def _common_calls(fp8: bool):
    """The shapes a serving engine sends on every layer: packed prefill, paged decode
    and chunked prefill, with and without out=, GQA, a sliding window, and with the arguments
    vLLM passes on every call (softcap=0 as an int, window (-1, -1), bf16 descales, num_splits);
    FP8 paged on Hopper."""
    calls = [dict(varlen_call(), causal=True),
             dict(paged_call(), causal=True),
             dict(paged_call(kv_heads=1), causal=True, out=torch.empty(6, 8, 128, dtype=torch.bfloat16)),
             dict(varlen_call(), causal=True, window_size=(63, 0)),
             dict(paged_call(), causal=True, softcap=0, window_size=(-1, -1), softmax_scale=0.125, num_splits=0,
                  out=torch.empty(6, 8, 128, dtype=torch.bfloat16), **descales())]
    if fp8:
        calls.append(dict(paged_call(torch.float8_e4m3fn), causal=True, **descales()))
    return calls


@pytest.mark.parametrize("caps, fa_version", [((9, 0), 3), ((9, 0), None), ((8, 0), 2), ((8, 0), None)],
                         ids=["fa3", "hopper-selector", "fa2", "ampere-selector"])
def test_common_calls_skip_the_full_check(describe, fake_ops, monkeypatch, caps, fa_version):
    """The quick path is what keeps the per-call cost low: once their kind is resolved (the
    first call of each, on the full path), the common calls must not reach check_varlen_call
    (spied on), and an unusual call must, every time (the spy works)."""
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
    full_checks.clear()
    for call in calls:
        flash_attn_varlen_func(**call, fa_version=fa_version)
    assert full_checks == [], f"{len(full_checks)} of {len(calls)} common calls took the full check"
    assert len(fake_ops.calls) == 2 * len(calls)
    unusual = dict(alibi_slopes=torch.rand(8)) if caps == (8, 0) else dict(
        s_aux=torch.zeros(8, dtype=torch.bfloat16))
    for _ in range(2):
        flash_attn_varlen_func(**varlen_call(), **unusual, fa_version=fa_version)
    assert len(full_checks) == 2
