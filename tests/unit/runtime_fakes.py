"""Fakes for the CPU unit tests of the runtime (conftest.py exposes the fixtures).

* ``describe(...)``: install a StaticEnvironment (a described machine: GPUs, build
  info, module import results, env vars); the real machine comes back after the test.
* ``fake_ops``: ops registered with torch.library under the real namespaces
  ``_vendored_fa2_C`` / ``_vendored_fa3_C`` with the upstream schemas and CPU kernels that
  record their arguments, so dispatch is tested without compiled modules.
"""

from __future__ import annotations

import re

import pytest
import torch

from vendored_flash_attn.build_info import BuildInfo
from vendored_flash_attn.environment import StaticEnvironment, set_environment

FULL = {
    "fa2": {"built": True, "module": "_vendored_fa2_C", "gencode": ["sm_80", "compute_80"],
            "head_dims": [32, 64, 96, 128, 192, 256], "dtypes": ["bf16", "fp16"],
            "features": ["sparse"]},
    "fa3": {"built": True, "module": "_vendored_fa3_C", "gencode": ["sm_90a"],
            "head_dims": [64, 96, 128, 192, 256], "dtypes": ["bf16", "fp16", "e4m3"],
            "features": ["paged", "split", "softcap", "local", "hdimdiff"]},
}
MINIMAL = {
    "fa2": {"built": True, "module": "_vendored_fa2_C", "gencode": ["sm_80", "compute_80"],
            "head_dims": [128], "dtypes": ["bf16"], "features": []},
    "fa3": {"built": True, "module": "_vendored_fa3_C", "gencode": ["sm_90a"],
            "head_dims": [128], "dtypes": ["bf16", "e4m3"], "features": ["paged", "split", "local"]},
}


def make_build(preset: str = "full", fa2: dict | None = None, fa3: dict | None = None, **more) -> BuildInfo:
    """A BuildInfo like CMake writes; ``fa2``/``fa3`` override fields of the preset,
    ``more`` adds top-level fields (options, unknown_settings, ...)."""
    base = {"full": FULL, "minimal": MINIMAL}[preset]
    data = {
        "schema": 1, "preset": preset,
        "upstream": {"commit": "617264c1c7955c9e84817654ebeedff069f3c5f1",
                     "pinned_commit": "617264c1c7955c9e84817654ebeedff069f3c5f1", "matches_pin": True},
        "cutlass": {"commit": "62750a2b75c802660e4894434dc55e839f322277", "matches_pin": True},
        "fa2": {**base["fa2"], **(fa2 or {})},
        "fa3": {**base["fa3"], **(fa3 or {})},
        "torch": {"version": "2.14.1"}, "cuda": {"version": "13.0"},
        "compiler_cache": {"launcher": "sccache", "enabled": True},
        **more,
    }
    return BuildInfo.from_dict(data)


HOPPER, AMPERE, ADA, BLACKWELL, BLACKWELL_12, TURING = (9, 0), (8, 0), (8, 9), (10, 0), (12, 0), (7, 5)


@pytest.fixture(autouse=True)
def _real_machine_after_test():
    yield
    set_environment(None)


@pytest.fixture
def describe():
    """describe(caps=(HOPPER,), build=make_build(), module_errors={}, env={}, device_type="cpu")."""

    def install(caps=(HOPPER,), build="full", module_errors=None, env=None, device_type="cpu"):
        if build == "full" or build == "minimal":
            build = make_build(build)
        machine = StaticEnvironment(build=build, capabilities=tuple(caps),
                                    module_errors=dict(module_errors or {}), env=dict(env or {}),
                                    device_type=device_type)
        set_environment(machine)
        return machine

    return install


# Schemas as the upstream modules register them (ops.def strings).
FA2_VARLEN_FWD = (
    "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, "
    "int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, "
    "bool is_causal, int window_size_left, int window_size_right, float softcap, bool return_softmax, "
    "int num_splits, Tensor? gen) -> Tensor[]")
FA3_FWD = (
    "fwd(Tensor!  q, Tensor   k, Tensor   v, Tensor?  k_new, Tensor?  v_new, Tensor?  q_v, "
    "Tensor!? out, Tensor?  cu_seqlens_q, Tensor?  cu_seqlens_k, Tensor?  cu_seqlens_k_new, "
    "Tensor?  seqused_q, Tensor?  seqused_k, int?     max_seqlen_q, int?     max_seqlen_k, "
    "Tensor?  page_table, Tensor?  kv_batch_idx, Tensor?  leftpad_k, Tensor?  rotary_cos, "
    "Tensor?  rotary_sin, Tensor?  seqlens_rotary, Tensor?  q_descale, Tensor?  k_descale, "
    "Tensor?  v_descale, float    softmax_scale, bool     is_causal, int      window_size_left, "
    "int      window_size_right, float    softcap, bool     is_rotary_interleaved, "
    "Tensor?  scheduler_metadata, int      num_splits, bool?    pack_gqa, int      sm_margin, "
    "Tensor?  s_aux, int      cp_world_size, int      cp_rank, Tensor?  cp_tot_seqused_k) -> Tensor[]")
FA3_SCHEDULER = (
    "get_scheduler_metadata(int      batch_size, int      max_seqlen_q, int      max_seqlen_k, "
    "int      num_heads, int      num_heads_k, int      headdim, int      headdim_v, "
    "ScalarType qkv_dtype, Tensor   seqused_k, Tensor?  cu_seqlens_q, Tensor?  cu_seqlens_k, "
    "Tensor?  cu_seqlens_k_new, Tensor?  seqused_q, Tensor?  leftpad_k, int?     page_size, "
    "int      max_seqlen_k_new, bool     is_causal, int      window_size_left, "
    "int      window_size_right, bool     has_softcap, int      num_splits, bool?    pack_gqa, "
    "int      sm_margin) -> Tensor")


def _arg_names(schema: str) -> list[str]:
    inner = schema[schema.index("(") + 1: schema.rindex(")", 0, schema.index("->"))]
    return [re.split(r"\s+", part.strip())[-1] for part in inner.split(",")]


class OpRecorder:
    """Keeps the calls the fake ops received, as {argument name: value} dicts."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def last(self, op: str) -> dict:
        matching = [args for name, args in self.calls if name == op]
        assert matching, f"{op} was not called (calls: {[n for n, _ in self.calls]})"
        return matching[-1]


_recorder = OpRecorder()
_libraries: list = []


def _register() -> None:
    if _libraries:
        return

    def recording(op: str, schema: str, result):
        names = _arg_names(schema)

        def kernel(*args):
            _recorder.calls.append((op, dict(zip(names, args))))
            return result(dict(zip(names, args)))

        return kernel

    def fwd_result(args):
        q, v = args["q"], args["v"]
        out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
        out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=out_dtype)
        lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
        return [out, lse]

    fa2 = torch.library.Library("_vendored_fa2_C", "DEF")
    fa2.define(FA2_VARLEN_FWD)
    fa2.impl("varlen_fwd", recording("varlen_fwd", FA2_VARLEN_FWD, fwd_result), "CPU")
    fa3 = torch.library.Library("_vendored_fa3_C", "DEF")
    fa3.define(FA3_FWD)
    fa3.define(FA3_SCHEDULER)
    fa3.impl("fwd", recording("fwd", FA3_FWD, lambda a: fwd_result(a) + [torch.empty(0), torch.empty(0)]), "CPU")
    fa3.impl("get_scheduler_metadata",
             recording("get_scheduler_metadata", FA3_SCHEDULER,
                       lambda a: torch.zeros(a["batch_size"] + 1, dtype=torch.int32)), "CPU")
    _libraries.extend([fa2, fa3])


@pytest.fixture
def fake_ops() -> OpRecorder:
    _register()
    _recorder.calls.clear()
    return _recorder
