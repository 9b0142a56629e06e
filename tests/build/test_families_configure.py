"""The configure follows the kernel families as cmake/knobs.json declares them (its
``families`` section): a copy of the project whose declaration names FA2's module
otherwise, puts FA3's build record under another key and gives FA2 another lowest arch
builds, records and reports what that copy declares, not what the CMake code used to
name. Configure only, with the synthetic upstream. The CMake reader itself:
tests/unit/test_families_cmake_cpu.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support.cmake_runner import build_info, checkout_copy, compile_commands, configure, units

FA2_MODULE = "_vendored_fa2_renamed_C"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A checkout copy whose declaration differs from the project's in three facts."""
    root = checkout_copy(tmp_path_factory.mktemp("families") / "project")
    path = root / "cmake" / "knobs.json"
    data = json.loads(path.read_text())
    fa2, fa3 = data["families"]["fa2"], data["families"]["fa3"]
    fa2["module"] = fa2["op_namespace"] = FA2_MODULE
    fa2["capabilities"]["min"] = "8.6"
    fa3["record"] = "build_info.json:hopper"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return root


def test_the_build_follows_the_declared_families(project, tmp_path, sources):
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal"}, source_dir=project)
    assert result.returncode == 0, result.output
    assert set(units(build)) == {FA2_MODULE, "_vendored_fa3_C"}  # TORCH_EXTENSION_NAME of each compile

    info = build_info(build)
    assert "fa3" not in info
    assert info["fa2"]["module"] == FA2_MODULE and info["fa2"]["built"]
    assert info["hopper"]["module"] == "_vendored_fa3_C" and info["hopper"]["built"]
    assert info["hopper"]["sources"] == 8  # minimal: FA3's 8 instantiations
    assert "FA2 6 kernels" in result.text and "FA3 8 kernels" in result.text

    # Every compile of the renamed module runs in the job pool and is followed by the monitor,
    # with the kinds of units FA2's target file declares.
    ninja = (build / "build.ninja").read_text()
    assert ninja.count("pool = vfa_compile") == len(compile_commands(build))
    monitor = next(line for line in ninja.splitlines() if "build_monitor.py" in line)
    assert re.search(rf"--targets {FA2_MODULE} _vendored_fa3_C ", monitor)
    assert f'--unit-kind "{FA2_MODULE}|FA2 CUDA|189||5.0"' in monitor
    # FA3's FP8 paged units are a slower kind of their own, declared before the kind they would
    # otherwise fall in (the first that matches wins; tests/unit/test_build_progress_cpu.py).
    fp8, fa3 = '"_vendored_fa3_C|FA3 CUDA, FP8 paged|330|_e4m3_paged|5.1"', '"_vendored_fa3_C|FA3 CUDA|153|'
    assert fp8 in monitor and monitor.index(fp8) < monitor.index(fa3)


def test_nothing_to_build_names_the_declared_families_and_their_lowest_archs(project, tmp_path, sources):
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal", "VFA_BUILD_FA2": "off",
                                            "TORCH_CUDA_ARCH_LIST": "8.0"}, source_dir=project)
    assert result.returncode != 0
    assert ("Nothing to build: FA2 (VFA_BUILD_FA2=off), FA3 (TORCH_CUDA_ARCH_LIST='8.0' does not "
            "contain 9.0) and FA4 (TORCH_CUDA_ARCH_LIST='8.0' has no arch FA4 runs on). Set TORCH_CUDA_ARCH_LIST "
            "to include an arch a family runs on (FA2 8.6, FA3 9.0, FA4 9.0), with that family's build knob "
            "(VFA_BUILD_FA2, VFA_BUILD_FA3, VFA_BUILD_FA4) auto or on.") in result.text
