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
    """A checkout copy whose declaration differs from the project's in three facts (FA2's
    lowest arch being its capabilities.min and its code's, archs)."""
    root = checkout_copy(tmp_path_factory.mktemp("families") / "project")
    path = root / "cmake" / "knobs.json"
    data = json.loads(path.read_text())
    fa2, fa3 = data["families"]["fa2"], data["families"]["fa3"]
    fa2["module"] = fa2["op_namespace"] = FA2_MODULE
    fa2["capabilities"]["min"] = "8.6"  # and its code from 8.6 (the validator holds the two together)
    fa2["archs"].update(sass=["8.6"], ptx="8.6")
    fa3["record"] = "build_info.json:hopper"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return root


def test_the_build_follows_the_declared_families(project, tmp_path, sources):
    build = tmp_path / "build"
    # FA2 is declared from 8.6 here: the default list's 8.0 would get no FA2 (a refusal, below).
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "TORCH_CUDA_ARCH_LIST": "8.6;9.0"},
                       source_dir=project)
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
    monitor = next(line for line in ninja.splitlines() if "progress.build_monitor" in line)
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



# --- a declaration with a mistake stops the configure, naming the field and the fix ----------
# One validator (families.problems) for the package and the build: the configure prints what
# the package would raise at first use, line for line.


def _declaring(root: Path, edit) -> Path:
    """A checkout copy whose cmake/knobs.json has gone through edit(data)."""
    project = checkout_copy(root)
    path = project / "cmake" / "knobs.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return project


def _swap_generation(families):
    families["fa4"]["capabilities"]["excluded"]["10"] = "declared both ways"


def _rename(families, old, new):
    families[new] = families.pop(old)
    families["default_order"] = [new if n == old else n for n in families["default_order"]]


MISTAKES = {
    "duplicate-version": (lambda d: d["families"]["fa4"].update(version=3),
                          "families.fa4.version 3 is also fa3's: families declare a version twice; give each "
                          "family its own version"),
    "unknown-in-default-order": (lambda d: d["families"].update(default_order=["fa3", "fa4", "fa2", "fa5"]),
                                 "families.default_order names 'fa5', which is no family (did you mean 'fa4'?): list every family once "
                                 "(fa2, fa3, fa4)"),
    "mistyped-made": (lambda d: d["families"]["fa2"].update(made="extention"),
                      "families.fa2.made 'extention' is not one of extension, cute_dsl (did you mean "
                      "'extension'?)"),
    "module-without-namespace": (lambda d: d["families"]["fa2"].update(module="_vendored_fa2_renamed_C"),
                                 "families.fa2.op_namespace '_vendored_fa2_C' is not its module "
                                 "'_vendored_fa2_renamed_C'"),
    "generation-supported-and-excluded": (lambda d: _swap_generation(d["families"]),
                                          "families.fa4.capabilities: generation 10 is both in generations and "
                                          "excluded: a family runs on a generation or does not; take it out of "
                                          "one of them"),
    # issue 37: what passed (or died far from its cause in CMake's JSON) before
    "name-cmake-cannot-carry": (lambda d: _rename(d["families"], "fa4", "fa;4"),
                                "families.fa;4: a family name is lower-case letters, digits and _"),
    "version-not-a-choice": (lambda d: d["knobs"]["VLLM_FLASH_ATTN_VERSION"].update(choices=["2", "3"]),
                             "knobs.VLLM_FLASH_ATTN_VERSION.choices ['2', '3'] are not the families' versions"),
    "min-generation-excluded": (lambda d: d["families"]["fa2"]["capabilities"].update(excluded={"8": "broken"}),
                                "families.fa2.capabilities.min 8.0 is of generation 8, which excluded says it "
                                "does not run on"),
    "default-where-it-does-not-run": (lambda d: d["families"]["fa3"].update(default_on=[9, 10]),
                                      "families.fa3.default_on names 10, where its capabilities say it does not "
                                      "run"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_declaration_mistake_stops_the_configure_naming_the_field(mistake, tmp_path, sources):
    from vendored_flash_attn.declaration import families

    edit, expected = MISTAKES[mistake]
    project = _declaring(tmp_path / "project", edit)
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal"}, source_dir=project)
    assert result.returncode != 0
    text = " ".join(result.output.split())
    assert "declares the kernel families (its \"families\" section) with mistakes" in text, result.output[-3000:]
    assert expected in text
    # The package's validator says the same, and raises it.
    found = families.problems(json.loads((project / "cmake" / "knobs.json").read_text()))
    assert any(expected in " ".join(line.split()) for line in found)
    assert all(" ".join(line.split()) in text for line in found)
    with pytest.raises(families.FamilyDeclarationError, match="families section"):
        families.parse(json.loads((project / "cmake" / "knobs.json").read_text()))
    assert not (tmp_path / "build" / "build_info.json").exists()


def test_an_adapter_that_is_not_there_stops_the_configure(tmp_path, sources):
    """issue 37: a family whose adapter module is missing configured, built and failed at its first call."""
    project = _declaring(tmp_path / "project", lambda d: d["families"]["fa3"].update(
        adapter="vendored_flash_attn.fa3_gone:forward"))
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal"}, source_dir=project)
    assert result.returncode != 0
    text = " ".join(result.output.split())
    assert "families.fa3.adapter: module vendored_flash_attn.fa3_gone is not there" in text, result.output[-3000:]
    assert not (tmp_path / "build" / "build_info.json").exists()


def test_a_capability_the_build_cannot_honour_is_refused(tmp_path, sources):
    """FA3's kernels are sm_90a code: a declaration that has FA3 run from 8.0 would ship a
    module the selector sends Ampere GPUs to."""
    def lower_fa3(data):
        data["families"]["fa3"]["capabilities"] = {"min": "8.0", "generations": {"8": "sm80", "9": "sm90"}}
        data["families"]["fa3"]["default_on"] = [9]

    project = _declaring(tmp_path / "project", lower_fa3)
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal"}, source_dir=project)
    assert result.returncode != 0
    text = " ".join(result.output.split())
    assert ("families.fa3.capabilities declares FA3 from 8.0 on generations [8, 9], but its code "
            "(families.fa3.archs: sm_90a) runs on 9.0, not on 8.0, 8.6, 8.7, 8.9") in text
    assert "Set families.fa3.capabilities.min to \"9.0\"" in text


def test_fa2s_declared_minimum_capability_is_what_it_is_compiled_for(project, tmp_path, sources):
    """The module fixture declares FA2 from 8.6, its code too (archs): FA2 compiles sm_86 SASS and
    compute_86 PTX, by the arch table, so the wheel's code and the selector's rule agree."""
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "TORCH_CUDA_ARCH_LIST": "8.6;9.0"},
                       source_dir=project)
    assert result.returncode == 0, result.output[-3000:]
    fa2_cuda = [cmd for name, cmd in units(build)[FA2_MODULE].items() if name.endswith(".cu")]
    assert fa2_cuda and all("arch=compute_86,code=sm_86" in c and "arch=compute_86,code=compute_86" in c
                            for c in fa2_cuda)
    assert build_info(build)["fa2"]["gencode"] == ["sm_86", "compute_86"]
    # 8.0 is below what FA2 is declared for: nothing would run there.
    low = configure(tmp_path / "build-80", {**sources, "VFA_PRESET": "minimal", "TORCH_CUDA_ARCH_LIST": "8.0;8.6"},
                    source_dir=project)
    assert low.returncode != 0
    assert "names 8.0, but nothing this build compiles would run there" in " ".join(low.output.split())
