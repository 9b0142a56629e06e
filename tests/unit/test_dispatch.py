"""The exact arguments handed to the ops, against fake ops with the upstream schemas.

The fake ops are defined from the package's copy of upstream's ``ops.def`` strings
(op_schemas.py) and bind the
interface's positional arguments to the schema's parameter names. The ``*_every_argument``
tests name the expected value of every parameter, with values chosen so that no two
parameters of the same type share one: two swapped positional arguments fail them.

That copy is upstream's, not an assumption of the code under test: every configure reads
the pinned upstream's registration sources and stops when they register another schema
(cmake/vfa_build/knobs/op_schemas.py), test_op_schemas.py fails until the pinned commit is recorded as
checked with these very schemas (so a pin bump fails on the CPU machine until the check ran
on its sources), and a GPU test compares them with the compiled modules.
"""

from __future__ import annotations

import pytest
import torch

from calls import descales, paged_call, varlen_call
from runtime_fakes import AMPERE, HOPPER, _arg_names
from vendored_flash_attn import flash_attn_varlen_func, get_scheduler_metadata, make_fp8_descales
from vendored_flash_attn.declaration.op_schemas import OP_SCHEMAS

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def same(a, b) -> bool:
    """The op saw this very tensor (same storage and layout), not a copy."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def assert_every_argument(op: str, got: dict, expected: dict) -> None:
    """``expected`` names every parameter of the op's schema; tensors must be the very
    tensors (``same``), everything else equal and of the same type (True is not 1)."""
    namespace = "_vendored_fa2_C" if op == "varlen_fwd" else "_vendored_fa3_C"
    names = _arg_names(OP_SCHEMAS[namespace, op])
    assert sorted(expected) == sorted(names), set(expected) ^ set(names)
    assert list(got) == names
    wrong = []
    for name in names:
        have, want = got[name], expected[name]
        if isinstance(want, torch.Tensor):
            ok = isinstance(have, torch.Tensor) and same(have, want)
        else:
            ok = type(have) is type(want) and have == want
        if not ok:
            wrong.append(f"{name}: got {have!r}, expected {want!r}")
    assert not wrong, "\n".join(wrong)


def test_fa3_every_argument_paged_fp8_sinks_cp(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = paged_call(FP8)
    q_descale, k_descale, v_descale = (torch.full((2, 2), x) for x in (0.5, 0.25, 2.0))
    out = torch.empty(6, 8, 128, dtype=BF16)
    sinks = torch.zeros(8, dtype=BF16)
    metadata = torch.zeros(9, dtype=torch.int32)  # not from get_scheduler_metadata: passed as is
    cp_tot = torch.tensor([40, 60], dtype=torch.int32)
    flash_attn_varlen_func(**call, out=out, softmax_scale=0.25, causal=True, softcap=7.5,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                           scheduler_metadata=metadata, num_splits=3, fa_version=3, s_aux=sinks,
                           cp_world_size=2, cp_rank=1, cp_tot_seqused_k=cp_tot)
    assert_every_argument("fwd", fake_ops.last("fwd"), dict(
        q=call["q"], k=call["k"], v=call["v"], k_new=None, v_new=None, q_v=None, out=out,
        cu_seqlens_q=call["cu_seqlens_q"], cu_seqlens_k=None, cu_seqlens_k_new=None,
        seqused_q=None, seqused_k=call["seqused_k"], max_seqlen_q=4, max_seqlen_k=20,
        page_table=call["block_table"], kv_batch_idx=None, leftpad_k=None, rotary_cos=None,
        rotary_sin=None, seqlens_rotary=None, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=0.25, is_causal=True, window_size_left=-1,
        window_size_right=-1, softcap=7.5, is_rotary_interleaved=True,
        scheduler_metadata=metadata, num_splits=3, pack_gqa=None, sm_margin=0, s_aux=sinks,
        cp_world_size=2, cp_rank=1, cp_tot_seqused_k=cp_tot))


def test_fa3_every_argument_varlen_q_v_window(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = varlen_call(d=64, dv=512)
    q_v = torch.randn(6, 8, 512).to(BF16)
    out = torch.empty(6, 8, 512, dtype=BF16)
    flash_attn_varlen_func(**call, q_v=q_v, out=out, causal=False, window_size=(5, 7),
                           softcap=2.5, num_splits=2, fa_version=3)
    assert_every_argument("fwd", fake_ops.last("fwd"), dict(
        q=call["q"], k=call["k"], v=call["v"], k_new=None, v_new=None, q_v=q_v, out=out,
        cu_seqlens_q=call["cu_seqlens_q"], cu_seqlens_k=call["cu_seqlens_k"],
        cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, max_seqlen_q=4, max_seqlen_k=7,
        page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
        seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None,
        softmax_scale=64 ** -0.5, is_causal=False, window_size_left=5, window_size_right=7,
        softcap=2.5, is_rotary_interleaved=True, scheduler_metadata=None, num_splits=2,
        pack_gqa=None, sm_margin=0, s_aux=None, cp_world_size=1, cp_rank=0,
        cp_tot_seqused_k=None))


@pytest.mark.parametrize("paged", [False, True], ids=["varlen", "paged"])
def test_fa2_every_argument(describe, fake_ops, paged):
    describe(caps=(AMPERE,))
    call = paged_call() if paged else varlen_call()
    out = torch.empty(6, 8, 128, dtype=BF16)
    alibi = torch.rand(8)
    flash_attn_varlen_func(**call, out=out, softmax_scale=0.25, causal=True, window_size=(5, 7),
                           softcap=2.5, alibi_slopes=alibi, num_splits=1)
    assert_every_argument("varlen_fwd", fake_ops.last("varlen_fwd"), dict(
        q=call["q"], k=call["k"], v=call["v"], out=out, cu_seqlens_q=call["cu_seqlens_q"],
        # paged: cu_seqlens_q stands in for the unused cu_seqlens_k (interface.py)
        cu_seqlens_k=call["cu_seqlens_q"] if paged else call["cu_seqlens_k"],
        seqused_k=call["seqused_k"] if paged else None, leftpad_k=None,
        block_table=call["block_table"] if paged else None, alibi_slopes=alibi,
        max_seqlen_q=4, max_seqlen_k=20 if paged else 7, p_dropout=0.0, softmax_scale=0.25,
        zero_tensors=False, is_causal=True, window_size_left=5, window_size_right=7,
        softcap=2.5, return_softmax=False, num_splits=1, gen=None))


def test_get_scheduler_metadata_every_argument(describe, fake_ops):
    describe(caps=(HOPPER,))
    seqlens = torch.tensor([5, 20], dtype=torch.int32)
    cu_q, cu_k_new = (torch.tensor([0, 2, 6], dtype=torch.int32) for _ in range(2))
    leftpad = torch.tensor([0, 1], dtype=torch.int32)
    get_scheduler_metadata(2, 4, 20, 8, 1, 192, seqlens, qkv_dtype=BF16, headdim_v=128,
                           cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_k_new, cache_leftpad=leftpad,
                           page_size=16, max_seqlen_k_new=3, causal=True, window_size=(127, 5),
                           has_softcap=False, num_splits=6, pack_gqa=None, sm_margin=9)
    assert_every_argument("get_scheduler_metadata", fake_ops.last("get_scheduler_metadata"), dict(
        batch_size=2, max_seqlen_q=4, max_seqlen_k=20, num_heads=8, num_heads_k=1, headdim=192,
        headdim_v=128, qkv_dtype=BF16, seqused_k=seqlens, cu_seqlens_q=cu_q, cu_seqlens_k=None,
        cu_seqlens_k_new=cu_k_new, seqused_q=None, leftpad_k=leftpad, page_size=16,
        max_seqlen_k_new=3, is_causal=True, window_size_left=127, window_size_right=5,
        has_softcap=False, num_splits=6, pack_gqa=None, sm_margin=9))


def test_fa2_varlen(describe, fake_ops):
    describe(caps=(AMPERE,))
    call = varlen_call()
    out = torch.empty(6, 8, 128, dtype=BF16)
    alibi = torch.rand(8)
    result, lse = flash_attn_varlen_func(**call, out=out, causal=True, window_size=[63, 0], softcap=5.0,
                                         alibi_slopes=alibi, return_softmax_lse=True)
    args = fake_ops.last("varlen_fwd")
    for name in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"):
        assert same(args[name], call[name]), name
    assert same(args["out"], out) and same(args["alibi_slopes"], alibi)
    assert args["seqused_k"] is None and args["leftpad_k"] is None and args["block_table"] is None
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (4, 7)
    assert args["p_dropout"] == 0.0 and args["zero_tensors"] is False
    assert args["softmax_scale"] == pytest.approx(128 ** -0.5)
    assert args["is_causal"] is True
    assert (args["window_size_left"], args["window_size_right"]) == (63, 0)
    assert args["softcap"] == 5.0 and args["return_softmax"] is False
    assert args["num_splits"] == 0 and args["gen"] is None
    assert result.shape == (6, 8, 128) and lse.shape == (8, 6)


def test_fa2_paged_gets_defined_cu_seqlens_k(describe, fake_ops):
    describe(caps=(AMPERE,))
    call = paged_call()
    flash_attn_varlen_func(**call, softmax_scale=0.125, num_splits=1)
    args = fake_ops.last("varlen_fwd")
    assert same(args["block_table"], call["block_table"]) and same(args["seqused_k"], call["seqused_k"])
    # FA2 reads cu_seqlens_k[b] and [b+1] even when paged; it must be defined memory.
    cu_k = args["cu_seqlens_k"]
    assert cu_k.dtype == torch.int32 and cu_k.shape == (3,) and cu_k.is_contiguous()
    # It is cu_seqlens_q itself: initialised, and no allocation or kernel per call.
    assert cu_k is call["cu_seqlens_q"] or same(cu_k, call["cu_seqlens_q"])
    assert args["softmax_scale"] == 0.125 and args["num_splits"] == 1
    assert (args["window_size_left"], args["window_size_right"]) == (-1, -1)


def test_fa2_ignores_descales_of_16bit_inputs(describe, fake_ops):
    # vLLM passes k/v descales on every call, FP8 or not; for bf16 data they mean nothing:
    # the call is accepted and the op gets exactly what it gets without them.
    describe(caps=(AMPERE,))
    call = paged_call()
    flash_attn_varlen_func(**call, fa_version=2)
    plain = fake_ops.last("varlen_fwd")
    flash_attn_varlen_func(**call, **descales(), fa_version=2)
    with_descales = fake_ops.last("varlen_fwd")
    assert list(with_descales) == list(plain)
    for name, value in plain.items():
        other = with_descales[name]
        assert (other is value if isinstance(value, torch.Tensor) or value is None
                else (type(other), other) == (type(value), value)), name


def test_fa3_paged(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = paged_call()
    sinks = torch.zeros(8, dtype=BF16)
    metadata = torch.zeros(9, dtype=torch.int32)
    out = flash_attn_varlen_func(**call, causal=True, window_size=(-1, -1), softcap=0.0, s_aux=sinks,
                                 scheduler_metadata=metadata, num_splits=3)
    args = fake_ops.last("fwd")
    for name in ("q", "k", "v", "cu_seqlens_q", "seqused_k"):
        assert same(args[name], call[name]), name
    assert same(args["page_table"], call["block_table"])
    assert same(args["s_aux"], sinks) and same(args["scheduler_metadata"], metadata)
    for name in ("k_new", "v_new", "q_v", "out", "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q",
                 "kv_batch_idx", "leftpad_k", "rotary_cos", "rotary_sin", "seqlens_rotary",
                 "q_descale", "k_descale", "v_descale", "pack_gqa", "cp_tot_seqused_k"):
        assert args[name] is None, name
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (4, 20)
    assert args["softmax_scale"] == pytest.approx(128 ** -0.5) and args["is_causal"] is True
    assert (args["window_size_left"], args["window_size_right"]) == (-1, -1)
    assert args["softcap"] == 0.0 and args["is_rotary_interleaved"] is True
    assert args["num_splits"] == 3 and args["sm_margin"] == 0
    assert (args["cp_world_size"], args["cp_rank"]) == (1, 0)
    assert isinstance(out, torch.Tensor) and out.shape == (6, 8, 128)


def test_fa3_varlen_hdimdiff(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = varlen_call(d=192, dv=128)
    out, lse = flash_attn_varlen_func(**call, return_softmax_lse=True)
    args = fake_ops.last("fwd")
    assert same(args["cu_seqlens_k"], call["cu_seqlens_k"]) and args["seqused_k"] is None
    assert args["page_table"] is None
    assert args["softmax_scale"] == pytest.approx(192 ** -0.5)
    assert out.shape == (6, 8, 128)


def test_fa3_fp8_passes_descales_with_their_strides(describe, fake_ops):
    describe(caps=(HOPPER,))
    call = paged_call(FP8)
    q_descale, k_descale, v_descale = make_fp8_descales(None, torch.tensor(0.5), torch.tensor([1.0, 2.0]),
                                                        num_seqs=2, num_kv_heads=2)
    out = torch.empty(6, 8, 128, dtype=BF16)
    flash_attn_varlen_func(**call, out=out, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    args = fake_ops.last("fwd")
    assert args["q"].dtype == FP8 and same(args["out"], out)
    assert same(args["q_descale"], q_descale) and args["q_descale"].stride() == (0, 0)
    assert same(args["k_descale"], k_descale)
    assert same(args["v_descale"], v_descale) and args["v_descale"].stride() == (0, 1)


def test_fa3_fp8_with_only_some_descales(describe, fake_ops):
    describe(caps=(HOPPER,))
    d = descales()
    flash_attn_varlen_func(**paged_call(FP8), k_descale=d["k_descale"])
    args = fake_ops.last("fwd")
    assert args["q_descale"] is None and args["v_descale"] is None
    assert same(args["k_descale"], d["k_descale"])


def test_fa3_drops_descales_of_16bit_inputs(describe, fake_ops):
    describe(caps=(HOPPER,))
    flash_attn_varlen_func(**paged_call(), **descales())
    args = fake_ops.last("fwd")
    assert args["q_descale"] is None and args["k_descale"] is None and args["v_descale"] is None


@pytest.mark.parametrize("caps, kwargs, op", [
    ((HOPPER,), {}, "fwd"),
    ((AMPERE,), {}, "varlen_fwd"),
    ((HOPPER,), {"alibi_slopes": torch.rand(8)}, "varlen_fwd"),
])
def test_fa_version_none_asks_the_selector(describe, fake_ops, caps, kwargs, op):
    describe(caps=caps)
    with pytest.warns() if kwargs else _nothing():
        flash_attn_varlen_func(**paged_call(), **kwargs)
    assert [name for name, _ in fake_ops.calls] == [op]


def test_env_override_applies_to_calls(describe, fake_ops):
    describe(caps=(HOPPER,), env={"VLLM_FLASH_ATTN_VERSION": "2"})
    flash_attn_varlen_func(**paged_call())
    assert [name for name, _ in fake_ops.calls] == ["varlen_fwd"]


def test_strided_qkv_are_made_contiguous_like_upstream(describe, fake_ops):
    describe(caps=(AMPERE,))
    call = varlen_call()
    call["q"] = torch.randn(6, 8, 256, dtype=BF16)[..., ::2]
    flash_attn_varlen_func(**call)
    q = fake_ops.last("varlen_fwd")["q"]
    assert q.stride(-1) == 1 and torch.equal(q, call["q"])


def test_get_scheduler_metadata(describe, fake_ops):
    describe(caps=(HOPPER,))
    seqlens = torch.tensor([5, 20], dtype=torch.int32)
    cu_q = torch.tensor([0, 2, 6], dtype=torch.int32)
    result = get_scheduler_metadata(2, 4, 20, 8, 2, 128, seqlens, qkv_dtype=FP8, cu_seqlens_q=cu_q,
                                    page_size=16, causal=True, window_size=(127, 0), has_softcap=True,
                                    num_splits=2, pack_gqa=True, sm_margin=4)
    args = fake_ops.last("get_scheduler_metadata")
    assert (args["batch_size"], args["max_seqlen_q"], args["max_seqlen_k"], args["num_heads"],
            args["num_heads_k"], args["headdim"], args["headdim_v"]) == (2, 4, 20, 8, 2, 128, 128)
    assert args["qkv_dtype"] == FP8
    assert same(args["seqused_k"], seqlens) and same(args["cu_seqlens_q"], cu_q)
    assert args["cu_seqlens_k"] is None and args["seqused_q"] is None and args["leftpad_k"] is None
    assert args["page_size"] == 16 and args["max_seqlen_k_new"] == 0 and args["is_causal"] is True
    assert (args["window_size_left"], args["window_size_right"]) == (127, 0)
    assert args["has_softcap"] is True and args["num_splits"] == 2
    assert args["pack_gqa"] is True and args["sm_margin"] == 4
    assert result.dtype == torch.int32


class _nothing:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# --- the quick path (interface._quick) hands the op what the full path does ------------------

def _same_call(a: dict, b: dict) -> list[str]:
    """The names whose values differ: tensors must be the very same objects, the rest equal
    and of the same type."""
    assert list(a) == list(b)
    return [name for name in a if not (
        a[name] is b[name] if isinstance(a[name], torch.Tensor) or a[name] is None
        else (type(a[name]), a[name]) == (type(b[name]), b[name]))]


def _quick_calls():
    """Common calls (the quick path's), each with something the op's arguments are made from."""
    out = torch.empty(6, 8, 128, dtype=BF16)
    return [
        ("paged-vllm", dict(paged_call(), causal=True, softcap=0, window_size=(-1, -1), softmax_scale=0.125,
                            num_splits=0, out=out, **descales())),
        ("varlen-window", dict(varlen_call(), causal=False, window_size=[63, 5], softcap=2.5,
                               return_softmax_lse=True)),
        ("paged-splits", dict(paged_call(), causal=True, num_splits=3, max_seqlen_q=1)),
        ("varlen-hdimdiff", dict(varlen_call(d=192, dv=128), causal=True)),
        ("paged-fp8", dict(paged_call(FP8), causal=True, out=out, **descales())),
        ("paged-mqa", dict(paged_call(kv_heads=1), causal=True, softmax_scale=0.3, return_softmax_lse=True)),
    ]


@pytest.mark.parametrize("caps, fa_version", [((HOPPER,), 3), ((HOPPER,), None), ((AMPERE,), 2)],
                         ids=["fa3", "selector", "fa2"])
def test_the_quick_path_hands_the_op_what_the_full_path_does(describe, fake_ops, monkeypatch, caps, fa_version):
    """Each common call twice: the first resolves its kind on the full path (call object, shared
    checks, the adapter's forward), the second takes the quick path (the full check not asked):
    the op sees the same arguments, and the caller the same result."""
    from vendored_flash_attn import interface

    describe(caps=caps)
    full = []
    real = interface.check_varlen_call
    monkeypatch.setattr(interface, "check_varlen_call", lambda *a, **k: full.append(a) or real(*a, **k))
    taken = 0
    for label, call in _quick_calls():
        if caps == (AMPERE,) and (call["q"].dtype == FP8 or call.get("num_splits", 0) > 1
                                  or call["q"].shape[-1] != call["v"].shape[-1]):
            continue  # not FA2's
        results = []
        for _ in range(2):
            full.clear()
            results.append(flash_attn_varlen_func(**call, fa_version=fa_version))
        assert full == [], f"{label}: the second call took the full path"
        (op_a, first), (op_b, second) = fake_ops.calls[-2:]
        assert op_a == op_b and _same_call(first, second) == [], label
        assert type(results[0]) is type(results[1]), label
        taken += 1
    assert taken >= 3


def test_the_quick_path_reads_the_version_override_on_every_call(describe, fake_ops):
    """VLLM_FLASH_ATTN_VERSION is part of the kind of a fa_version=None call: set after calls
    that took the quick path, the next call goes to the family it names."""
    machine = describe(caps=(HOPPER,))
    for _ in range(3):
        flash_attn_varlen_func(**paged_call())
    machine.env["VLLM_FLASH_ATTN_VERSION"] = "2"
    for _ in range(2):
        flash_attn_varlen_func(**paged_call())
    assert [name for name, _ in fake_ops.calls] == ["fwd"] * 3 + ["varlen_fwd"] * 2


def test_the_machines_lookup_of_the_override_follows_os_environ(monkeypatch):
    """What the kinds of fa_version=None calls are keyed on, on the real machine
    (Environment.getenv_lookup): equal answers exactly when the variable's values are."""
    from vendored_flash_attn.selection.environment import SystemEnvironment

    lookup, key = SystemEnvironment().getenv_lookup("VLLM_FLASH_ATTN_VERSION")
    monkeypatch.delenv("VLLM_FLASH_ATTN_VERSION", raising=False)
    assert lookup(key) is None
    answers = []
    for value in ("2", "3", "2"):
        monkeypatch.setenv("VLLM_FLASH_ATTN_VERSION", value)
        answers.append(lookup(key))
    assert answers[0] != answers[1] and answers[0] == answers[2] and None not in answers
    monkeypatch.delenv("VLLM_FLASH_ATTN_VERSION")
    assert lookup(key) is None


def test_the_resolutions_are_bounded(describe, fake_ops, monkeypatch):
    """interface._resolved holds at most _RESOLVED_MAX kinds of call (a caller cycling through
    odd shapes must not grow it without end), and calls past the bound still run."""
    from vendored_flash_attn import interface

    describe(caps=(HOPPER,))
    monkeypatch.setattr(interface, "_RESOLVED_MAX", 3)
    interface._resolved.clear()
    sizes = []
    for d in (64, 96, 128, 192, 256, 64, 96):
        flash_attn_varlen_func(**varlen_call(d=d), fa_version=3)
        sizes.append(len(interface._resolved))
    assert max(sizes) <= 3 and len(fake_ops.calls) == 7, sizes
