"""benchmarks/dist_model.py: the `full` build modelled from measured units only, the
module units' recorded times, and the slice step's --forbid-skip arguments."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SPEC = importlib.util.spec_from_file_location("dist_model", ROOT / "benchmarks/dist_model.py")
model = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(model)

FA3_DIR = "CMakeFiles/_vendored_fa3_C.dir/x/hopper"
FA2_DIR = "CMakeFiles/_vendored_fa2_C.dir/x/csrc/flash_attn"
ALL_MODULE_UNITS = [*model.MODULE_UNITS["fa3"], *model.MODULE_UNITS["fa2"]]


def full_instantiations() -> list[str]:
    return [n for _m, n in model.kernel_units({"VFA_PRESET": "full"})]


@pytest.mark.parametrize("info,expected", [
    ({"fa2": {"built": True}, "fa3": {"built": True}}, ["--forbid-skip", "FA2 not usable", "--forbid-skip",
                                                         "FA3 not usable"]),
    # fa3-hd192 / fa3-hd64: FA2 left out, its tests skip with "this wheel was built without FA2"
    ({"fa2": {"built": False, "reason": "VFA_BUILD_FA2=off"}, "fa3": {"built": True}}, ["--forbid-skip",
                                                                                         "FA3 not usable"]),
    ({"fa2": {"built": True}, "fa3": {"built": False}}, ["--forbid-skip", "FA2 not usable"]),
])
def test_forbidden_skips_follow_the_build_info(tmp_path, capsys, info, expected):
    assert model.forbid_skips(info) == expected
    path = tmp_path / "build_info.json"
    path.write_text(json.dumps(info))
    assert model.main(["--slice-forbid-skips", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == expected


def test_module_units_are_recorded_beside_the_instantiations(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n"
                   f"0\t150000\t0\t{FA3_DIR}/instantiations/flash_fwd_hdim192_bf16_sm90.cu.o\t1\n"
                   f"0\t111500\t0\t{FA3_DIR}/flash_fwd_combine.cu.o\t2\n"
                   f"0\t7300\t0\t{FA3_DIR}/flash_api.cpp.o\t3\n"
                   f"0\t3200\t0\t{FA2_DIR}/flash_api.cpp.o\t4\n"
                   f"0\t900\t0\tCMakeFiles/_vendored_fa2_C.dir/x/generated/fa2_missing_kernels_94ce.cpp.o\t5\n"
                   "0\t300\t0\t_vendored_fa3_C.abi3.so\t6\n")
    table = tmp_path / "times.json"
    added = model.record_unit_times(log, "test run", table)
    assert list(added) == ["flash_fwd_hdim192_bf16_sm90.cu"]
    modules = model.load_module_unit_times(table)
    assert {k: v["s"] for k, v in modules.items()} == {
        "flash_fwd_combine.cu": 111.5, "flash_api.cpp (fa3)": 7.3, "flash_api.cpp (fa2)": 3.2,
        model.FA2_STUBS: 0.9}


def test_full_build_has_273_compiles_and_no_stubs():
    all_fa2 = {n for m, n in model.kernel_units({"VFA_PRESET": "full", "VFA_BUILD_FA3": "OFF"}) if m == "fa2"}
    units = model.build_units({"VFA_PRESET": "full"}, all_fa2)
    assert len(units) == 273 and model.FA2_STUBS not in [n for _m, n, _k in units]
    narrowed = model.build_units({"VFA_PRESET": "full", "VFA_FA2_HEAD_DIMS": "32"}, all_fa2)
    assert model.FA2_STUBS in [n for _m, n, _k in narrowed]


def test_full_build_uses_measured_units_and_lists_the_rest():
    names = full_instantiations()
    measured = {n: {"s": 100.0, "run": "r"} for n in names}
    modules = {n: {"s": 10.0, "run": "r"} for n in ALL_MODULE_UNITS}
    everything = model.model_full_build(measured, modules, [(16, 125.0)], [0], (32, 256.0), 18.0, 0.0)
    assert everything["measured_units"] == 273 and everything["modelled_units"] == []
    # 266 units of 100 s over 15 slots: 18 rounds; the 7 module units fit in the last round's gaps
    assert everything["rows"][0]["minutes"] == round(18 * 100 / 60, 1)

    fa3 = next(n for n in names if n.endswith("_sm90.cu"))
    fa2 = next(n for n in names if not n.endswith("_sm90.cu"))
    some = {fa3: {"s": 200.0, "run": "a"}, fa2: {"s": 50.0, "run": "b"}}
    partial = model.model_full_build(some, modules, [(16, 125.0), (32, 251.0)], [0, 2], (32, 256.0), 18.0, 8.2)
    assert partial["measured_units"] == 2 + len(ALL_MODULE_UNITS)
    modelled = {u["unit"]: u for u in partial["modelled_units"]}
    assert len(modelled) == 264 and fa3 not in modelled and fa2 not in modelled
    assert {u["s"] for u in modelled.values() if u["kind"] == "fa3_inst"} == {200.0}
    assert {u["s"] for u in modelled.values() if u["kind"] == "fa2_cuda"} == {50.0}
    assert [(r["cores"], r["servers"]) for r in partial["rows"]] == [(16, 0), (16, 2), (32, 0), (32, 2)]
    groups = model.modelled_groups(partial["modelled_units"])
    assert groups["FA3 hdim64_512"] == 20 and groups["FA3 hdim192_128"] == 30
    with pytest.raises(ValueError, match="no measured unit of kind"):
        model.model_full_build({fa3: {"s": 1.0, "run": "a"}}, modules, [(16, 125.0)], [0], (32, 256.0), 0.0, 0.0)


def test_full_build_command_prints_the_table(tmp_path, capsys):
    out = tmp_path / "full.json"
    assert model.main(["--full-build", "--servers", "0,2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cold `full` build, 273 units" in text and "| build servers | 16 cores / 125 GB (min) |" in text
    result = json.loads(out.read_text())
    assert result["units"] == 273 and len(result["rows"]) == 4
