"""A fifth, compiled kernel family, added the way the declaration says a family is added, and
nothing else: it is built, selected, validated, recorded and checked by the project's own code.

The synthetic upstream carries its sources (tests/support/synthetic_upstream.py, ``fa5/``: a
registration source, a dispatcher with FA5_DISABLE_* switches, one instantiation file per head
dim and dtype). A copy of the project then differs from this checkout in these files only:

* ``cmake/knobs.json``, the declaration: the ``fa5`` family (module, archs, build: sources,
  include dirs, defines, kernel rule, memory class, unit kinds; capabilities, dtypes, features,
  call rules, record), its three knobs (VFA_BUILD_FA5, VFA_FA5_HEAD_DIMS and VFA_FA5_DTYPES with
  their presets), ``fa5`` in ``default_order`` and ``5`` among VLLM_FLASH_ATTN_VERSION's choices;
* ``python/vendored_flash_attn/families/fa5.py``, its adapter: ``forward`` (calls the module's op) and the
  head-size rule its declaration names;
* its source list: ``fa5`` among the flash-attention paths of the pin the build verifies (the pin
  file the test writes, vendor/flash-attention/pin.json's format).

(``python cmake/vfa_build knobs.knobs write`` would also regenerate docs/knobs.md's knob tables and pyproject's
environment-pass from the new knobs; the build and the package read neither.)

One configure and one build (FA5 alone: FA2, FA3 and FA4 off; arch 8.0), installed into a folder
with the copy's package; then one Python process on it, on a described Ampere GPU (a CPU
machine: the op takes CPU tensors and reports which compiled kernel function ran).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from support.cmake_runner import checkout_copy, clean_env, compile_commands, configure, fetch_sources, run, tool, units

MODULE = "_vendored_fa5_C"

FAMILY = {
    "version": 5, "made": "extension", "build_knob": "VFA_BUILD_FA5",
    "module": MODULE, "op_namespace": MODULE, "forward_op": "fwd",
    "capabilities": {"min": "8.0", "generations": {"8": "sm80"}},
    "archs": {"sass": ["8.0"]},
    "build": {
        "sources": ["fa5/fa5_api.cpp"],
        "include_dirs": [["flash_attention", "fa5", "csrc/common"], ["cutlass", "include"]],
        "defines": ["FA5_SYNTHETIC"],
        "kernels": {"file": "fa5/instantiations/fa5_fwd_hdim{kernel}_{dtype}.cu", "left_out": "disable",
                    "variants": [{}],
                    "disable": {"head_dim": ["FA5_DISABLE_HDIM{head_dim}"], "dtypes": [["fp16", "FA5_DISABLE_FP16"]]}},
        "memory_sixteenths": 4,
        "unit_kinds": [["FA5 CUDA", "30", "/instantiations/", "2.0"]],
    },
    "dtypes": ["bf16", "fp16"],
    "head_dims_knob": "VFA_FA5_HEAD_DIMS", "dtypes_knob": "VFA_FA5_DTYPES", "features_knob": None,
    "features": ["varlen"],
    "default_on": [8], "not_default": {}, "fallback": "fa2",
    "adapter": "vendored_flash_attn.families.fa5:forward", "head_size_rule": "vendored_flash_attn.families.fa5:head_size_problem",
    "call": {"kv_layouts": ["packed"]},
    "record": "build_info.json:fa5", "artefacts": [],
}
KNOBS = {
    "VFA_BUILD_FA5": {"type": "tristate", "default": "auto", "scope": "build", "cibuildwheel": True,
                      "doc": "build FA5: `auto`, on, off"},
    "VFA_FA5_HEAD_DIMS": {"type": "list", "choices": ["64", "128"], "default": "", "default_doc": "preset",
                          "presets": {"minimal": ["128"]}, "scope": "build", "cibuildwheel": True,
                          "doc": "FA5 head dims"},
    "VFA_FA5_DTYPES": {"type": "list", "choices": ["bf16", "fp16"], "default": "", "default_doc": "preset",
                       "presets": {"minimal": ["bf16"]}, "scope": "build", "cibuildwheel": True, "doc": "FA5 dtypes"},
}

ADAPTER = '''\
"""FA5's adapter: a call the shared checks passed, onto the compiled module's ``fwd``."""

import torch


def head_size_problem(family, comp, head_size, head_size_v, dtype):
    """Its kernels take the head dims built, Q/K and V alike."""
    if head_size_v != head_size or head_size not in comp.head_dims:
        return (f"{family.title} takes the head sizes built ({', '.join(map(str, comp.head_dims))}), "
                f"Q/K and V alike; got {head_size} and {head_size_v}")
    return None


def forward(resolved, call, window, fp8):
    """(out, which kernel function of the module ran)."""
    kernel = torch.zeros(1, dtype=torch.int64)
    out = resolved.op(call.q, kernel, call.q.shape[-1], call.q.dtype == torch.bfloat16)
    return out, kernel
'''

# Run in the installed folder: the package of the copy, its build record and declaration, the module.
PROBE = textwrap.dedent('''
    import json, os, sys, torch
    import vendored_flash_attn as vfa
    from vendored_flash_attn.declaration import build_info
    from vendored_flash_attn.release import build_info_check as wheel_check_build_info, wheel_check
    from vendored_flash_attn.selection import environment, selector
    from vendored_flash_attn.errors import FlashAttnInputError, FlashAttnUnavailableError

    class DescribedAmpere(environment.SystemEnvironment):
        """This machine (its build record, its imports), with one Ampere GPU described."""
        device_type = "cpu"
        def device_count(self): return 1
        def current_device(self): return 0
        def capability(self, index): return (8, 0)

    environment.set_environment(DescribedAmpere())
    out = {"default": selector.get_flash_attn_version(), "reason": selector.flash_attn_version_reason(),
           "supported": selector.is_fa_version_supported(5)}
    os.environ["VLLM_FLASH_ATTN_VERSION"] = "5"
    environment.set_environment(DescribedAmpere())
    out["env"] = selector.get_flash_attn_version()

    def call(head=128, dtype=torch.bfloat16, **more):
        q = torch.zeros(4, 2, head, dtype=dtype)
        cu = torch.tensor([0, 2, 4], dtype=torch.int32)
        try:
            o, lse = vfa.flash_attn_varlen_func(q, q, q, 2, cu, 2, cu_seqlens_k=cu, return_softmax_lse=True,
                                                fa_version=5, **more)
            return int(lse[0])
        except (FlashAttnInputError, FlashAttnUnavailableError) as exc:
            return f"{type(exc).__name__}: {exc}"

    out["calls"] = {"128 bf16": call(), "64 bf16": call(head=64), "96": call(head=96),
                    "128 fp16": call(dtype=torch.float16),
                    "alibi": call(alibi_slopes=torch.zeros(2, dtype=torch.float32))}
    comp = build_info.load_build_info().component(5)
    out["record"] = {"built": comp.built, "module": comp.module, "gencode": list(comp.gencode),
                     "head_dims": list(comp.head_dims), "dtypes": list(comp.dtypes), "sources": comp.sources,
                     "defines": list(comp.defines)}
    info = build_info.load_build_info().raw
    names, read = wheel_check.installed_files()
    expect = wheel_check.Expectations(require=(wheel_check.DECLARED,))
    out["declared"] = list(wheel_check_build_info.declared_families(info))
    out["gate"] = wheel_check.package_problems(names, read, info, expect, "the folder")[0]
    without = [n for n in names if "_vendored_fa5_C" not in n]
    out["gate_without_module"] = wheel_check.package_problems(without, read, info, expect, "the folder")[0]
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def fifth(synthetic, tmp_path_factory):
    """The copy, its pin and source cache, one configure and one build, installed."""
    root = tmp_path_factory.mktemp("fifth")
    project = checkout_copy(root / "project")
    path = project / "cmake" / "knobs.json"
    data = json.loads(path.read_text())
    data["families"]["fa5"] = FAMILY
    data["families"]["default_order"].append("fa5")
    data["knobs"].update(KNOBS)
    data["knobs"]["VLLM_FLASH_ATTN_VERSION"]["choices"].append("5")
    path.write_text(json.dumps(data, indent=2) + "\n")
    (project / "python" / "vendored_flash_attn" / "families" / "fa5.py").write_text(ADAPTER)

    pin = synthetic.write_pin(root / "pin.json")
    pinned = json.loads(pin.read_text())
    pinned["flash_attention"]["paths"].append("fa5")
    pin.write_text(json.dumps(pinned, indent=2))
    synthetic.write_anchor(pin)  # a pin bump writes its anchor again (vendor/flash-attention/README.md)
    sources = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(root / "cache")}
    fetched = fetch_sources(sources)
    assert fetched.returncode == 0, fetched.output

    build = root / "build"
    configured = configure(build, {**sources, "VFA_COMPILER_CACHE": "off", "VFA_PRESET": "minimal",
                                   "VFA_FA5_HEAD_DIMS": "64,128", "TORCH_CUDA_ARCH_LIST": "8.0",
                                   "VFA_BUILD_FA2": "off", "VFA_BUILD_FA4": "off", "VFA_BUILD_PROGRESS": "off"},
                           source_dir=project)
    assert configured.returncode == 0, configured.output[-4000:]
    built = run([tool("cmake"), "--build", str(build)], env=clean_env(), timeout=1800)
    assert built.returncode == 0, built.output[-4000:]
    site = root / "site"
    installed = run([tool("cmake"), "--install", str(build), "--prefix", str(site)], env=clean_env())
    assert installed.returncode == 0, installed.output
    shutil.copytree(project / "python" / "vendored_flash_attn", site / "vendored_flash_attn", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.json"))  # the package's Python (data: installed)
    probe = run([sys.executable, "-c", PROBE], env=clean_env(PYTHONPATH=str(site)), cwd=root)
    assert probe.returncode == 0, probe.output[-4000:]
    return {"build": build, "configure": configured, "site": site, "probe": json.loads(probe.stdout.splitlines()[-1])}


def test_it_is_built_from_its_declaration(fifth):
    build = fifth["build"]
    commands = units(build)
    assert set(commands) == {MODULE}  # FA2, FA3 and FA4 off (or for no listed arch)
    assert set(commands[MODULE]) == {"fa5_api.cpp", "fa5_fwd_hdim64_bf16.cu", "fa5_fwd_hdim128_bf16.cu"}
    for name, command in commands[MODULE].items():
        assert "-DFA5_SYNTHETIC" in command and "-DFA5_DISABLE_FP16" in command
        assert "FA5_DISABLE_HDIM" not in command
        assert any(flag.endswith("/fa5") for flag in command.split())  # its declared include dir
        if name.endswith(".cu"):
            assert "-gencode arch=compute_80,code=sm_80" in command and "compute_80,code=compute_80" not in command
    ninja = (build / "build.ninja").read_text()
    assert ninja.count("pool = vfa_compile") == len(compile_commands(build))
    assert "vendored-flash-attn: FA5 2 kernels (head dims 64;128; bf16; features: ) for sm_80" in fifth["configure"].text


def test_it_is_recorded(fifth):
    record = fifth["probe"]["record"]
    assert record["built"] is True and record["module"] == MODULE
    assert record["gencode"] == ["sm_80"] and record["head_dims"] == [64, 128] and record["dtypes"] == ["bf16"]
    assert record["sources"] == 2 and "FA5_DISABLE_FP16" in record["defines"]


def test_it_is_selected_and_its_calls_validated_and_dispatched(fifth):
    probe = fifth["probe"]
    # The default on its declared generation (FA2 is off here), and what VLLM_FLASH_ATTN_VERSION=5 asks for.
    assert probe["default"] == 5 and "FA5 is built and loads" in probe["reason"]
    assert probe["env"] == 5 and probe["supported"] is True
    calls = probe["calls"]
    # The compiled kernel functions of the selection ran (head dim * 10 + dtype code 0).
    assert calls["128 bf16"] == 1280 and calls["64 bf16"] == 640
    # Refused before the op, by the shared checks reading its declaration and build record.
    assert "FA5 takes the head sizes built (64, 128), Q/K and V alike; got 96 and 96" in calls["96"]
    assert "this wheel has no FA5 kernels for float16" in calls["128 fp16"]
    assert calls["alibi"] == ("FlashAttnInputError: ALiBi (alibi_slopes) is not supported by FA5; pass fa_version=2 "
                              "or leave fa_version=None so the selector picks FA2")


def test_the_release_gate_requires_and_finds_it(fifth):
    probe = fifth["probe"]
    assert probe["declared"] == ["fa5"]
    assert probe["gate"] == []
    assert probe["gate_without_module"] == [f"fa5 was built (build info) but the folder has no {MODULE} module"]
