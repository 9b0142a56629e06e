"""benchmarks/dist_model.py: the list-scheduling model of a cold build on a cluster."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("dist_model", Path(__file__).parents[2] / "benchmarks/dist_model.py")
model = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(model)


def test_units_spread_over_local_and_server_slots():
    units = [("fa3_inst", 60.0)] * 10
    assert model.simulate(units, 2, [], 0.0, 2) == 300.0        # 5 rounds of 2
    assert model.simulate(units, 2, [8], 0.0, 2) == 60.0        # one round on 10 slots
    assert model.simulate(units, 2, [8], 30.0, 8) == 90.0       # remote units pay the client overhead
    # ... and the client's cores bound those overheads: 8 remote units x 30 s on 2 cores.
    assert model.simulate(units, 2, [8], 30.0, 2) == 120.0


def test_server_slots_follow_memory_not_cores():
    assert model.slots_of(32, 256, 8) == 32 and model.slots_of(64, 256, 8) == 32 and model.slots_of(4, 2, 8) == 1


def test_ninja_log_kinds_and_table(tmp_path, capsys):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n"
                   "0\t100000\t0\tCMakeFiles/_vendored_fa3_C.dir/x/hopper/instantiations/flash_fwd_hdim128_bf16_sm90.cu.o\t1\n"
                   "0\t20000\t0\tCMakeFiles/_vendored_fa3_C.dir/x/hopper/flash_api.cpp.o\t2\n"
                   "0\t50000\t0\tCMakeFiles/_vendored_fa2_C.dir/x/csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu.o\t3\n"
                   "0\t30000\t0\tCMakeFiles/_vendored_fa3_C.dir/x/hopper/flash_prepare_scheduler.cu.o\t4\n")
    out = tmp_path / "m.json"
    assert model.main(["--ninja-log", str(log), "--client-overhead-s", "5", "--client-cores", "4",
                       "--client-memory-gb", "16", "--server", "8x64", "--servers", "0,2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["unit_s"] == {"fa3_inst": 100.0, "cxx": 20.0, "fa2_cuda": 50.0, "fa3_other": 30.0}
    zero, two = result["rows"]
    assert zero["slots"] == 2 and two["slots"] == 2 + 2 * 8 and two["minutes"] < zero["minutes"]
    assert "| build servers | slots | cold build (min) |" in capsys.readouterr().out


def test_missing_inputs_are_named():
    with pytest.raises(SystemExit):
        model.main(["--client-cores", "4", "--client-memory-gb", "16", "--unit-s", "fa3_inst=1"])
