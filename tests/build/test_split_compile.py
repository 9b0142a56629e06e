"""VFA_NVCC_SPLIT_COMPILE (cmake/SplitCompile.cmake, issue 46): nvcc --split-compile on the units
that set a cold build's floor, on their own compile lines (so in the compiler cache's key), those
units first in the manifest, recorded in build_info.json; `off`, the default, leaves the compile
lines and their order as they were."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.cmake_runner import build_info, compile_commands, configure

# 16 jobs and room for them: the choice then depends on no reading of this machine.
PLAN = {"VFA_PRESET": "minimal", "MAX_JOBS": "16", "VFA_BUILD_MEMORY_MB": "262144"}
# minimal on 16 jobs: (4 x 311 + 2 x 189 + 2 x 330 + 6 x 153 + 2 x 54) / 16 = 206 s; the kinds at or
# above it are FA2's split-KV (311 s) and FA3's FP8 paged (330 s) (cmake/knobs.json, unit_kinds).
CRITICAL = {
    "_vendored_fa2_C": {f"flash_fwd_{k}hdim128_bf16{c}_sm80.cu" for k in ("split_", "split_align_")
                        for c in ("", "_causal")},
    "_vendored_fa3_C": {f"flash_fwd_hdim128_e4m3_{v}_sm90.cu" for v in ("paged", "paged_split")},
}


def lines(build: Path) -> list[tuple[str, str, str]]:
    """(module, file name, command) in compile_commands.json's order."""
    return [(re.search(r"-DTORCH_EXTENSION_NAME=(\w+)", e["command"]).group(1), Path(e["file"]).name, e["command"])
            for e in compile_commands(build)]


def manifest_order(build: Path) -> list[tuple[str, str]]:
    """(module, file name) of the object files' build statements in build.ninja's order (ninja
    starts the ready compiles of a pool in this order)."""
    found = []
    for line in (build / "build.ninja").read_text().splitlines():
        m = re.match(r"build CMakeFiles/(\w+)\.dir/(\S+\.(?:cu|cpp))\.o: ", line)
        if m:
            found.append((m.group(1), Path(m.group(2)).name))
    return found


@pytest.fixture(scope="module")
def off_build(sources, tmp_path_factory):
    """The default configure (the knob not set)."""
    build = tmp_path_factory.mktemp("split-off") / "build"
    result = configure(build, {**sources, **PLAN})
    assert result.returncode == 0, result.output
    return build


def test_off_is_the_default_and_changes_no_compile_line(off_build):
    info = build_info(off_build)
    assert info["options"]["VFA_NVCC_SPLIT_COMPILE"] == {"value": "off", "origin": "default"}
    assert info["split_compile"] == {"knob": "off", "threads": None, "units": [], "reason": "VFA_NVCC_SPLIT_COMPILE=off"}
    found = lines(off_build)
    assert not [name for _, name, cmd in found if "--split-compile" in cmd]
    # Today's order: each module's declared sources, then its instantiations in the selection's order
    # (the fixed sources first, not the longest units).
    fa3 = [name for module, name, _ in found if module == "_vendored_fa3_C"]
    assert fa3[:4] == ["flash_api.cpp", "flash_api_torch_lib.cpp", "flash_fwd_combine.cu", "flash_prepare_scheduler.cu"]


def test_a_thread_count_reaches_the_critical_units_lines_first_and_the_record(sources, tmp_path, off_build):
    build = tmp_path / "build"
    result = configure(build, {**sources, **PLAN, "VFA_NVCC_SPLIT_COMPILE": "4"})
    assert result.returncode == 0, result.output
    found = lines(build)
    split = {(module, name) for module, name, cmd in found if "--split-compile=4" in cmd}
    assert split == {(m, n) for m, names in CRITICAL.items() for n in names}
    # Those lines differ from off's by the flag alone (so the compiler cache, which hashes the
    # compile line, never serves one for the other), every other line is off's.
    off = {(module, name): cmd for module, name, cmd in lines(off_build)}
    assert len(off) == len(found)
    for module, name, cmd in found:
        if (module, name) in split:
            assert cmd != off[module, name]
            assert cmd.replace(" --split-compile=4", "") == off[module, name]
        else:
            assert cmd == off[module, name]
    # Longest first: in each module the critical units lead (ninja's order is the manifest's).
    order = manifest_order(build)
    for module, names in CRITICAL.items():
        first = [n for m, n in order if m == module][:len(names)]
        assert set(first) == names, (module, first)
    assert manifest_order(off_build) != order
    info = build_info(build)
    assert info["split_compile"]["knob"] == "4" and info["split_compile"]["threads"] == 4
    assert set(info["split_compile"]["units"]) == {f"{m}:{n}" for m, names in CRITICAL.items() for n in names}
    ideal = int(re.search(r"over 16 jobs: (\d+) s", info["split_compile"]["reason"]).group(1))
    assert 153 < ideal < 311
    assert "--split-compile=4 for" in result.text


def test_auto_splits_nothing_where_the_cores_give_each_critical_unit_one_thread(sources, tmp_path):
    """auto: N = min(8, cores / units, memory / (units x budget)); 6 critical units on this 2-core
    machine (or memory for one thread each) give N < 2: no unit split, the longest still first."""
    build = tmp_path / "build"
    result = configure(build, {**sources, **PLAN, "VFA_BUILD_MEMORY_MB": "60000", "VFA_NVCC_SPLIT_COMPILE": "AUTO"})
    assert result.returncode == 0, result.output
    split = build_info(build)["split_compile"]
    assert split["knob"] == "auto" and split["threads"] is None and split["units"] == []
    # 60000 MB over 6 units of 8192 MB (the FA3 ones) = 1 thread each.
    assert "60000 MB at 8192 MB a thread 1" in split["reason"] and "no unit is split" in split["reason"]
    assert not [e for e in compile_commands(build) if "--split-compile" in e["command"]]
    order = manifest_order(build)
    assert order.index(("_vendored_fa3_C", "flash_fwd_hdim128_e4m3_paged_sm90.cu")) < order.index(
        ("_vendored_fa3_C", "flash_api.cpp"))


@pytest.mark.parametrize("value", ["eight", "65"])
def test_a_malformed_value_is_refused_naming_the_allowed_ones(sources, tmp_path, value):
    result = configure(tmp_path / "build", {**sources, **PLAN, "VFA_NVCC_SPLIT_COMPILE": value})
    assert result.returncode != 0
    assert (f"VFA_NVCC_SPLIT_COMPILE: '{value}' is not a valid value" in result.text
            and "auto, off, or a thread count from 0 to 64" in result.text), result.output
