"""cmake/CudaArchs.cmake's choice of code per module and its check that every listed GPU
gets code that runs there, in script mode (`cmake -P`, a fraction of a second). The
whole configure of the reported case: tests/build/test_knobs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cmake_runner import Result, clean_env, run, tool

ARCHS = Path(__file__).resolve().parents[2] / "cmake" / "CudaArchs.cmake"


def select(tmp_path: Path, arch_list: str, nvcc: str = "13.0", **knobs: str) -> Result:
    script = tmp_path / "select.cmake"
    script.write_text(f'include("{ARCHS}")\n'
                      f'vfa_select_cuda_archs("{nvcc}")\n'
                      'foreach(part FA2 FA3)\n'
                      '  message(NOTICE "${part} ok=${VFA_${part}_ARCH_OK} code=${VFA_${part}_GENCODE} '
                      'reason=${VFA_${part}_ARCH_REASON}")\n'
                      'endforeach()\n')
    # FA4 off unless a test says otherwise: these cases are the compiled modules' code (FA4,
    # declared for 9.x-11.x, would leave those GPUs to its packaging: tests/build/test_fa4_package.py)
    defines = {"TORCH_CUDA_ARCH_LIST": arch_list, "VFA_BUILD_FA4": "off", **knobs}
    return run([tool("cmake"), *[f"-D{k}={v}" for k, v in defines.items()], "-P", str(script)], env=clean_env())


def chosen(result: Result) -> dict[str, str]:
    assert result.returncode == 0, result.output
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in result.output.splitlines()
            if line.startswith(("FA2 ", "FA3 "))}


NO_PTX = ("its compute_80 PTX, which newer GPUs run, is left out by VFA_FA2_PTX=OFF (set VFA_FA2_PTX=ON")


@pytest.mark.parametrize("arch_list, knobs, bare", [
    ("10.0", {"VFA_FA2_PTX": "OFF", "VFA_BUILD_FA2": "on"}, "10.0"),  # the reported case
    ("10.0", {"VFA_FA2_PTX": "OFF"}, "10.0"),                          # FA2 auto: the same
    ("8.0;10.0;12.0", {"VFA_FA2_PTX": "OFF"}, "10.0, 12.0"),            # 8.0 runs, the others do not
    ("9.0", {"VFA_FA2_PTX": "OFF", "VFA_BUILD_FA3": "off"}, "9.0"),     # FA3 would have served 9.0
    ("8.6;9.0", {"VFA_FA2_PTX": "OFF"}, None),                          # 8.6: sm_80 SASS; 9.0: FA3
])
def test_a_listed_gpu_nothing_runs_on_stops(tmp_path, arch_list, knobs, bare):
    result = select(tmp_path, arch_list, **knobs)
    if bare is None:
        chosen(result)  # 8.6 gets sm_80 SASS, 9.0 FA3: nothing to refuse
        return
    assert result.returncode != 0
    assert f"TORCH_CUDA_ARCH_LIST='{arch_list}' names {bare}, but nothing this build compiles would run there" \
        in result.text, result.output
    assert NO_PTX in result.text
    if "VFA_BUILD_FA3" in knobs:
        assert "FA3 runs on 9.0 only, and is not built: VFA_BUILD_FA3=off" in result.text
        assert "or VFA_FA2_SM90_SASS=ON for 9.0" in result.text


def test_fa2_that_runs_on_no_listed_gpu_is_not_built(tmp_path):
    """9.0 without FA2's PTX or sm_90 SASS: FA3 serves it; FA2's sm_80 SASS would run on
    nothing listed, so FA2 is ruled out with the reason (auto leaves it out, on stops:
    CMakeLists.txt's "VFA_BUILD_FA2=on, but <reason>")."""
    got = chosen(select(tmp_path, "9.0", VFA_FA2_PTX="OFF"))
    assert got["FA3"].startswith("ok=TRUE code=sm_90a")
    assert got["FA2"] == (
        "ok=FALSE code=sm_80 reason=TORCH_CUDA_ARCH_LIST='9.0' names no GPU that FA2's code runs on: FA2 is "
        f"sm_80 SASS only, which runs on 8.x GPUs; {NO_PTX}, or VFA_FA2_SM90_SASS=ON for 9.0)")


def test_without_fa2_a_gpu_fa3_does_not_run_on_is_a_warning(tmp_path):
    result = select(tmp_path, "9.0;10.0", VFA_BUILD_FA2="off")
    got = chosen(result)
    assert got["FA3"].startswith("ok=TRUE")
    assert "CMake Warning" in result.output
    assert ("TORCH_CUDA_ARCH_LIST='9.0;10.0' names 10.0, but this wheel will hold nothing that runs there: "
            "VFA_BUILD_FA2=off, and FA3 runs on 9.0 only, FA4 runs on 9.x, 10.x and 11.x, and is not packaged: "
            "VFA_BUILD_FA4=off.") in result.text


@pytest.mark.parametrize("arch_list, knobs, fa2", [
    ("8.0;9.0;10.0;12.0", {}, "sm_80;compute_80"),             # the PTX serves the newer GPUs
    ("9.0;10.0", {"VFA_FA2_SM90_SASS": "ON"}, "sm_90;compute_80"),
    ("8.0;9.0", {"VFA_FA2_SM90_SASS": "ON", "VFA_FA2_PTX": "OFF"}, "sm_80;sm_90"),
])
def test_lists_every_gpu_of_which_gets_code_pass(tmp_path, arch_list, knobs, fa2):
    got = chosen(select(tmp_path, arch_list, **knobs))
    assert got["FA2"].startswith(f"ok=TRUE code={fa2} reason=")


# Arch lists the build cannot honour are refused with the project's own message (issue 30):
# "+PTX" used to be dropped silently (9.0+PTX built sm_90a and compute_80 only), and a list of
# separators reached torch's CMake, which failed with no word from the project.

@pytest.mark.parametrize("arch_list, expected", [
    ("9.0+PTX", "asks for 9.0+PTX, which this build cannot make: the only PTX it embeds is FA2's compute_80"),
    ("8.0;10.0+PTX", "asks for 10.0+PTX, which this build cannot make"),
    ("8.6+PTX;9.0", "asks for 8.6+PTX, which this build cannot make"),
])
def test_ptx_no_module_has_is_refused(tmp_path, arch_list, expected):
    result = select(tmp_path, arch_list)
    assert result.returncode != 0
    assert f"TORCH_CUDA_ARCH_LIST='{arch_list}' {expected}" in result.text, result.output
    assert "FA3 is sm_90a SASS only" in result.text and "Write" in result.text


def test_fa2s_own_ptx_is_honoured_and_its_absence_refused(tmp_path):
    got = chosen(select(tmp_path, "8.0+PTX;9.0"))
    assert got["FA2"].startswith("ok=TRUE code=sm_80;compute_80")
    result = select(tmp_path, "8.0+PTX;9.0", VFA_FA2_PTX="OFF")
    assert result.returncode != 0
    assert ("asks for 8.0+PTX, but VFA_FA2_PTX=OFF leaves FA2's compute_80 PTX out. Set VFA_FA2_PTX=ON, "
            "or write 8.0 without +PTX.") in result.text


# PyTorch's named archs carry a +PTX (Hopper = 9.0+PTX, Ampere = 8.0;8.6+PTX, issue 37): refused as
# the written +PTX is, naming what the name means. Before issue 37 "Hopper" built sm_90a alone and
# "Ampere" 8.0 and 8.6 with no PTX of 8.6: another build than torch makes of the same list.
@pytest.mark.parametrize("arch_list, ptx, meaning", [
    ("Hopper", "9.0", "Hopper = 9.0+PTX"),
    ("Ampere", "8.6", "Ampere = 8.0;8.6+PTX"),
    ("8.0;blackwell", "12.1", "blackwell = 10.0;10.3;12.0;12.1+PTX"),
])
def test_a_names_ptx_is_refused_as_a_written_one(tmp_path, arch_list, ptx, meaning):
    result = select(tmp_path, arch_list)
    assert result.returncode != 0
    assert f"TORCH_CUDA_ARCH_LIST='{arch_list}' asks for {ptx}+PTX, which this build cannot make" in result.text
    assert f"its names mean what they mean to PyTorch: {meaning}; write the capabilities instead" in result.text, \
        result.output


@pytest.mark.parametrize("arch_list", [";", ";;", ", ;"])
def test_a_list_that_names_no_architecture_is_refused(tmp_path, arch_list):
    result = select(tmp_path, arch_list)
    assert result.returncode != 0
    assert "names no architecture" in result.text and 'such as "8.0;9.0", the default when it is not set' \
        in result.text, result.output


def test_a_gpu_fa4_is_declared_for_is_left_to_its_packaging(tmp_path):
    # FA4 not off: 10.0 waits for FA4's packaging (CMakeLists.txt's vfa_check_bare_archs says
    # then whether it serves it: tests/build/test_fa4_package.py), so no warning here; 12.0, which
    # FA4's declaration excludes, is warned about at once.
    result = select(tmp_path, "9.0;10.0;12.0", VFA_BUILD_FA2="off", VFA_BUILD_FA4="auto")
    assert chosen(result)["FA3"].startswith("ok=TRUE")
    assert "names 12.0, but this wheel will hold nothing that runs there" in result.text, result.output
    assert "names 10.0" not in result.text and "10.0, 12.0" not in result.text
