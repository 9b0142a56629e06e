"""Kernel selection and arch flags, read from the real compile commands."""

from __future__ import annotations

import fnmatch
import re
import shutil
from pathlib import Path

import pytest

from support.cmake_runner import build_info, clean_env, compile_commands, configured, units


def instantiations(commands: dict[str, str], prefix: str) -> set[str]:
    return {name for name in commands if name.startswith(prefix) and name.endswith(".cu")}


def gencodes(command: str) -> list[str]:
    return re.findall(r"-gencode arch=(compute_\w+),code=(\w+)", command)


def upstream_full_fa3_set(all_names: set[str]) -> set[str]:
    """What upstream's CMakeLists.txt globs select (the set vLLM ships)."""
    patterns = []
    for dt in ("bf16", "fp16", "e4m3"):
        for h in (64, 96, 128, 192, 256):
            patterns += [f"flash_fwd_hdim{h}_{dt}_*packgqa_sm90.cu", f"flash_fwd_hdim{h}_{dt}_split*_sm90.cu",
                         f"flash_fwd_hdim{h}_{dt}_paged*_sm90.cu"]
    for dt in ("bf16", "fp16"):
        patterns += [f"flash_fwd_hdim64_256_{dt}*_sm90.cu", f"flash_fwd_hdim64_512_{dt}*_sm90.cu",
                     f"flash_fwd_hdim192_128_{dt}*_sm90.cu"]
    patterns.append("flash_fwd_hdim192_128_e4m3*_sm90.cu")
    return {n for n in all_names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def test_minimal_preset_compiles_exactly_the_minimal_kernels(tmp_path, sources):
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal")
    assert result.returncode == 0, result.output
    mods = units(build)
    fa3 = instantiations(mods["_vendored_fa3_C"], "flash_fwd_hdim")
    assert fa3 == {f"flash_fwd_hdim128_{dt}_{v}_sm90.cu" for dt in ("bf16", "e4m3")
                   for v in ("packgqa", "split", "paged", "paged_split")}
    fa2 = instantiations(mods["_vendored_fa2_C"], "flash_fwd")
    assert fa2 == {f"flash_fwd{k}_hdim128_bf16{c}_sm80.cu" for k in ("", "_split", "_split_align")
                   for c in ("", "_causal")}
    # The left-out FA2 kernels come from one generated file (staged by content).
    stubs = [n for n in mods["_vendored_fa2_C"] if n.startswith("fa2_missing_kernels")]
    assert len(stubs) == 1

    fa3_cmd = mods["_vendored_fa3_C"]["flash_fwd_hdim128_bf16_paged_sm90.cu"]
    assert gencodes(fa3_cmd) == [("compute_90a", "sm_90a")]
    for define in ("FLASHATTENTION_DISABLE_HDIM64", "FLASHATTENTION_DISABLE_HDIM256", "FLASHATTENTION_DISABLE_FP16",
                   "FLASHATTENTION_DISABLE_SOFTCAP", "FLASHATTENTION_DISABLE_HDIMDIFF64", "FLASHATTENTION_VARLEN_ONLY",
                   "FLASHATTENTION_PACKGQA_ONLY", "CUTLASS_ENABLE_GDC_FOR_SM90"):
        assert f"-D{define} " in fa3_cmd
    for define in ("FLASHATTENTION_DISABLE_HDIM128", "FLASHATTENTION_DISABLE_FP8 ", "FLASHATTENTION_DISABLE_PAGEDKV",
                   "FLASHATTENTION_DISABLE_SPLIT", "FLASHATTENTION_DISABLE_LOCAL"):
        assert f"-D{define}" not in fa3_cmd
    for flag in ("-std=c++20", "--use_fast_math", "--expt-relaxed-constexpr", "--expt-extended-lambda",
                 "-DENABLE_FP8", "-DTORCH_TARGET_VERSION=0x020A000000000000ULL", "-DPy_LIMITED_API=3"):
        assert flag in fa3_cmd

    fa2_cmd = mods["_vendored_fa2_C"]["flash_fwd_hdim128_bf16_causal_sm80.cu"]
    assert gencodes(fa2_cmd) == [("compute_80", "sm_80"), ("compute_80", "compute_80")]
    assert "-DFLASHATTENTION_DISABLE_BACKWARD" in fa2_cmd and "HDIM" not in fa2_cmd

    info = build_info(build)
    assert info["preset"] == "minimal"
    assert info["fa3"] == {**info["fa3"], "built": True, "head_dims": [128], "dtypes": ["bf16", "e4m3"],
                           "features": ["paged", "split", "local"], "gencode": ["sm_90a"], "sources": 8}
    assert info["fa2"] == {**info["fa2"], "built": True, "head_dims": [128], "dtypes": ["bf16"],
                           "gencode": ["sm_80", "compute_80"], "sources": 6}
    assert info["upstream"]["matches_pin"] is True


def test_full_preset_matches_what_upstream_ships(tmp_path, sources, synthetic):
    build, result = configured(tmp_path, sources, VFA_PRESET="full")
    assert result.returncode == 0, result.output
    mods = units(build)
    all_fa3 = {p.name for p in (synthetic.flash_attention / "hopper/instantiations").glob("flash_fwd_*_sm90.cu")}
    fa3 = instantiations(mods["_vendored_fa3_C"], "flash_fwd_hdim")
    assert fa3 == upstream_full_fa3_set(all_fa3)
    assert len(fa3) == 190
    all_fa2 = {p.name for p in (synthetic.flash_attention / "csrc/flash_attn/src").glob("flash_fwd_*.cu")}
    assert instantiations(mods["_vendored_fa2_C"], "flash_fwd") == all_fa2 and len(all_fa2) == 76
    assert not [n for n in mods["_vendored_fa2_C"] if n.startswith("fa2_missing_kernels")]
    assert "FLASHATTENTION_DISABLE_HDIM" not in mods["_vendored_fa3_C"]["flash_api.cpp"]


@pytest.mark.parametrize(
    "arch_list, extra, fa2, fa3",
    [
        ("8.0", {}, [("compute_80", "sm_80"), ("compute_80", "compute_80")], None),
        ("8.0 8.6 8.9", {}, [("compute_80", "sm_80"), ("compute_80", "compute_80")], None),
        ("9.0", {}, [("compute_80", "sm_80"), ("compute_80", "compute_80")], [("compute_90a", "sm_90a")]),
        ("9.0", {"VFA_FA2_SM90_SASS": "ON"}, [("compute_90", "sm_90"), ("compute_80", "compute_80")],
         [("compute_90a", "sm_90a")]),
        ("8.0;9.0", {"VFA_FA2_SM90_SASS": "ON", "VFA_FA2_PTX": "OFF"},
         [("compute_80", "sm_80"), ("compute_90", "sm_90")], [("compute_90a", "sm_90a")]),
        # (issue 37: "Hopper" is PyTorch's 9.0+PTX, refused: tests/unit/test_cuda_archs_cmake_cpu.py)
        ("9.0a", {"VFA_BUILD_FA2": "off"}, None, [("compute_90a", "sm_90a")]),
    ],
)
def test_arch_list_drives_per_module_gencodes(tmp_path, sources, arch_list, extra, fa2, fa3):
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", TORCH_CUDA_ARCH_LIST=arch_list, **extra)
    assert result.returncode == 0, result.output
    mods = units(build)
    info = build_info(build)
    for module, expected, key in (("_vendored_fa2_C", fa2, "fa2"), ("_vendored_fa3_C", fa3, "fa3")):
        if expected is None:
            assert module not in mods
            assert info[key]["built"] is False and info[key]["reason"]
        else:
            cu = [cmd for name, cmd in mods[module].items() if name.endswith(".cu")]
            assert cu and all(gencodes(cmd) == expected for cmd in cu)
            assert info[key]["built"] is True


def test_arch_list_from_the_environment(tmp_path, sources):
    build, result = configured(tmp_path, sources, env=clean_env(TORCH_CUDA_ARCH_LIST="8.0", VFA_PRESET="minimal"))
    assert result.returncode == 0, result.output
    info = build_info(build)
    assert info["fa3"]["built"] is False and "does not contain 9.0" in info["fa3"]["reason"]
    assert info["options"]["TORCH_CUDA_ARCH_LIST"] == {"value": "8.0", "origin": "env:TORCH_CUDA_ARCH_LIST"}
    assert info["options"]["VFA_PRESET"] == {"value": "minimal", "origin": "env:VFA_PRESET"}


def test_feature_selection_changes_files_and_defines_together(tmp_path, sources):
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", VFA_FA3_HEAD_DIMS="64,192",
                               VFA_FA3_DTYPES="bf16 fp16", VFA_FA3_FEATURES="softcap;hdimdiff",
                               VFA_FA2_FEATURES="sparse", VFA_FA2_DTYPES="bf16,fp16")
    assert result.returncode == 0, result.output
    mods = units(build)
    fa3 = instantiations(mods["_vendored_fa3_C"], "flash_fwd_hdim")
    assert "flash_fwd_hdim64_fp16_softcap_packgqa_sm90.cu" in fa3
    assert "flash_fwd_hdim192_128_bf16_softcap_sm90.cu" in fa3
    assert "flash_fwd_hdim64_512_fp16_sm90.cu" in fa3
    assert not [n for n in fa3 if "paged" in n or "split" in n or "e4m3" in n or "hdim128" in n]
    cmd = mods["_vendored_fa3_C"]["flash_api.cpp"]
    for present in ("DISABLE_PAGEDKV", "DISABLE_SPLIT", "DISABLE_LOCAL", "DISABLE_FP8", "DISABLE_HDIM128"):
        assert f"-DFLASHATTENTION_{present}" in cmd
    for absent in ("DISABLE_SOFTCAP", "DISABLE_HDIMDIFF", "DISABLE_FP16", "DISABLE_HDIM64 ", "DISABLE_HDIM192"):
        assert f"-DFLASHATTENTION_{absent}" not in cmd
    fa2 = instantiations(mods["_vendored_fa2_C"], "flash_fwd_sparse")
    assert fa2 == {f"flash_fwd_sparse_hdim128_{dt}{c}_sm80.cu" for dt in ("bf16", "fp16") for c in ("", "_causal")}


@pytest.mark.parametrize("value, disabled", [(None, False), ("OFF", True), ("ON", False)])
def test_fp8_two_level_accumulation_switch(tmp_path, sources, value, disabled):
    # On by default, as upstream (FP8 accuracy at long context); OFF is the faster,
    # less accurate variant a user picks knowingly.
    knobs = {} if value is None else {"VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION": value}
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", **knobs)
    assert result.returncode == 0, result.output
    for name, cmd in units(build)["_vendored_fa3_C"].items():
        assert ("-DFLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION" in cmd) is disabled, name


GIVEN = "(given as -D{0} (pip: -C cmake.define.{0}))"
BOOL_WORDS = "ON/OFF, 1/0, TRUE/FALSE, YES/NO (any case)"


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"VFA_PRESET": "tiny"}, f"VFA_PRESET: 'tiny' is not a valid value {GIVEN.format('VFA_PRESET')}. "
                                 "Valid values: full, minimal."),
        ({"VFA_FA3_DTYPES": "bf16,fp32"}, "VFA_FA3_DTYPES: 'fp32' is not a valid value"),
        ({"VFA_FA3_HEAD_DIMS": "80"}, "VFA_FA3_HEAD_DIMS: '80' is not a valid value"),
        ({"VFA_FA3_DTYPES": "fp16,e4m3"}, "VFA_FA3_DTYPES must include bf16"),
        ({"TORCH_CUDA_ARCH_LIST": "7.5"}, "Nothing to build"),
        ({"TORCH_CUDA_ARCH_LIST": "sm80"}, "TORCH_CUDA_ARCH_LIST: 'sm80' is not an architecture"),
        ({"TORCH_CUDA_ARCH_LIST": "8.0", "VFA_BUILD_FA3": "on"}, "VFA_BUILD_FA3=on, but TORCH_CUDA_ARCH_LIST='8.0' does not contain 9.0"),
        ({"VFA_COMPILER_CACHE": "maybe"}, "VFA_COMPILER_CACHE: 'maybe' is not a valid value"),
        ({"MAX_JOBS": "lots"}, f"MAX_JOBS: 'lots' is not a valid value {GIVEN.format('MAX_JOBS')}. "
                               "Valid values: an integer from 1 to 4096."),
        ({"NVCC_THREADS": "0"}, "NVCC_THREADS: '0' is not a valid value"),
        ({"VFA_FATBIN_COMPRESSION": "max"}, "VFA_FATBIN_COMPRESSION: 'max' is not a valid value"),
        # Booleans take their documented words only ("enable" used to mean off).
        ({"VFA_FA2_PTX": "enable"}, f"VFA_FA2_PTX: 'enable' is not a valid value {GIVEN.format('VFA_FA2_PTX')}. "
                                    f"Valid values: {BOOL_WORDS}."),
        ({"VFA_BUILD_FA3": "yes please"}, f"Valid values: auto, or {BOOL_WORDS}."),
        # A number CMake's 64-bit arithmetic cannot hold (it used to end in a JSON error).
        ({"VFA_JOB_MEMORY_MB": "1" * 20}, f"VFA_JOB_MEMORY_MB: '{'1' * 20}' is not a valid value"),
        ({"VFA_BUILD_MEMORY_MB": "-5"}, "Valid values: an integer from 1 to 1073741824."),
        ({"VFA_BUILD_MEMORY_MB": "0"}, "Valid values: an integer from 1 to 1073741824."),
        # An FA3 asked for, with nothing selected to build.
        ({"VFA_BUILD_FA3": "ON", "VFA_FA3_HEAD_DIMS": "none"},
         "VFA_BUILD_FA3=on, but the selection has no FA3 HEAD_DIMS (VFA_FA3_HEAD_DIMS is empty)."),
    ],
)
def test_bad_knobs_fail_with_a_clear_message(tmp_path, sources, knobs, message):
    _, result = configured(tmp_path, {**sources, "VFA_PRESET": "minimal"}, **knobs)
    assert result.returncode != 0
    assert message in result.text


def test_a_bad_value_from_the_environment_names_the_variable(tmp_path, sources):
    _, result = configured(tmp_path, sources, env=clean_env(VFA_FA2_PTX="enable"))
    assert result.returncode != 0
    assert ("VFA_FA2_PTX: 'enable' is not a valid value (from the environment variable VFA_FA2_PTX). "
            f"Valid values: {BOOL_WORDS}.") in result.text


def test_job_count_follows_max_jobs_and_nvcc_threads(tmp_path, sources):
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", MAX_JOBS="3", NVCC_THREADS="2")
    assert result.returncode == 0, result.output
    info = build_info(build)
    assert info["build"]["jobs"] == 3 and info["build"]["nvcc_threads"] == 2
    assert "--threads=2" in units(build)["_vendored_fa3_C"]["flash_fwd_hdim128_bf16_paged_sm90.cu"]
    rules = (build / "CMakeFiles/rules.ninja").read_text()
    assert "pool vfa_compile\n  depth = 3" in rules
    # Every compile of both modules runs in that pool.
    assert (build / "build.ninja").read_text().count("pool = vfa_compile") == len(compile_commands(build))


def test_default_job_count_is_bounded_by_memory(tmp_path, sources):
    # 1 GB per job on a machine with far more memory: cores decide; a huge
    # per-job figure: memory decides, down to one job.
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", VFA_JOB_MEMORY_MB="16000000")
    assert result.returncode == 0, result.output
    info = build_info(build)
    assert info["build"]["jobs"] == 1 and info["build"]["jobs_reason"].startswith("memory")


def test_job_pool_budgets_each_unit_by_its_kind(tmp_path, sources):
    """The pool admits as many jobs as the heaviest units of this build fit in memory:
    FA3 CUDA units at VFA_JOB_MEMORY_MB, FA2 CUDA units at 9/16 of it, C++ units at 1/8."""
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", VFA_BUILD_MEMORY_MB="100000",
                               VFA_JOB_MEMORY_MB="8192")
    assert result.returncode == 0, result.output
    by_module = units(build)
    fa3_cuda = sum(name.endswith(".cu") for name in by_module["_vendored_fa3_C"])
    fa2_cuda = sum(name.endswith(".cu") for name in by_module["_vendored_fa2_C"])
    assert (fa3_cuda, fa2_cuda) == (10, 6)  # minimal: 8 FA3 kernels + combine + scheduler
    # 10 x 8192 = 81920 MB, then FA2 units at 4608 MB: three more fit in 100000 MB, a
    # fourth would not. (Budgeting every unit at 8192 MB would allow 12.)
    assert build_info(build)["build"]["jobs_by_memory"] == 13
    # With room for every unit, memory no longer limits: cores (or MAX_JOBS) decide.
    build, result = configured(tmp_path / "roomy", sources, VFA_PRESET="minimal",
                               VFA_BUILD_MEMORY_MB="1000000")
    info = build_info(build)["build"]
    assert info["jobs_by_memory"] == len(compile_commands(build))
    assert info["jobs_reason"] == "cores"


def _static_only_cxx(tmp_path: Path) -> Path:
    """A g++ that behaves like one whose toolchain has no shared libstdc++."""
    real = shutil.which("g++")
    if real is None:
        pytest.skip("needs g++")
    wrapper = tmp_path / "bin" / "g++"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-print-file-name=libstdc++.so" ]; then echo libstdc++.so; exit 0; fi\n'
        f'exec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_static_only_libstdcxx_is_refused(tmp_path, sources):
    """Modules with a private static libstdc++ die on any C++ exception inside an op."""
    cxx = _static_only_cxx(tmp_path)
    _, result = configured(tmp_path, sources, VFA_PRESET="minimal", CMAKE_CXX_COMPILER=str(cxx))
    assert result.returncode != 0
    assert f"The C++ compiler {cxx} has no shared libstdc++" in result.text
    assert "VFA_ALLOW_STATIC_LIBSTDCXX=ON" in result.text
    build, result = configured(tmp_path / "allowed", sources, VFA_PRESET="minimal",
                               CMAKE_CXX_COMPILER=str(cxx), VFA_ALLOW_STATIC_LIBSTDCXX="ON")
    assert result.returncode == 0, result.output
    assert "has no shared libstdc++" in result.text  # still said, as a warning
    assert build_info(build)["compiler"]["libstdcxx"] == "static"


def test_the_shared_libstdcxx_is_recorded(tmp_path, sources):
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal")
    assert result.returncode == 0, result.output
    assert build_info(build)["compiler"]["libstdcxx"] == "shared"


@pytest.mark.parametrize("mode, flag", [(None, "--compress-mode=size"), ("auto", "--compress-mode=size"),
                                        ("default", None), ("none", "--compress-mode=none")])
def test_fatbin_compression_knob(tmp_path, sources, mode, flag):
    # nvcc 13 here: auto (the default) compresses for size.
    knobs = {} if mode is None else {"VFA_FATBIN_COMPRESSION": mode}
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", **knobs)
    assert result.returncode == 0, result.output
    for module, commands in units(build).items():
        for name, cmd in commands.items():
            if name.endswith(".cu"):
                assert (flag in cmd) if flag else ("--compress-mode" not in cmd), (module, name)
