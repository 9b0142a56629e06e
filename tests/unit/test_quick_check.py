"""The hot-path check (quick_check_varlen_call) against the full check.

The quick check may let through a call the full check refuses only where the refusal is
one the compiled op makes itself before it launches anything (flash_attn_varlen_func
then explains it with the full check); every other refusal it must leave to the full
check."""

from __future__ import annotations

import itertools

import pytest
import torch

from calls import descales, paged_call, varlen_call
from runtime_fakes import make_build
from vendored_flash_attn import flash_attn_varlen_func
from vendored_flash_attn.validation import check_varlen_call, quick_check_varlen_call


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
                            ("scheduler-int64", {"scheduler_metadata": torch.zeros(3, dtype=torch.int64)})):
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
    window = call.pop("window_size", (-1, -1))
    args = dict(q_v=None, dropout_p=0.0, causal=True, window=window, softcap=0.0, alibi_slopes=None,
                block_table=None, out=None, scheduler_metadata=None, q_descale=None, k_descale=None,
                v_descale=None, num_splits=0, s_aux=None, cp_world_size=1, cp_rank=0,
                cp_tot_seqused_k=None, cu_seqlens_k=None, seqused_k=None)
    args.update(call)
    return args


CASES = list(_mutations())

# Refusals the compiled ops make themselves before they allocate or launch anything
# (upstream's TORCH_CHECKs on dtypes, shapes and contiguity): the quick check leaves these
# to the op. Labels without the "varlen-"/"paged-" prefix.
OP_CHECKED = {"k-dtype", "cu-int64", "cu-short", "out-shape", "fp8-bad-descale",
              "fp8-f16-descale", "scheduler-int64", "block-rows", "block-12"}


def _quick(version, comp, args):
    return quick_check_varlen_call(
        version, comp, -1, args["q"].shape, args["v"].shape[-1], args["q"], args["k"], args["v"], args["max_seqlen_q"],
        args["cu_seqlens_q"], args["max_seqlen_k"], args["cu_seqlens_k"], args["seqused_k"],
        args["dropout_p"], args["causal"], args["window"], args["softcap"], args["block_table"],
        args["out"], args["scheduler_metadata"], args["q_descale"], args["k_descale"],
        args["v_descale"], args["num_splits"])


def _full(version, comp, args):
    try:
        return check_varlen_call(version, comp, "cpu", **args)
    except (ValueError, TypeError) as exc:
        return exc


@pytest.mark.parametrize("preset, version", list(itertools.product(("minimal", "full"), (2, 3))))
def test_quick_check_leaves_only_op_checked_refusals_to_the_op(preset, version):
    comp = make_build(preset).component(version)
    accepted = valid_accepted = 0
    for label, build in CASES:
        args = _full_args(build())
        if not _quick(version, comp, args):
            continue
        accepted += 1
        full = _full(version, comp, args)
        if isinstance(full, Exception):
            assert label.split("-", 1)[1] in OP_CHECKED, f"{label}: the quick check let through {full!r}"
        else:
            valid_accepted += 1
    # The common calls do take the quick path.
    assert valid_accepted >= 4, valid_accepted


@pytest.mark.parametrize("preset, version", list(itertools.product(("minimal", "full"), (2, 3))))
def test_what_the_op_refuses_is_explained_by_the_full_check(describe, fake_ops, preset, version):
    """Through flash_attn_varlen_func: a call the quick check passed on and the op refused
    raises the full check's error, chained to the op's."""
    describe(build=preset)
    comp = make_build(preset).component(version)
    explained = 0
    for label, build in CASES:
        if label.split("-", 1)[1] not in OP_CHECKED:
            continue
        call = build()
        args = _full_args(dict(call))
        full = _full(version, comp, args)
        if not isinstance(full, Exception):
            continue
        with pytest.raises(type(full)) as raised:
            flash_attn_varlen_func(**call, fa_version=version)
        assert str(raised.value) == str(full), label
        if _quick(version, comp, args):
            assert isinstance(raised.value.__cause__, RuntimeError), label  # the op's refusal
            explained += 1
    assert fake_ops.calls == []  # no kernel ran
    assert explained >= 3, explained


def test_an_op_error_on_a_valid_call_passes_through(describe, fake_ops, monkeypatch):
    import runtime_fakes

    describe(build="minimal")

    def out_of_memory(op, args):
        raise RuntimeError("CUDA out of memory (fake)")

    monkeypatch.setattr(runtime_fakes, "upstream_checks", out_of_memory)
    with pytest.raises(RuntimeError, match=r"^CUDA out of memory \(fake\)$"):
        flash_attn_varlen_func(**paged_call(), fa_version=3)
