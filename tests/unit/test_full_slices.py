"""The slices of the `full` preset (benchmarks/full_slices.json): every kernel exactly once."""

from __future__ import annotations

import collections
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SPEC = importlib.util.spec_from_file_location("dist_model", ROOT / "benchmarks/dist_model.py")
model = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(model)


def test_slices_cover_every_full_unit_exactly_once():
    full = collections.Counter(model.kernel_units({"VFA_PRESET": "full"}))
    assert sum(full.values()) == 190 + 76 and max(full.values()) == 1
    sliced = collections.Counter()
    for spec in model.load_slices().values():
        sliced.update(model.kernel_units(model.slice_knobs(spec)))
    twice = sorted(u for u, n in sliced.items() if n > 1)
    assert not twice, f"in more than one slice: {twice[:5]}"
    assert sliced == full, f"missing: {sorted(set(full) - set(sliced))[:5]}, extra: {sorted(set(sliced) - set(full))[:5]}"


def test_each_slice_is_modelled_within_fifteen_minutes_on_sixteen_cores():
    rows = model.model_slices(model.load_slices(), model.load_unit_times(), model.KIND_S_16_CORE, 16, 125.0,
                              model.FIXED_S)
    for row in rows:
        assert row["minutes"] <= 15.0, row


def test_slice_units_follow_the_build_rule():
    # The hdimdiff kernels come with their head dim, in every dtype upstream has them in.
    units = model.kernel_units({"VFA_PRESET": "full", "VFA_FA3_HEAD_DIMS": "64", "VFA_BUILD_FA2": "OFF"})
    names = {n for _m, n in units}
    assert "flash_fwd_hdim64_512_bf16_paged_split_softcap_sm90.cu" in names
    assert not any(n.startswith("flash_fwd_hdim64_512_e4m3") for n in names)
    assert all(m == "fa3" for m, _n in units) and len(units) == 64


def test_slice_defines_and_recorded_unit_times(tmp_path, capsys):
    assert model.main(["--slice-defines", "fa2-hd32-64"]) == 0
    assert capsys.readouterr().out.split() == ["-Ccmake.define.VFA_PRESET=full", "-Ccmake.define.VFA_BUILD_FA3=OFF",
                                               "-Ccmake.define.VFA_FA2_HEAD_DIMS=32,64"]
    with pytest.raises(SystemExit):
        model.main(["--slice-defines", "no-such-slice"])
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n"
                   "0\t90000\t0\tCMakeFiles/_vendored_fa3_C.dir/x/hopper/instantiations/flash_fwd_hdim96_bf16_sm90.cu.o\t1\n"
                   "0\t2000\t0\tCMakeFiles/_vendored_fa3_C.dir/x/hopper/flash_api.cpp.o\t2\n")
    table = tmp_path / "times.json"
    assert model.record_unit_times(log, "test run", table) == {"flash_fwd_hdim96_bf16_sm90.cu": {"s": 90.0, "run": "test run"}}
    assert json.loads(table.read_text())["units"]["flash_fwd_hdim96_bf16_sm90.cu"]["s"] == 90.0


def test_measured_unit_times_replace_the_kind_mean():
    spec = {"s": {"knobs": {"VFA_FA3_HEAD_DIMS": "96", "VFA_BUILD_FA2": "OFF"}}}
    names = [n for _m, n in model.kernel_units(model.slice_knobs(spec["s"]))]
    assumed = model.model_slices(spec, {}, model.KIND_S_16_CORE, 16, 125.0, 0.0)[0]
    slow = model.model_slices(spec, {n: {"s": 600.0} for n in names}, model.KIND_S_16_CORE, 16, 125.0, 0.0)[0]
    assert assumed["measured_units"] == 0 and slow["measured_units"] == 24
    assert slow["minutes"] == 20.0 and assumed["minutes"] < slow["minutes"]  # 2 rounds of 600 s on 15 jobs
