"""The wheel checks (python -m vendored_flash_attn.release.wheel_check) on small wheels
made here: real ELF modules compiled with the host compiler, so dlopen and
abi3audit see what they would see in a release wheel."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from support.cmake_runner import PROJECT, clean_env, run
from vendored_flash_attn.release.wheel_check import (Expectations, check_abi3, check_build_info,
                                             check_cxx_runtime, check_size, check_symbols)
from vendored_flash_attn.release.build_info_check import compare_build_info

PIN = json.loads((PROJECT / "vendor/flash-attention/pin.json").read_text())
FA = PIN["flash_attention"]["commit"]
CUTLASS = PIN["cutlass"]["commit"]
VERSION = f"0.1.0+fa{FA[:7]}.cu13"

MODULE_C = """
{defines}
#include <Python.h>
{extra_decl}
static struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, "{name}", NULL, 0, NULL}};
PyMODINIT_FUNC PyInit_{name}(void) {{ {extra_call} return PyModule_Create(&m); }}
"""


def build_info(**changes) -> dict:
    info = {"schema": 1, "package_version": VERSION, "preset": "full",
            "upstream": {"commit": FA, "matches_pin": True}, "cutlass": {"commit": CUTLASS, "matches_pin": True},
            "fa2": {"built": True, "module": "_vendored_fa2_C"}, "fa3": {"built": True, "module": "_vendored_fa3_C"},
            "cuda_arch_list": "8.0;9.0", "torch": {"version": "2.14.1+cu130", "cuda": "13.0"},
            "cuda": {"version": "13.0.88"}}
    info.update(changes)
    return info


def compile_module(tmp: Path, name: str, *, limited=True, undefined=False, future_api=False) -> bytes:
    src = tmp / f"{name}.c"
    decl, call = "", ""
    if undefined:
        decl, call = "void vfa_missing_kernel(void);", "vfa_missing_kernel();"
    if future_api:  # a 3.12 limited-API function in a cp310 wheel
        decl, call = "", "PyObject_Vectorcall(NULL, NULL, 0, NULL);"
    src.write_text(MODULE_C.format(defines="#define Py_LIMITED_API 0x030A0000" if limited else "",
                                   name=name, extra_decl=decl, extra_call=call))
    out = tmp / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out.read_bytes()


def make_wheel(tmp: Path, *, tag="cp310-abi3-linux_x86_64", version=VERSION, suffix=".abi3.so",
               info: dict | None = None, padding: int = 0,
               modules=("_vendored_fa2_C", "_vendored_fa3_C"), **module_kwargs) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    dist = f"vendored_flash_attn-{version}.dist-info"
    wheel = tmp / f"vendored_flash_attn-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("vendored_flash_attn/__init__.py", "")
        zf.writestr("vendored_flash_attn/build_info.json", json.dumps(info or build_info()))
        for name in modules:
            zf.writestr(f"vendored_flash_attn/{name}{suffix}", compile_module(tmp, name, **module_kwargs))
        if padding:
            zf.writestr("vendored_flash_attn/padding.bin", bytes(range(256)) * (padding // 256), zipfile.ZIP_STORED)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.2\nName: vendored-flash-attn\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return make_wheel(tmp_path_factory.mktemp("good"))


def test_size_gate_passes_under_the_limit_and_names_the_wheels_sha256(good):
    result = check_size(good, max_mb=1)
    assert result.ok, result.render()
    assert f"sha256 {hashlib.sha256(good.read_bytes()).hexdigest()}" in result.summary


def test_size_gate_fails_over_the_limit_and_lists_the_largest_members(tmp_path):
    wheel = make_wheel(tmp_path, padding=300_000)
    result = check_size(wheel, max_mb=0.2)
    assert not result.ok
    assert "limit 0.2 MB" in result.summary and "over by" in result.summary
    assert "vendored_flash_attn/padding.bin" in result.details[0]  # largest first
    assert any("_vendored_fa2_C.abi3.so" in line for line in result.details)


def test_size_limit_from_the_environment(good, monkeypatch):
    monkeypatch.setenv("VFA_WHEEL_MAX_MB", "0.001")
    assert not check_size(good).ok
    monkeypatch.setenv("VFA_WHEEL_MAX_MB", "5")
    assert check_size(good).ok


def test_modules_that_load_pass_the_symbol_check(good):
    result = check_symbols(good)
    assert result.ok, result.render()
    assert "_vendored_fa3_C.abi3.so" in result.summary


def test_an_undefined_symbol_fails_the_symbol_check(tmp_path):
    result = check_symbols(make_wheel(tmp_path, undefined=True))
    assert not result.ok
    assert any("undefined symbol: vfa_missing_kernel" in line for line in result.details), result.render()


THROWS_CPP = '#include <stdexcept>\nextern "C" void vfa_fail(int x) { if (x) throw std::runtime_error("bad"); }\n'


def test_shared_cxx_runtime_passes(good):
    result = check_cxx_runtime(good)
    assert result.ok, result.render()


@pytest.mark.parametrize("static", [False, True])
def test_a_private_static_libstdcxx_is_caught(tmp_path, static):
    """A C++ module linked with its own libstdc++ (what a toolchain without the shared
    library produces) fails; the same module on the shared libstdc++ passes."""
    src = tmp_path / "m.cpp"
    src.write_text(THROWS_CPP)
    out = tmp_path / "m.so"
    subprocess.run(["g++", "-shared", "-fPIC", *(["-static-libstdc++"] if static else []), str(src), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    wheel = make_wheel(tmp_path / "w")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.write(out, "vendored_flash_attn/_vendored_extra_C.abi3.so")
    result = check_cxx_runtime(wheel)
    assert result.ok is not static, result.render()
    if static:
        assert "_vendored_extra_C.abi3.so: defines __cxa_allocate_exception, __cxa_throw" in result.render()


def test_clean_abi3_wheel(good):
    result = check_abi3(good)
    assert result.ok, result.render()


@pytest.mark.parametrize("kwargs, message", [
    ({"tag": "cp311-cp311-linux_x86_64"}, "expected cp310-abi3"),
    ({"suffix": ".cpython-311-x86_64-linux-gnu.so"}, "not named *.abi3.so"),
    ({"future_api": True}, "abi3audit"),
])
def test_abi3_problems_are_caught(tmp_path, kwargs, message):
    result = check_abi3(make_wheel(tmp_path, **kwargs))
    assert not result.ok
    assert message in "\n".join(result.details), result.render()


def test_build_info_as_asked(good):
    expect = Expectations(pin=PROJECT / "vendor/flash-attention/pin.json", cuda_major=13, arch_list="9.0 8.0",
                          preset="full", require=("fa2", "fa3"))
    result = check_build_info(good, expect)
    assert result.ok, result.render()


@pytest.mark.parametrize("changes, expect, message", [
    ({"upstream": {"commit": "f" * 40, "matches_pin": False}}, {}, "the pin names"),
    ({"cutlass": {"commit": CUTLASS, "matches_pin": False}}, {}, "cutlass.matches_pin"),
    ({}, {"cuda_major": 12}, "expected CUDA 12.x"),
    ({"cuda_arch_list": "8.0"}, {}, "cuda_arch_list"),
    ({"preset": "minimal"}, {}, "preset 'minimal'"),
    ({"fa3": {"built": False, "reason": "TORCH_CUDA_ARCH_LIST has no 9.0"}}, {"require": ("fa3",)}, "fa3 was not built"),
    ({"torch": {"cuda": "12.9"}, "cuda": {"version": "12.9.86"}}, {"cuda_major": None}, "says CUDA 13"),
    ({"schema": 2}, {}, "schema"),
])
def test_build_info_mismatches_are_caught(changes, expect, message):
    base = dict(pin=PROJECT / "vendor/flash-attention/pin.json", cuda_major=13, arch_list="8.0;9.0", preset="full")
    base.update(expect)
    problems = compare_build_info(build_info(**changes), Expectations(**base), VERSION)
    assert any(message in p for p in problems), problems


def test_version_label_must_name_the_built_upstream():
    problems = compare_build_info(build_info(), Expectations(), "0.1.0+fa1234567.cu13")
    assert any("names upstream 1234567" in p for p in problems)


def test_cli_exit_status_and_output(good, tmp_path):
    env = clean_env(PYTHONPATH=str(PROJECT / "python"))
    ok = run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "all", str(good), "--max-mb", "1",
              "--pin", str(PROJECT / "vendor/flash-attention/pin.json"), "--cuda-major", "13"], env=env)
    assert ok.returncode == 0, ok.output
    assert [line.split()[:2] for line in ok.stdout.splitlines() if line[:4] in ("PASS", "FAIL")] == [
        ["PASS", "size:"], ["PASS", "abi3:"], ["PASS", "cxx-runtime:"], ["PASS", "build-info:"],
        ["PASS", "symbols:"]]
    bad = run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "size", str(good.parent), "--max-mb", "0.0001"],
              env=env)
    assert bad.returncode == 1 and "FAIL size:" in bad.stdout


@pytest.mark.parametrize("changes, modules, message", [
    # Nothing built, no module: a wheel without kernels.
    ({"fa2": {"built": False, "reason": "VFA_BUILD_FA2=OFF"}, "fa3": {"built": False, "reason": "no 9.0"}},
     (), "none of fa2, fa3, fa4 was built (fa2: VFA_BUILD_FA2=OFF; fa3: no 9.0; no packaged family's record)"),
    # The build info says FA3 was built; the wheel lacks its module.
    ({}, ("_vendored_fa2_C",), "fa3 was built (build info) but"),
])
def test_build_info_must_match_the_wheels_modules(tmp_path, changes, modules, message):
    result = check_build_info(make_wheel(tmp_path, info=build_info(**changes), modules=modules), Expectations())
    assert not result.ok and any(message in p for p in result.details), result.render()


def test_the_recorded_version_must_be_the_wheels_whatever_its_form():
    # A build info from a plain CMake build (no local label) in a wheel with one.
    problems = compare_build_info(build_info(package_version="0.1.0"), Expectations(), VERSION)
    assert any("package_version '0.1.0' differs" in p for p in problems), problems
    assert compare_build_info(build_info(), Expectations(), VERSION) == []


# --- `installed`: cibuildwheel's test command, on the package as pip would install it ----------

def install_like_pip(tmp: Path, wheel: Path) -> Path:
    """The wheel unpacked into a site folder, with this package's Python code (the wheels
    made here carry only an empty __init__.py): what `pip install` leaves in site-packages."""
    site = tmp / "site"
    zipfile.ZipFile(wheel).extractall(site)
    package = PROJECT / "python/vendored_flash_attn"
    for source in package.rglob("*.py"):
        if "__pycache__" not in source.parts:
            copy = site / "vendored_flash_attn" / source.relative_to(package)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
    # The declaration the package reads (the families wheel_check lists), installed beside
    # it as a CMake-built wheel has it.
    (site / "vendored_flash_attn" / "knobs.json").write_bytes((PROJECT / "cmake/knobs.json").read_bytes())
    return site


def run_installed(tmp: Path, wheel: Path, *args: str):
    site = install_like_pip(tmp, wheel)
    # From outside the checkout, like cibuildwheel: the unpacked package, not python/.
    return run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "installed", *args],
               env=clean_env(PYTHONPATH=str(site)), cwd=tmp)


def test_installed_passes_a_good_wheel(tmp_path):
    result = run_installed(tmp_path, make_wheel(tmp_path / "w"),
                           "--pin", str(PROJECT / "vendor/flash-attention/pin.json"))
    assert result.returncode == 0, result.output
    assert "PASS symbols: 2 modules load" in result.stdout, result.output


@pytest.mark.parametrize("wheel_kwargs, message", [
    ({"info": build_info(fa2={"built": False, "module": "_vendored_fa2_C", "reason": "off"},
                         fa3={"built": False, "module": "_vendored_fa3_C", "reason": "off"}),
      "modules": ()}, "none of fa2, fa3, fa4 was built"),
    ({"info": build_info(package_version="0.1.0")}, "package_version '0.1.0' differs"),
    ({"modules": ("_vendored_fa2_C",)}, "_vendored_fa3_C: ModuleNotFoundError"),
])
def test_installed_fails_a_wheel_that_is_not_what_its_build_info_says(tmp_path, wheel_kwargs, message):
    result = run_installed(tmp_path, make_wheel(tmp_path / "w", **wheel_kwargs))
    assert result.returncode == 1, result.output
    assert message in result.stdout, result.output


def test_installed_fails_clearly_on_a_damaged_build_info(tmp_path):
    wheel = make_wheel(tmp_path / "w")
    site = install_like_pip(tmp_path, wheel)
    (site / "vendored_flash_attn/build_info.json").write_text('{"schema": 1, "pack')
    result = run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "installed"],
                 env=clean_env(PYTHONPATH=str(site)), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output
    assert "FAIL build-info: build_info.json is not valid JSON" in result.stdout, result.output


# FA4's precompiled kernels against its build record: a Python that compiled ships its files,
# a Python that shares them ships an index naming files the wheel holds.
FP_A, FP_B, KERNELS = "a" * 64, "b" * 64, "vendored_flash_attn/_fa4/kernels/cu12.9"


def fa4_wheel(tmp: Path, *, drop: str = "", index_entries: int = 2, same_as: str = FP_A, index: str = "") -> Path:
    wheel = make_wheel(tmp)
    runs = [{"arch": "sm_90a", "python": "3.11", "flavour": "cu12.9", "fingerprint": FP_A, "kernels": 2},
            {"arch": "sm_90a", "python": "3.12", "flavour": "cu12.9", "fingerprint": FP_B, "kernels": 2,
             "same_as": {"python": "3.11", "fingerprint": FP_A}}]
    members = {"vendored_flash_attn/_fa4/build_info.json": json.dumps({"precompile": {"runs": runs}}),
               "vendored_flash_attn/_fa4/cute/interface.py": "",
               f"{KERNELS}/{FP_A}/fwd/{'1' * 64}.o": "k1", f"{KERNELS}/{FP_A}/fwd_combine/{'2' * 64}.o": "k2",
               f"{KERNELS}/{FP_B}/aliases.json": json.dumps({"same_as": same_as, "python": "3.12", "kinds": dict(
                   list({"fwd": {"3" * 64: "1" * 64}, "fwd_combine": {"4" * 64: "2" * 64}}.items())[:index_entries])})}
    if index:
        members[f"{KERNELS}/{FP_B}/aliases.json"] = index
    with zipfile.ZipFile(wheel, "a") as zf:
        for name, text in members.items():
            if name != drop:
                zf.writestr(name, text)
    return wheel


def test_shipped_fa4_kernels_match_their_record(tmp_path):
    assert check_build_info(fa4_wheel(tmp_path), Expectations()).ok


@pytest.mark.parametrize("kwargs, message", [
    ({"drop": f"{KERNELS}/{FP_A}/fwd/{'1' * 64}.o"}, f"{FP_A} holds 1 kernel files, its build record 2"),
    ({"drop": f"{KERNELS}/{FP_B}/aliases.json"}, "aliases.json is missing (its build record lists 2 shared kernels)"),
    ({"index_entries": 1}, "lists 1 kernels of"),
    ({"same_as": "c" * 64}, "names 2 kernel files the wheel lacks"),
    # a damaged index is a finding, not a crash of the check (the run time ignores it too)
    ({"index": "{not json"}, "aliases.json: not an index of FA4 kernels"),
    ({"index": json.dumps({"same_as": "../x", "kinds": {}})}, "not 64 hex digits"),
])
def test_shipped_fa4_kernels_that_are_not_their_records_are_caught(tmp_path, kwargs, message):
    result = check_build_info(fa4_wheel(tmp_path, **kwargs), Expectations())
    assert not result.ok and any(message in p for p in result.details), result.render()


# --- the release gate for every declared family (`--require declared`) ---------------------

@pytest.mark.parametrize("arch_list, knobs, expected", [
    ("8.0;9.0", {}, ("fa2", "fa3", "fa4")),  # the release's list: every family runs on one of its archs
    ("8.0;9.0", {"VFA_BUILD_FA4": "off"}, ("fa2", "fa3")),
    ("8.0", {}, ("fa2",)),  # FA3 and FA4 run on 9.0 and newer only
    ("10.0", {"VFA_BUILD_FA2": "OFF"}, ("fa4",)),  # a Blackwell-only wheel of FA4 alone
    ("12.0", {}, ("fa2",)),  # FA4 is declared not to run on sm120 at the pin
    # the arch table's names and suffixes, as the build reads the list
    ("Hopper", {}, ("fa2", "fa3", "fa4")),
    ("Ampere", {}, ("fa2",)),
    ("8.0, 9.0a", {}, ("fa2", "fa3", "fa4")),
])
def test_the_families_a_build_asked_for_come_from_the_declaration(arch_list, knobs, expected):
    from vendored_flash_attn.release.build_info_check import declared_families

    options = {knob: {"value": value, "origin": "env:" + knob} for knob, value in knobs.items()}
    assert declared_families(build_info(cuda_arch_list=arch_list, options=options)) == expected


def release_wheel(tmp: Path, build_tag: str = "", *, record_changes=None, members_changes=None,
                  drop=()) -> Path:
    """A wheel as the release builds it: FA2 and FA3 modules, FA4 staged with its kernels
    precompiled for sm_90a by Python 3.11 and shared (an index) with Python 3.12."""
    index = json.dumps({"same_as": FP_A, "python": "3.12", "kinds": {"fwd": {"3" * 64: "1" * 64},
                                                                     "fwd_combine": {"4" * 64: "2" * 64}}})
    record = {"package": "vendored_flash_attn._fa4.cute",
              "precompile": {"mode": "on", "state": "on", "archs": ["sm_90a"], "pythons": ["3.11", "3.12"],
                             "runs": [{"arch": "sm_90a", "python": "3.11", "flavour": "cu12.9", "fingerprint": FP_A,
                                       "kernels": 2},
                                      {"arch": "sm_90a", "python": "3.12", "flavour": "cu12.9", "fingerprint": FP_B,
                                       "kernels": 2, "same_as": {"python": "3.11", "fingerprint": FP_A,
                                                                 "index_sha256": hashlib.sha256(index.encode()).hexdigest()}}]}}
    record.update(record_changes or {})
    members = {"vendored_flash_attn/_fa4/__init__.py": "",
               "vendored_flash_attn/_fa4/build_info.json": json.dumps(record),
               "vendored_flash_attn/_fa4/cute/__init__.py": "",
               "vendored_flash_attn/_fa4/cute/interface.py": "",
               f"{KERNELS}/{FP_A}/fwd/{'1' * 64}.o": "k1", f"{KERNELS}/{FP_A}/fwd_combine/{'2' * 64}.o": "k2",
               f"{KERNELS}/{FP_B}/aliases.json": index}
    members.update(members_changes or {})
    options = {"VFA_BUILD_FA2": {"value": "auto", "origin": "default"},
               "VFA_BUILD_FA3": {"value": "auto", "origin": "default"},
               "VFA_BUILD_FA4": {"value": "auto", "origin": "default"},
               "VFA_FA4_PRECOMPILE": {"value": "on", "origin": "env:VFA_FA4_PRECOMPILE"}}
    wheel = make_wheel(tmp, info=build_info(options=options))
    if build_tag:  # several wheels in one folder: a build tag keeps their names apart (PEP 427)
        wheel = wheel.rename(wheel.with_name(wheel.name.replace("-cp310-", f"-{build_tag}-cp310-")))
    with zipfile.ZipFile(wheel, "a") as zf:
        for name, text in members.items():
            if not any(name.startswith(prefix) for prefix in drop):
                zf.writestr(name, text)
    return wheel


RELEASE = Expectations(pin=PROJECT / "vendor/flash-attention/pin.json", cuda_major=13, arch_list="8.0;9.0",
                       preset="full", require=("declared",))
# Each way a release's FA4 can be broken, and what the gate says (the acceptance of issue 26).
BROKEN_FA4 = {
    "subpackage-removed": ({"drop": ("vendored_flash_attn/_fa4/",)},
                           "fa4 was required but vendored_flash_attn-0.1.0+fa617264c.cu13-1-cp310-abi3-linux_x86_64.whl "
                           "has no vendored_flash_attn/_fa4/build_info.json"),
    "sources-removed": ({"drop": ("vendored_flash_attn/_fa4/cute/",)},
                        "has no vendored_flash_attn/_fa4/cute/interface.py"),
    "index-damaged": ({"members_changes": {f"{KERNELS}/{FP_B}/aliases.json": '{"same_as": "' + FP_A + '", "ki'}},
                      "aliases.json: not an index of FA4 kernels"),
    # in the build's format, naming shipped files, but another index than the build recorded: a key sent
    # to another kernel's file (issue 36)
    "index-swapped": ({"members_changes": {f"{KERNELS}/{FP_B}/aliases.json": json.dumps(
        {"same_as": FP_A, "python": "3.12", "kinds": {"fwd": {"3" * 64: "2" * 64}, "fwd_combine": {"4" * 64: "1" * 64}}})}},
        "aliases.json is not the index its build record names"),
    "kernel-missing": ({"drop": (f"{KERNELS}/{FP_A}/fwd_combine/",)},
                       f"{FP_A} holds 1 kernel files, its build record 2"),
    "python-left-out": ({"record_changes": {"precompile": {
        "mode": "auto", "state": "on", "archs": ["sm_90a"], "pythons": ["3.11", "3.12"],
        "runs": [{"arch": "sm_90a", "python": "3.11", "flavour": "cu12.9", "fingerprint": FP_A, "kernels": 2},
                 {"arch": "sm_90a", "python": "3.12", "kernels": 0, "error": "RuntimeError: the DSL died"}]}}},
        "FA4: no kernels shipped for sm_90a and Python 3.12 (RuntimeError: the DSL died)"),
}


def test_a_release_wheel_with_every_family_passes_the_gate(tmp_path):
    result = check_build_info(release_wheel(tmp_path), RELEASE)
    assert result.ok, result.render()
    assert "built fa2+fa3+fa4, required fa2+fa3+fa4" in result.summary


@pytest.mark.parametrize("name", BROKEN_FA4)
def test_a_release_wheel_with_a_broken_fa4_fails_the_gate(tmp_path, name):
    changes, message = BROKEN_FA4[name]
    result = check_build_info(release_wheel(tmp_path, "1", **changes), RELEASE)
    assert not result.ok and any(message in p for p in result.details), result.render()


def test_a_wheel_that_auto_left_fa4_out_of_passes_only_without_the_gate(tmp_path):
    # VFA_BUILD_FA4=auto on a build Python that could not stage it: a consistent wheel (its
    # build info has no FA4 to check), but not a release: the arch list asked for FA4.
    wheel = release_wheel(tmp_path, drop=("vendored_flash_attn/_fa4/",))
    assert check_build_info(wheel, Expectations()).ok
    assert not check_build_info(wheel, RELEASE).ok


def test_a_wheel_of_fa4_alone_passes_every_check(tmp_path):
    # FA2 and FA3 off (a Blackwell-only deployment): no compiled module, and none expected.
    off = {"built": False, "reason": "off"}
    options = {"VFA_BUILD_FA2": {"value": "off", "origin": "env:VFA_BUILD_FA2"},
               "VFA_BUILD_FA3": {"value": "off", "origin": "env:VFA_BUILD_FA3"}}
    wheel = make_wheel(tmp_path, modules=(), info=build_info(fa2=off, fa3=off, cuda_arch_list="10.0", options=options))
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("vendored_flash_attn/_fa4/build_info.json", json.dumps({"precompile": {"state": "skipped"}}))
        zf.writestr("vendored_flash_attn/_fa4/cute/interface.py", "")
    expect = Expectations(arch_list="10.0", require=("declared",))
    for result in (check_build_info(wheel, expect), check_symbols(wheel), check_abi3(wheel)):
        assert result.ok, result.render()


def test_check_wheels_fails_each_broken_fa4_and_passes_a_good_release(tmp_path):
    """.buildkite/scripts/check-wheels.sh as the pipeline runs it (the wheels from a folder
    instead of the build's artifacts, this interpreter instead of a fresh venv): one run over
    a folder of broken wheels names each one's fault; one over the good wheel passes."""
    script = PROJECT / ".buildkite/scripts/check-wheels.sh"
    broken = tmp_path / "broken/cu13.0-x86_64"
    tags = {}
    for number, name in enumerate(BROKEN_FA4, start=1):
        changes, _ = BROKEN_FA4[name]
        tags[name] = release_wheel(broken, str(number), **changes).name
    env = clean_env(VFA_CHECK_PYTHON=sys.executable, TORCH_CUDA_ARCH_LIST="8.0;9.0", VFA_PRESET="full",
                    VFA_WHEELHOUSE=str(tmp_path / "broken"))
    failed = run(["bash", str(script), "13.0"], env=env, timeout=600)
    assert failed.returncode == 1, failed.output
    sections = dict(re.findall(r"^== [^\n]*/([^/\n]+\.whl)\n(.*?)(?=^== |\Z)", failed.stdout, re.S | re.M))
    for name, wheel in tags.items():
        assert "FAIL build-info" in sections[wheel] and BROKEN_FA4[name][1].replace(
            "vendored_flash_attn-0.1.0+fa617264c.cu13-1-cp310-abi3-linux_x86_64.whl", wheel) in sections[wheel], \
            (name, sections[wheel])
    release_wheel(tmp_path / "good/cu13.0-x86_64")
    passed = run(["bash", str(script), "13.0"], env={**env, "VFA_WHEELHOUSE": str(tmp_path / "good")}, timeout=600)
    assert passed.returncode == 0, passed.output
    assert "PASS build-info" in passed.stdout and "required fa2+fa3+fa4" in passed.stdout


@pytest.mark.parametrize("name", ["good", "kernel-missing", "subpackage-removed"])
def test_the_installed_check_holds_fa4_to_its_record_too(tmp_path, name):
    # What the GPU step and cibuildwheel's test command run on the installed package.
    changes, message = BROKEN_FA4.get(name, ({}, ""))
    wheel = release_wheel(tmp_path / "w", **changes)
    result = run_installed(tmp_path, wheel, "--pin", str(PROJECT / "vendor/flash-attention/pin.json"),
                           "--require", "declared")
    if name == "good":
        assert result.returncode == 0, result.output
        assert "required fa2+fa3+fa4" in result.stdout
    else:
        assert result.returncode == 1, result.output
        expected = message.replace("vendored_flash_attn-0.1.0+fa617264c.cu13-1-cp310-abi3-linux_x86_64.whl",
                                   "the installed package")
        assert expected in result.stdout, result.output
