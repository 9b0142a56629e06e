"""Knobs at configure time (cmake/Options.cmake reading cmake/knobs.json): accepted
words, unknown settings, no carry-over between configures of one build dir, relative
paths, the build info's list of every knob, and how CUTLASS reaches the driver.
(Refused values and their messages: test_configure.py.)"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from support.cmake_runner import PROJECT, build_info, clean_env, configured, fetch_sources, run, tool, units

from vfa_build.knobs import knobs as declaration


def cache_entries(build: Path) -> dict[str, str]:
    entries = {}
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):[A-Z]+=(.*)$", line)
        if match:
            entries[match.group(1)] = match.group(2)
    return entries


def test_knobs_do_not_stick_to_the_build_dir(tmp_path, sources):
    """The README quick start after a refused typo, then with other presets, in one build
    dir: each configure builds what it was given, whatever an earlier one was given."""
    pin_and_cache = {k: v for k, v in sources.items() if k != "VFA_COMPILER_CACHE"}
    env_of = lambda **env: clean_env(VFA_COMPILER_CACHE="off", **env)  # noqa: E731

    build, result = configured(tmp_path, pin_and_cache, env=env_of(), VFA_PRESET="minmal")
    assert result.returncode != 0 and "VFA_PRESET: 'minmal' is not a valid value" in result.text
    assert "VFA_PRESET" not in cache_entries(build), "a refused -D value must not stay in the cache"

    build, result = configured(tmp_path, pin_and_cache, env=env_of(VFA_PRESET="minimal"))
    assert result.returncode == 0, result.output
    assert build_info(build)["preset"] == "minimal"
    assert build_info(build)["options"]["VFA_PRESET"] == {"value": "minimal", "origin": "env:VFA_PRESET"}
    assert len(units(build)["_vendored_fa3_C"]) == 12

    # -D wins over the environment for this configure...
    build, result = configured(tmp_path, pin_and_cache, env=env_of(VFA_PRESET="minimal"), VFA_PRESET="full")
    assert result.returncode == 0, result.output
    assert build_info(build)["options"]["VFA_PRESET"] == {"value": "full", "origin": "cmake"}
    assert len(units(build)["_vendored_fa3_C"]) == 194
    assert "VFA_PRESET" not in cache_entries(build)

    # ...and only for it: the next one without -D takes the environment, and says
    # that the earlier -D is gone (what a rerun of CMake by ninja would see too).
    build, result = configured(tmp_path, pin_and_cache, env=env_of(VFA_PRESET="minimal"))
    assert result.returncode == 0, result.output
    assert build_info(build)["preset"] == "minimal"
    assert len(units(build)["_vendored_fa3_C"]) == 12
    assert ("VFA_PRESET was given as -DVFA_PRESET to the previous configure of this build dir, but not "
            "to this one, so it is now 'minimal' (env:VFA_PRESET)") in result.text


def test_build_info_records_every_knob_as_normalised(tmp_path, sources):
    """Every declared build knob, its normalised value and its origin; bool words in
    any case; an empty FA3 selection leaves FA3 out (VFA_BUILD_FA3=auto)."""
    env = clean_env(VFA_FA2_PTX="no", VFA_FA2_SM90_SASS="Yes", TORCH_CUDA_ARCH_LIST="9.0",
                    VFA_PRESTE="minimal", VFA_ALLOW_UNKNOWN_SETTINGS="yes", VFA_DEBUG_CHECKS="1",
                    VFA_TORCH_VERSION="2.14.1",
                    # Credentials in the environment (in a -D they are refused: tests/build/test_sources.py).
                    FLASH_ATTN_MIRROR="https://user:token@mirror.example/fa.git")
    build, result = configured(tmp_path, sources, env=env, VFA_PRESET="minimal", VFA_FA3_HEAD_DIMS="none",
                               VFA_FA2_HEAD_DIMS="256 , 128")
    assert result.returncode == 0, result.output
    info = build_info(build)
    options = info["options"]
    assert set(options) == {k.name for k in declaration.load().scope("build")}
    assert options["VFA_FA2_PTX"] == {"value": "OFF", "origin": "env:VFA_FA2_PTX"}
    assert options["VFA_FA2_SM90_SASS"] == {"value": "ON", "origin": "env:VFA_FA2_SM90_SASS"}
    assert options["VFA_FA2_HEAD_DIMS"] == {"value": "128;256", "origin": "cmake"}
    assert options["NVCC_THREADS"] == {"value": "1", "origin": "default"}
    assert options["VFA_BUILD_MEMORY_MB"]["value"].isdigit()  # the computed default
    assert info["fa2"]["gencode"] == ["sm_90"] and info["fa2"]["head_dims"] == [128, 256]
    # Paths of the build machine and URLs (credentials!) stay out of the wheel.
    assert options["VFA_PIN_FILE"] == {"value": "(not recorded)", "origin": "cmake"}
    assert options["FLASH_ATTN_MIRROR"] == {"value": "(not recorded)", "origin": "env:FLASH_ATTN_MIRROR"}
    assert options["FLASH_ATTN_SRC_DIR"] == {"value": "", "origin": "default"}
    assert "token" not in json.dumps(info) and str(tmp_path) not in json.dumps(options)
    # The typo (allowed with VFA_ALLOW_UNKNOWN_SETTINGS) is in the build info too; knobs of
    # other scopes are not typos.
    assert info["unknown_settings"] == [{"name": "VFA_PRESTE", "source": "env", "did_you_mean": "VFA_PRESET"}]
    # VFA_BUILD_FA3=auto with nothing selected: left out, with the reason.
    assert info["fa3"]["built"] is False
    assert info["fa3"]["reason"] == "the selection has no FA3 HEAD_DIMS (VFA_FA3_HEAD_DIMS is empty)"
    assert "_vendored_fa3_C" not in units(build)


def test_unknown_settings_stop_with_a_did_you_mean(synthetic, tmp_path):
    """A typo stops before anything is fetched (pip would hide a warning: test_wheel.py);
    VFA_ALLOW_UNKNOWN_SETTINGS=ON makes it a loud warning."""
    pin = synthetic.write_pin(tmp_path / "pin.json")
    env = clean_env(VFA_PRESTE="minimal", VFA_XYZZY="1", VFA_DEBUG_CHECKS="1", VFA_VERSION_LOCAL="0")
    defines = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(tmp_path / "cache"),
               "VFA_SOURCE_CACHEE": "/elsewhere", "VFA_FA2_PTXX:BOOL": "OFF"}
    stopped = fetch_sources(defines, env=env)
    assert not (tmp_path / "cache").exists()
    allowed = fetch_sources({**defines, "VFA_ALLOW_UNKNOWN_SETTINGS": "ON"}, env=env)
    assert stopped.returncode != 0 and "CMake Error" in stopped.output
    assert ("Stopped before anything is fetched or built: a misspelt knob would build something else than was "
            "asked. Correct or remove it (the knobs are listed in docs/knobs.md, cmake/knobs.json), or set "
            "VFA_ALLOW_UNKNOWN_SETTINGS=ON to build with it ignored.") in stopped.text
    assert allowed.returncode == 0, allowed.output
    assert "CMake Warning" in allowed.output and "=====" in allowed.output  # loud, not a status line
    assert "It is ignored (VFA_ALLOW_UNKNOWN_SETTINGS=ON)" in allowed.text
    for result in (stopped, allowed):
        text = result.text
        assert "VFA_PRESTE (environment variable) is not a knob of this project: did you mean VFA_PRESET?" in text
        assert "VFA_SOURCE_CACHEE (-D variable) is not a knob of this project: did you mean VFA_SOURCE_CACHE?" in text
        # A typed -D (as `option()` users write it) is a setting like any other.
        assert "VFA_FA2_PTXX (-D variable) is not a knob of this project: did you mean VFA_FA2_PTX?" in text
        assert "VFA_XYZZY (environment variable) is not a knob of this project" in text
        assert "VFA_XYZZY (environment variable) is not a knob of this project: did you mean" not in text
        for known in ("VFA_DEBUG_CHECKS", "VFA_VERSION_LOCAL", "VFA_SOURCE_CACHE ", "VFA_PIN_FILE",
                      "VFA_ALLOW_UNKNOWN_SETTINGS"):
            assert f"{known} (" not in text


def test_relative_paths_are_relative_to_the_project_root(synthetic, tmp_path):
    """The same relative VFA_PIN_FILE / VFA_SOURCE_CACHE in a configure and in
    `cmake -P cmake/fetch_sources.cmake` run from anywhere: both from the project root."""
    pin = synthetic.write_pin(tmp_path / "pin.json")
    cache = tmp_path / "cache"
    relative = {"VFA_PIN_FILE": os.path.relpath(pin, PROJECT), "VFA_SOURCE_CACHE": os.path.relpath(cache, PROJECT)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [f"-D{k}={v}" for k, v in relative.items()]
    result = run([tool("cmake"), *args, "-P", str(PROJECT / "cmake/fetch_sources.cmake")], cwd=elsewhere)
    assert result.returncode == 0, result.output
    assert result.sources()["flash_attention"]["source_dir"].startswith(str(cache))
    assert not list(elsewhere.iterdir())


def _fake_driver_stub(tmp_path: Path) -> Path:
    stub = tmp_path / "toolkit" / "lib64" / "stubs" / "libcuda.so"
    stub.parent.mkdir(parents=True)
    stub.write_bytes(b"")  # configure only: nothing links against it
    return stub


def test_driver_calls_follow_the_machine_and_reach_cuda_units_only(tmp_path, sources):
    stub = _fake_driver_stub(tmp_path)
    # A toolkit with the driver stub (the manylinux CUDA images): upstream's way.
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", CUDA_cuda_driver_LIBRARY=str(stub))
    assert result.returncode == 0, result.output
    assert "CUTLASS driver calls: direct (auto: the toolkit has the driver stub; as upstream)" in result.output
    define = "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1"
    for module, commands in units(build).items():
        for name, command in commands.items():
            assert (define in command) == name.endswith(".cu"), (module, name)  # as upstream: not C++
    info = build_info(build)
    assert info["cuda_driver_call"] == {"mode": "direct", "reason": "auto: the toolkit has the driver stub; as upstream"}
    assert info["fa3"]["cuda_driver_call"] == "direct"
    assert str(stub) in (build / "build.ninja").read_text()  # libcuda is linked

    # Forced off: neither the define nor libcuda, although the stub is there.
    build, result = configured(tmp_path / "none", sources, VFA_PRESET="minimal", VFA_CUDA_DRIVER_CALL="entry_point",
                               CUDA_cuda_driver_LIBRARY=str(stub))
    assert result.returncode == 0, result.output
    assert "CUTLASS driver calls: entry_point (VFA_CUDA_DRIVER_CALL=entry_point)" in result.output
    assert not [n for c in units(build).values() for n, cmd in c.items() if "DIRECT_CUDA_DRIVER_CALL" in cmd]
    assert str(stub) not in (build / "build.ninja").read_text()


def test_direct_driver_calls_without_a_driver_library_stop(tmp_path, sources):
    """Where the toolkit has no stub (CI's machine) `direct` must stop, not fall back."""
    build, result = configured(tmp_path, sources, VFA_PRESET="minimal", VFA_CUDA_DRIVER_CALL="direct")
    if result.returncode == 0:  # a machine with libcuda: it must then really be direct
        assert build_info(build)["cuda_driver_call"]["mode"] == "direct"
    else:
        assert "VFA_CUDA_DRIVER_CALL=direct, but this machine has no libcuda" in result.text
        assert "VFA_CUDA_DRIVER_CALL=auto" in result.text



def test_an_arch_nothing_runs_on_stops_the_configure(tmp_path, sources):
    """The reported case through a whole configure: FA2 asked for, no PTX, a GPU newer than
    its SASS. The other arch cases run in script mode: tests/unit/test_cuda_archs_cmake_cpu.py."""
    # FA4 off: it would serve 10.0 (a wheel of FA4 alone), and FA2=on would then stop the
    # configure with its own reason
    _, result = configured(tmp_path, sources, VFA_PRESET="minimal", TORCH_CUDA_ARCH_LIST="10.0",
                           VFA_FA2_PTX="OFF", VFA_BUILD_FA2="on", VFA_BUILD_FA4="off")
    assert result.returncode != 0, result.output
    assert ("TORCH_CUDA_ARCH_LIST='10.0' names 10.0, but nothing this build compiles would run there: "
            "FA2 is sm_80 SASS only, which runs on 8.x GPUs; its compute_80 PTX, which newer GPUs run, is "
            "left out by VFA_FA2_PTX=OFF (set VFA_FA2_PTX=ON)") in result.text, result.output[-3000:]
