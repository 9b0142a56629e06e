"""Real wheel builds of the synthetic upstream with nvcc: contents, import, and
compiler-cache hits from a second checkout path and build dir."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

import pytest

from support.cmake_runner import checkout_copy, clean_env, free_port, run, tool

MODULES = ("_vendored_fa2_C", "_vendored_fa3_C")




@pytest.fixture(scope="module")
def sccache_env(tmp_path_factory):
    """A private sccache server (own port, own local cache dir) for this module."""
    root = tmp_path_factory.mktemp("sccache")
    env = clean_env(SCCACHE_DIR=str(root / "cache"), SCCACHE_SERVER_PORT=str(free_port()),
                    SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="", SCCACHE_ERROR_LOG=str(root / "server.log"))
    yield env
    run([tool("sccache"), "--stop-server"], env=env)


def stats(env) -> dict:
    out = run([tool("sccache"), "--show-stats", "--stats-format=json"], env=env)
    assert out.returncode == 0, out.output
    return json.loads(out.stdout)["stats"]


def hit_rate(s: dict) -> tuple[int, int]:
    hits = sum(s["cache_hits"]["counts"].values())
    misses = sum(s["cache_misses"]["counts"].values())
    return hits, misses


def pip_wheel(project: Path, out: Path, env: dict, knobs: dict[str, str]):
    config = [f"-Ccmake.define.{k}={v}" for k, v in knobs.items()]
    return run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                "-w", str(out), *config, "-Cbuild.verbose=true", str(project)], env=env, timeout=3000)


def build_wheel(project: Path, out: Path, env: dict, knobs: dict[str, str]) -> tuple[Path, str]:
    result = pip_wheel(project, out, env, knobs)
    assert result.returncode == 0, result.output[-8000:]
    wheels = list(out.glob("vendored_flash_attn-*.whl"))
    assert len(wheels) == 1
    return wheels[0], result.output


@pytest.fixture(scope="module")
def built(synthetic, sccache_env, tmp_path_factory):
    """The README's quick start after a typo: a refused -C cmake.define.VFA_PRESET, then
    VFA_PRESET=minimal in the environment, in the same checkout (same build dir)."""
    root = tmp_path_factory.mktemp("wheel")
    pin = synthetic.write_pin(root / "pin.json")
    knobs = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(root / "source-cache")}
    first_checkout = checkout_copy(root / "checkout-a")
    refused = pip_wheel(first_checkout, root / "dist-a", sccache_env, {**knobs, "VFA_PRESET": "minmal"})
    env = {**sccache_env, "VFA_PRESET": "minimal"}
    wheel, log = build_wheel(first_checkout, root / "dist-a", env, knobs)
    first = stats(sccache_env)
    return {"root": root, "knobs": knobs, "env": env, "wheel": wheel, "log": log, "first": first,
            "refused": refused}


def test_pip_without_v_shows_a_typo_and_builds_nothing(synthetic, tmp_path):
    """pip shows a build's output only when it fails: a misspelt knob must fail (in the
    configure's first seconds), or a user without -v would never see it."""
    knobs = {"VFA_PIN_FILE": str(synthetic.write_pin(tmp_path / "pin.json")),
             "VFA_SOURCE_CACHE": str(tmp_path / "source-cache")}
    config = [f"-Ccmake.define.{k}={v}" for k, v in knobs.items()]
    result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                  str(tmp_path / "dist"), *config, str(checkout_copy(tmp_path / "checkout"))],
                 env=clean_env(VFA_PRESTE="minimal"), timeout=600)
    assert result.returncode != 0
    assert "VFA_PRESTE (environment variable) is not a knob of this project: did you mean VFA_PRESET?" \
        in result.text, result.output[-5000:]
    assert "VFA_ALLOW_UNKNOWN_SETTINGS=ON" in result.text
    assert not (tmp_path / "source-cache").exists() and not list((tmp_path / "dist").glob("*.whl"))


def test_a_refused_knob_does_not_stick_to_the_build_dir(built):
    refused = built["refused"]
    assert refused.returncode != 0
    assert "VFA_PRESET: 'minmal' is not a valid value (given as -DVFA_PRESET" in refused.text
    info = json.loads(zipfile.ZipFile(built["wheel"]).read("vendored_flash_attn/build_info.json"))
    assert info["preset"] == "minimal"
    assert info["options"]["VFA_PRESET"] == {"value": "minimal", "origin": "env:VFA_PRESET"}


def test_wheel_holds_both_modules_and_the_build_info(built, synthetic):
    wheel = built["wheel"]
    assert "-cp310-abi3-" in wheel.name and "linux_x86_64" in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    for module in MODULES:
        assert f"vendored_flash_attn/{module}.abi3.so" in names
    assert "vendored_flash_attn/build_info.json" in names
    assert "vendored_flash_attn/knobs.json" in names  # the declaration the package reads (declaration/knob_values.py)
    assert "vendored_flash_attn/__init__.py" in names
    info = json.loads(zipfile.ZipFile(wheel).read("vendored_flash_attn/build_info.json"))
    assert info["preset"] == "minimal"
    assert info["upstream"]["commit"] == synthetic.fa_commit and info["upstream"]["matches_pin"] is True
    assert info["cutlass"]["commit"] == synthetic.cutlass_commit
    assert info["fa3"]["built"] and info["fa2"]["built"]
    # Nothing of this machine's paths in the package's own record of knobs.
    assert str(built["root"]) not in json.dumps(info["options"])
    # The build dir's record holds this machine's readings too; the wheel's leaves them out.
    local = json.loads(next((built["root"] / "checkout-a" / "build").glob("*/build_info.json")).read_text())
    assert local["compiler_cache"]["enabled"] is True and local["build"]["jobs"] >= 1
    assert local["options"]["VFA_BUILD_MEMORY_MB"]["value"].isdigit()
    assert "compiler_cache" not in info and "jobs" not in info["build"]
    assert info["options"]["VFA_BUILD_MEMORY_MB"] == {"value": "(not recorded)", "origin": "default"}


def test_modules_load_and_register_their_ops(built, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(built["wheel"]).extractall(site)
    code = (
        "import torch, importlib\n"
        "for m in ('_vendored_fa2_C', '_vendored_fa3_C'):\n"
        "    importlib.import_module('vendored_flash_attn.' + m)\n"
        "print(torch.ops._vendored_fa2_C.varlen_fwd.default._schema)\n"
        "print(torch.ops._vendored_fa3_C.fwd.default._schema)\n"
    )
    result = run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(site)))
    assert result.returncode == 0, result.output
    assert "_vendored_fa2_C::varlen_fwd(" in result.stdout
    assert "_vendored_fa3_C::fwd(" in result.stdout

    # `info` reports the knobs as build_info.json holds them.
    info = run([sys.executable, "-m", "vendored_flash_attn", "info", "--json"], env=clean_env(PYTHONPATH=str(site)))
    assert info.returncode == 0, info.output
    build = json.loads(info.stdout)["build"]
    assert build["options"]["VFA_PRESET"] == {"value": "minimal", "origin": "env:VFA_PRESET"}
    assert build["options"] == json.loads(zipfile.ZipFile(built["wheel"]).read(
        "vendored_flash_attn/build_info.json"))["options"]


def test_build_says_what_the_compiler_cache_answered_and_logs_its_statistics(built):
    """Issue 29: sccache's 37-line statistics table ended every build on the console: one line
    there, the table in the compile log."""
    log = built["log"]
    assert "vendored-flash-attn: compiler cache: 0 of 22 units from the cache (CUDA 0/16, C++ 0/6)" in log, \
        log[-3000:]
    assert "Compile requests" not in log and "Cache hits rate" not in log
    compile_log = next((built["root"] / "checkout-a" / "build").glob("*/vfa-compile.log")).read_text()
    assert "==> sccache --show-stats" in compile_log and "Cache hits rate" in compile_log


@pytest.fixture(scope="module")
def second(built, sccache_env):
    """The same selection again from another checkout path and build dir, warm cache."""
    run([tool("sccache"), "--zero-stats"], env=sccache_env)
    wheel, log = build_wheel(checkout_copy(built["root"] / "checkout-b"), built["root"] / "dist-b",
                             built["env"], built["knobs"])
    return {"wheel": wheel, "log": log, "stats": stats(sccache_env)}


def test_second_checkout_and_build_dir_hit_the_compiler_cache(built, second):
    hits_before, misses_before = hit_rate(built["first"])
    assert misses_before > 0, "the first build must have compiled something"
    hits, misses = hit_rate(second["stats"])
    assert hits > 0
    # Every unit, the generated FA2 file included (staged by content, not in the build dir).
    assert misses == 0, f"{hits} hits, {misses} misses"
    assert second["wheel"].name == built["wheel"].name


def wheel_members(wheel: Path) -> dict[str, tuple]:
    with zipfile.ZipFile(wheel) as z:
        return {i.filename: (i.date_time, i.external_attr, hashlib.sha256(z.read(i)).hexdigest())
                for i in z.infolist()}


def test_the_same_selection_gives_the_same_wheel_bytes(built, second):
    """Two checkout paths, two build dirs, another machine state: one wheel (docs/build.md, What a build records)."""
    first, again = wheel_members(built["wheel"]), wheel_members(second["wheel"])
    differ = sorted(n for n in first.keys() | again.keys() if first.get(n) != again.get(n))
    detail = ""
    if "vendored_flash_attn/build_info.json" in differ:
        a, b = (json.loads(zipfile.ZipFile(w).read("vendored_flash_attn/build_info.json"))
                for w in (built["wheel"], second["wheel"]))
        detail = json.dumps(_json_differences(a, b), indent=1)
    assert not differ, f"members that differ: {differ}\n{detail}"
    assert built["wheel"].read_bytes() == second["wheel"].read_bytes()
    # Both builds ran one venv: its location must not be in the wheel either (FA4's record
    # named the build's Python by path), or another venv would give other bytes.
    with zipfile.ZipFile(built["wheel"]) as z:
        for name in z.namelist():
            if name.endswith(".json"):
                text = z.read(name).decode()
                assert not [p for p in {sys.prefix, sys.base_prefix, sys.executable} if p in text], name


def _json_differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        found = {}
        for key in a.keys() | b.keys():
            found.update(_json_differences(a.get(key), b.get(key), f"{path}.{key}"))
        return found
    return {} if a == b else {path: [a, b]}


def test_the_build_shows_progress_and_keeps_compiler_output_in_a_log(built):
    """Through pip -v with sccache: the console-pool monitor reports, the log has every unit."""
    log = built["log"]
    assert re.search(r"\[vfa \d+:\d\d\] compiling 22 units, \d+ at a time", log), log[-5000:]
    # A cold build: every unit compiled, each with its line (one the cache answered would have none).
    assert re.search(r"\[vfa \d+:\d\d\] compiled flash_fwd_hdim128_\w+_sm90\.cu \(FA3 CUDA\) in ", log)
    assert re.search(r"\[vfa \d+:\d\d\] 22/22 compiled in [\d:]+, 0 from the compiler cache", log)
    assert "Added CUDA NVCC flags" not in log  # torch's -gencode list, which this build replaces
    assert re.search(r"FA3 8 kernels .* for sm_90a", log)
    compile_log = next((built["root"] / "checkout-a" / "build").glob("*/vfa-compile.log"))
    assert compile_log.read_text().count("==> CMakeFiles/") == 22
