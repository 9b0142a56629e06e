"""The figures the selector's defaults rest on (python/vendored_flash_attn/measured.json):
written by `benchmarks/serving.py --record` only, shown by `info`, and cited by the families
declaration's not_default reasons, which may quote no figure the file does not hold."""

from __future__ import annotations

import copy
import json
import re

import pytest

from runtime_fakes import AMPERE, HOPPER
from test_benchmarks_cpu import load
from vendored_flash_attn import cli
from vendored_flash_attn.declaration import knob_values as declaration, families
from vendored_flash_attn.selection import measured

serving = load("serving")


def test_the_shipped_file_is_well_formed_and_holds_only_recorded_entries():
    data = json.loads(measured.FILE.read_text())
    assert set(data) == {"about", "serving"}
    for major, entry in data["serving"].items():
        assert major.isdigit()
        assert {"gpu", "date", "command", "rows", "source", "workload"} <= set(entry), major
        assert entry["command"].startswith("python benchmarks/serving.py")


def test_not_default_reasons_quote_only_recorded_figures():
    """A reason that cites benchmarks/serving.py rests on a recorded entry for that GPU
    generation, and each 'N.NNN s' it quotes is one of that entry's figures."""
    data = measured.load()
    registry = families.parse(declaration.load())
    for family in registry:
        for major, text in family.not_default.items():
            if "serving.py" not in text:
                continue
            entry = measured.serving(major, data)
            assert entry is not None, f"{family.name}.not_default[{major}] cites serving.py, measured.json has no {major}"
            figures = {f"{v:.3f}" for rows in entry["rows"].values() for r in rows.values()
                       for v in r.values() if isinstance(v, float)}
            quoted = set(re.findall(r"(\d+\.\d{3}) s\b", text))
            assert quoted <= figures, f"{family.name}.not_default[{major}] quotes {sorted(quoted - figures)}"


def _result(num_requests=1000, quick=False, fa4_total=2.0):
    def row(variant, size, prefill, graph, total, err=0.002):
        return {"variant": variant, "page": "16" if size == 16 else "tile", "block_size": size, "status": "ok",
                "phases": {"prefill": {"gpu_s": prefill}, "decode_eager": {"gpu_s": graph * 1.1},
                           "decode_graph": {"gpu_s": graph}},
                "totals": {"eager_s": total * 1.05, "graphed_s": total}, "errors": [{"rel_l2": err}]}
    rows = [row("fa2", 16, 2.4, 0.9, 3.3), row("fa3", 16, 1.2, 0.7, 1.9), row("fa4", 16, 1.1, 0.8, fa4_total),
            row("fa3", 128, 1.1, 0.6, 1.7), row("fa2", 128, 2.2, 0.8, 3.0),
            {"variant": "fa4", "page": "tile", "block_size": 128, "status": "error", "note": "x"}]
    return {"machine": {"gpu": {"name": "NVIDIA H200", "capability": "9.0"}, "date": "2026-12-02T10:00:00+00:00",
                        "argv": ["benchmarks/serving.py", "--out", "/out/serving"], "git_commit": "abc"},
            "build_info": {"preset": "minimal", "_package_version": "2.7.2.post1"},
            "settings": {"quick": quick, "layers": 4, "pages": {"16": 16, "tile": 128}},
            "workload": {"num_requests": num_requests, "prompt": 2048, "output": 128},
            "rows": rows, "winners": {"16": {"prefill": {"bf16": "fa4"}, "total_graphed": {"bf16": "fa3"}}},
            "end_to_end": {"fa3_over_fa2": 1.07, "seed_fa3_over_fa2": 1.1116, "alpha_ms": 40.0}}


def test_record_writes_the_entry_and_prints_the_sentence_to_paste(tmp_path, capsys):
    run = tmp_path / "serving.json"
    run.write_text(json.dumps(_result()))
    target = tmp_path / "measured.json"
    target.write_text(measured.FILE.read_text())
    assert serving.main(["--record", str(run), "--measured", str(target)]) == 0
    data = json.loads(target.read_text())
    entry = data["serving"]["9"]
    assert entry["gpu"] == "NVIDIA H200" and entry["date"] == "2026-12-02"
    assert entry["command"] == "python benchmarks/serving.py --out DIR"  # no path of the machine it ran on
    assert set(entry["rows"]) == {"16", "128"} and "fa4" not in entry["rows"]["128"]  # its row failed
    assert entry["rows"]["16"]["fa3"]["total_graphed_s"] == 1.9 and entry["winners"]["16"]["prefill"] == "fa4"
    out = capsys.readouterr().out
    sentence = json.loads(next(line for line in out.splitlines() if line.startswith("  \"FA3 stays")).strip())
    assert "block size 16: prefill 1.100 s against 1.200 s" in sentence
    assert sentence.endswith("FA4 is faster in prefill at block size 16: the default needs a decision")
    # Pasted into the declaration, it passes the figures check against what was recorded.
    decl = copy.deepcopy(declaration.load())
    decl["families"]["fa4"]["not_default"]["9"] = sentence
    registry = families.parse(decl)
    for major, text in registry.by_name("fa4").not_default.items():
        figures = {f"{v:.3f}" for rows in entry["rows"].values() for r in rows.values() for v in r.values()
                   if isinstance(v, float)}
        assert set(re.findall(r"(\d+\.\d{3}) s\b", text)) <= figures
    # what info shows from it
    lines = measured.serving_lines(9, data)
    assert "block size 16: prefill FA4 1.100 < FA3 1.200 < FA2 2.400" in lines[1]
    assert "FA3/FA2 1.070x; vLLM's seed measurement 1.112x" in lines[-1]


@pytest.mark.parametrize("change", [dict(quick=True), dict(num_requests=200)])
def test_record_refuses_what_is_not_the_seed_run(tmp_path, capsys, change):
    run = tmp_path / "serving.json"
    run.write_text(json.dumps(_result(**change)))
    target = tmp_path / "measured.json"
    before = measured.FILE.read_text()
    target.write_text(before)
    assert serving.main(["--record", str(run), "--measured", str(target)]) == 1
    assert "not the seed workload" in capsys.readouterr().err
    assert target.read_text() == before  # nothing recorded


def test_info_shows_the_figures_of_the_gpus_generation(describe, monkeypatch, tmp_path):
    path = tmp_path / "measured.json"
    data = json.loads(measured.FILE.read_text())
    data["serving"]["9"] = serving.measured_entry(_result())[1]
    path.write_text(json.dumps(data))
    monkeypatch.setattr(measured, "FILE", path)
    measured.load.cache_clear()
    try:
        describe(caps=(HOPPER, AMPERE), device_type="cuda")
        report = cli.collect()
        text = cli.render(report)
    finally:
        measured.load.cache_clear()
    assert report["measured"]["serving"]["9"]["gpu"] == "NVIDIA H200" and report["measured"]["serving"]["8"] is None
    assert "Measured for the defaults (measured.json)" in text
    assert "compute capability 9.x: serving replay (benchmarks/serving.py, NVIDIA H200, 2026-12-02" in text
    assert "compute capability 8.x: serving replay (benchmarks/serving.py): not measured" in text


def test_a_broken_file_is_reported_not_raised(tmp_path):
    path = tmp_path / "measured.json"
    path.write_text("{not json")
    data = measured.load.__wrapped__(path)
    assert "error" in data
    assert measured.serving_lines(9, data)[0].startswith("measured figures unreadable")
