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

from vendored_flash_attn.declaration import op_schemas
from vendored_flash_attn.declaration.build_info import BuildInfo
from vendored_flash_attn.selection.environment import StaticEnvironment, set_environment

# The FA3 defines of every build (cmake/KernelSelection.cmake) that the runtime reads.
FA3_DEFINES = ["FLASHATTENTION_VARLEN_ONLY", "FLASHATTENTION_PACKGQA_ONLY",
               "FLASHATTENTION_DISABLE_APPENDKV"]
FULL = {
    "fa2": {"built": True, "module": "_vendored_fa2_C", "gencode": ["sm_80", "compute_80"],
            "head_dims": [32, 64, 96, 128, 192, 256], "dtypes": ["bf16", "fp16"],
            "features": ["sparse"]},
    "fa3": {"built": True, "module": "_vendored_fa3_C", "gencode": ["sm_90a"],
            "head_dims": [64, 96, 128, 192, 256], "dtypes": ["bf16", "fp16", "e4m3"],
            "features": ["paged", "split", "softcap", "local", "hdimdiff"], "defines": FA3_DEFINES},
}
MINIMAL = {
    "fa2": {"built": True, "module": "_vendored_fa2_C", "gencode": ["sm_80", "compute_80"],
            "head_dims": [128], "dtypes": ["bf16"], "features": []},
    "fa3": {"built": True, "module": "_vendored_fa3_C", "gencode": ["sm_90a"],
            "head_dims": [128], "dtypes": ["bf16", "e4m3"], "features": ["paged", "split", "local"],
            "defines": FA3_DEFINES},
}


# FA4's own build record (_fa4/build_info.json, cmake/FA4Package.cmake): FA4 is in the wheel.
FA4_RECORD = {"schema": 1, "package": "vendored_flash_attn._fa4.cute",
              "precompile": {"mode": "auto", "state": "on", "archs": ["sm_90a"], "runs": []},
              "staged": {"files": 54, "bytes": 2118779, "rewritten": 33}}


def make_build(preset: str = "full", fa2: dict | None = None, fa3: dict | None = None,
               fa4: dict | None = None, **more) -> BuildInfo:
    """A BuildInfo like CMake writes; ``fa2``/``fa3`` override fields of the preset,
    ``fa4`` is FA4's record (None: FA4 not in the wheel), ``more`` adds top-level fields
    (options, unknown_settings, ...)."""
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
    return BuildInfo.from_dict(data, {"fa4": fa4})


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


# Schemas as the upstream modules register them (ops.def strings): the package's own
# copy, checked against the pinned upstream's registration sources (test_op_schemas.py,
# cmake/vfa_build/knobs/op_schemas.py at every configure) and against the compiled modules (a GPU test).
FA2_VARLEN_FWD = op_schemas.FA2_VARLEN_FWD
FA3_FWD = op_schemas.FA3_FWD
FA3_SCHEDULER = op_schemas.FA3_GET_SCHEDULER_METADATA


def _arg_names(schema: str) -> list[str]:
    inner = schema[schema.index("(") + 1: schema.rindex(")", 0, schema.index("->"))]
    return [re.split(r"\s+", part.strip())[-1] for part in inner.split(",")]


class OpRecorder:
    """Keeps the calls the fake ops received, as {argument name: value} dicts.
    ``errors[op] = message``: that op raises RuntimeError(message), as a failed
    STD_TORCH_CHECK in the compiled op does."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.errors: dict[str, str] = {}

    def last(self, op: str) -> dict:
        matching = [args for name, args in self.calls if name == op]
        assert matching, f"{op} was not called (calls: {[n for n, _ in self.calls]})"
        return matching[-1]


_recorder = OpRecorder()
_libraries: list = []


def register_fake_ops() -> OpRecorder:
    """Register the fake ops once per process (benchmarks/overhead.py --cpu uses them too)."""
    _register()
    return _recorder


def _register() -> None:
    if _libraries:
        return

    def recording(op: str, schema: str, result):
        names = _arg_names(schema)

        def kernel(*args):
            assert len(args) == len(names), (op, len(args), len(names))
            _recorder.calls.append((op, dict(zip(names, args))))
            if op in _recorder.errors:
                raise RuntimeError(_recorder.errors[op])
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
    _recorder.errors.clear()
    return _recorder
