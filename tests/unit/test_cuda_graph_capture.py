"""What a call does inside a CUDA graph capture, checked on the CPU with fake ops.

vLLM captures its decode steps in CUDA graphs. A call that syncs the host (reads a tensor's
value) cannot be captured at all, and one whose family cannot be replayed must be refused
under capture instead of giving a graph that replays wrongly. On the GPU,
tests/gpu/test_cuda_graphs_gpu.py captures and replays each family the wheel holds under
``torch.cuda.set_sync_debug_mode("error")``; here, without a GPU:

* no host read: every call shape vLLM sends runs under a TorchFunctionMode that fails on any
  method that copies a tensor's values to the host (``.item()``, ``.tolist()``, ``bool()``,
  ``.cpu()``, ...), the same operations the sync debug mode catches on a CUDA tensor;
* the refusal under capture (the interface's ``_stream_capturing`` made to say True): the
  debug checks, which do read values, and a family whose declaration says
  ``call.cuda_graphs: false``; and that the common path does not even ask whether the stream
  is capturing (that would cost every call).
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch.overrides import TorchFunctionMode

from calls import descales, paged_call, varlen_call
from runtime_fakes import AMPERE, FA4_RECORD, HOPPER, make_build
from vendored_flash_attn import (FlashAttnCaptureError, flash_attn_varlen_func, get_scheduler_metadata,
                                 interface)
from vendored_flash_attn.declaration import knob_values as declaration, families

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn

# Tensor methods that hand a value to the host: on a CUDA tensor each one synchronises the
# device (torch.cuda.set_sync_debug_mode("error") raises on them) and breaks a capture.
HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
              "__complex__", "__len__", "__iter__", "nonzero", "any", "all", "equal", "__array__"}


class HostReadGuard(TorchFunctionMode):
    """Fails on any method of HOST_READS, and on .to()/.copy_() towards the CPU."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in HOST_READS:
            self.seen.append(name)
            raise AssertionError(f"host read in the call path: Tensor.{name}")
        if name == "to" and any(a == "cpu" or a == torch.device("cpu") for a in args[1:]):
            self.seen.append("to(cpu)")
            raise AssertionError("host copy in the call path: Tensor.to('cpu')")
        return func(*args, **kwargs)


def _vllm_decode_call(dtype=BF16):
    """The call vLLM's FlashAttention backend makes on a paged decode/chunked step: out=,
    descales expanded from per-tensor scales on every call, causal, num_splits given."""
    call = paged_call(dtype)
    scale = torch.ones((), dtype=torch.float32)
    shape = (2, 2)
    call.update(out=torch.empty(6, 8, 128, dtype=BF16), causal=True, softmax_scale=128 ** -0.5,
                window_size=[-1, -1], softcap=0.0, alibi_slopes=None, num_splits=0, s_aux=None,
                q_descale=scale.expand(shape), k_descale=scale.expand(shape), v_descale=scale.expand(shape))
    return call


def test_the_guard_catches_a_host_read():
    """The mechanism the next test relies on: a .item() or a bool() of a tensor is caught."""
    t = torch.tensor([3], dtype=torch.int32)
    for read in (lambda: t.item(), lambda: bool(t), lambda: t.tolist(), lambda: t.to("cpu"), lambda: int(t)):
        with pytest.raises(AssertionError, match="host"):
            with HostReadGuard():
                read()


@pytest.mark.parametrize("fa_version, caps, build", [(3, HOPPER, "full"), (None, HOPPER, "full"),
                                                     (2, AMPERE, "full"), (None, AMPERE, "minimal")])
def test_no_host_read_in_the_call_path(describe, fake_ops, fa_version, caps, build):
    describe(caps=(caps,), build=build)
    calls = [_vllm_decode_call(), dict(varlen_call(), causal=True),
             dict(paged_call(), causal=True, num_splits=1)]
    if caps == HOPPER:
        calls.append(_vllm_decode_call(FP8) | dict(q=paged_call(FP8)["q"]))
        calls.append(dict(paged_call(FP8), causal=True, **descales()))
        sched = paged_call()
        sched["scheduler_metadata"] = get_scheduler_metadata(
            2, 4, 20, 8, 2, 128, sched["seqused_k"], cu_seqlens_q=sched["cu_seqlens_q"], page_size=16,
            causal=True)
        calls.append(dict(sched, causal=True))
    for call in calls:
        flash_attn_varlen_func(**call, fa_version=fa_version)  # resolve first: a one-time cost
    fake_ops.calls.clear()
    with HostReadGuard() as guard:
        for call in calls:
            flash_attn_varlen_func(**call, fa_version=fa_version)
    assert guard.seen == []
    assert len([n for n, _ in fake_ops.calls if n != "get_scheduler_metadata"]) == len(calls)


def test_no_host_read_in_fa4s_call_path(describe, monkeypatch):
    """FA4's adapter (fa4/adapter.py), its kernels replaced by a recording stand-in."""
    from vendored_flash_attn.families.fa4 import adapter as fa4

    describe(caps=(HOPPER,), build=make_build("minimal", fa4=FA4_RECORD))
    seen = []

    def fwd(q, k, v, **kwargs):
        seen.append(kwargs)
        return kwargs["out"], None, None, None

    fake = types.SimpleNamespace(_flash_attn_fwd=fwd)
    monkeypatch.setattr(fa4, "_loaded", fa4.Loaded(fake, {}))
    call = _vllm_decode_call()
    flash_attn_varlen_func(**call, fa_version=4)
    with HostReadGuard() as guard:
        flash_attn_varlen_func(**call, fa_version=4)
    assert guard.seen == [] and len(seen) == 2


def test_debug_checks_are_refused_under_capture(describe, fake_ops, monkeypatch):
    """VFA_DEBUG_CHECKS=1 copies index tensors to the host: under capture that is a clear
    refusal before anything is enqueued, not the driver's capture error; outside a capture
    the same call runs (and is checked)."""
    describe(caps=(HOPPER,), env={"VFA_DEBUG_CHECKS": "1"})
    capturing = [True]
    monkeypatch.setattr(interface, "_stream_capturing", lambda q: capturing[0])
    call = dict(paged_call(), causal=True)
    with pytest.raises(FlashAttnCaptureError, match=r"VFA_DEBUG_CHECKS=1 reads index tensors on the host.*unset "
                                                    r"VFA_DEBUG_CHECKS for the captured calls"):
        flash_attn_varlen_func(**call, fa_version=3)
    assert fake_ops.calls == []
    capturing[0] = False
    flash_attn_varlen_func(**call, fa_version=3)
    assert [n for n, _ in fake_ops.calls] == ["fwd"]
    capturing[0] = True  # the kind is resolved now: still asked, still refused
    with pytest.raises(FlashAttnCaptureError, match=r"VFA_DEBUG_CHECKS=1 reads index tensors on the host"):
        flash_attn_varlen_func(**call, fa_version=3)
    assert len(fake_ops.calls) == 1


@pytest.fixture
def fa2_not_capturable():
    data = copy.deepcopy(declaration.load())
    data["families"]["fa2"].setdefault("call", {}).update(
        cuda_graphs=False, cuda_graphs_why="its split kernels pick their split count on the host")
    previous = families.set_registry(families.parse(data))
    interface._resolved.clear()
    yield
    families.set_registry(previous)
    interface._resolved.clear()


@pytest.mark.parametrize("fa_version", [2, None])
def test_a_family_declared_not_capturable_is_refused_under_capture(describe, fake_ops, monkeypatch,
                                                                   fa2_not_capturable, fa_version):
    describe(caps=(AMPERE,))
    capturing = [True]
    monkeypatch.setattr(interface, "_stream_capturing", lambda q: capturing[0])
    call = dict(paged_call(), causal=True)
    with pytest.raises(FlashAttnCaptureError,
                       match=r"FA2 cannot be captured in a CUDA graph: its split kernels pick their split count "
                             r"on the host; run it eagerly or use FA3 or FA4"):
        flash_attn_varlen_func(**call, fa_version=fa_version)
    assert fake_ops.calls == []
    capturing[0] = False
    for _ in range(2):
        flash_attn_varlen_func(**call, fa_version=fa_version)
    assert [n for n, _ in fake_ops.calls] == ["varlen_fwd"] * 2
    capturing[0] = True  # after calls of its kind ran eagerly: still asked, still refused
    with pytest.raises(FlashAttnCaptureError, match=r"FA2 cannot be captured in a CUDA graph"):
        flash_attn_varlen_func(**call, fa_version=fa_version)
    assert len(fake_ops.calls) == 2


def test_the_common_path_does_not_ask_about_capture(describe, fake_ops, monkeypatch):
    """Capturable families with the debug checks off: no query per call (it would cost every
    call of every layer, and a query of the driver)."""
    def asked(q):
        raise AssertionError("the interface asked whether the stream is capturing")

    monkeypatch.setattr(interface, "_stream_capturing", asked)
    describe(caps=(HOPPER,))
    for fa_version in (3, None, 2):
        flash_attn_varlen_func(**_vllm_decode_call(), fa_version=fa_version)
    assert len(fake_ops.calls) == 3


def test_every_declared_family_is_capturable():
    """What tests/gpu/test_cuda_graphs_gpu.py holds the wheel's families to: a family that
    stops being capturable says so in its declaration (and that test then checks the refusal)."""
    assert [f.name for f in families.registry() if not f.call.cuda_graphs] == []


def test_the_declaration_needs_a_reason_for_an_uncapturable_family():
    data = copy.deepcopy(declaration.load())
    data["families"]["fa4"].setdefault("call", {})["cuda_graphs"] = False
    with pytest.raises(families.FamilyDeclarationError, match="cuda_graphs_why"):
        families.parse(data)
    data["families"]["fa4"]["call"]["cuda_graphs"] = "no"
    with pytest.raises(families.FamilyDeclarationError, match="true or false"):
        families.parse(data)
