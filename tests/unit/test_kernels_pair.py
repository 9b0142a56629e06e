"""benchmarks/kernels_pair.py's comparison: each row's median over rounds, B over A, a row slower
beyond the bound or missing from one build named."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_pair.py"
_spec = importlib.util.spec_from_file_location("vfa_bench_kernels_pair", _path)
kernels_pair = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kernels_pair
_spec.loader.exec_module(kernels_pair)


def _run(**medians):
    return {"rows": [{"case": case, "impl": "fa2", "status": "ok", "median_ms": ms} for case, ms in medians.items()]
            + [{"case": "varlen_8k_full", "impl": "fa4", "status": "not built", "median_ms": None}]}


def test_medians_over_rounds_and_the_ratio():
    result = kernels_pair.compare([_run(varlen_8k_full=1.00), _run(varlen_8k_full=1.04), _run(varlen_8k_full=0.98)],
                                  [_run(varlen_8k_full=1.005), _run(varlen_8k_full=1.003)], slower_pct=1.0)
    (row,) = result["rows"]
    assert row["a_ms"] == 1.00 and row["b_ms"] == 1.004 and abs(row["b_over_a"] - 1.004) < 1e-9
    assert result["ok"] and not row["slower"]


def test_a_row_slower_beyond_the_bound_or_missing_fails():
    slower = kernels_pair.compare([_run(a=1.0, b=2.0)], [_run(a=1.02, b=2.0)], slower_pct=1.0)
    assert slower["slower"] == ["a/fa2"] and not slower["ok"]
    missing = kernels_pair.compare([_run(a=1.0, b=2.0)], [_run(a=1.0)], slower_pct=1.0)
    assert missing["missing"] == ["b/fa2 (not in B)"] and not missing["ok"]


def test_options_after_the_two_builds_and_kernels_arguments_after_the_dashes_are_read(tmp_path, monkeypatch):
    """`A=DIR B=DIR --out R --rounds 1 -- --quick`: the options after the builds are the script's,
    what follows -- goes to kernels.py (on the GPU machine, argparse's REMAINDER took --out)."""
    import json
    import subprocess as sp

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    seen = []

    def fake_run(cmd, env, cwd, stdout):
        seen.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "kernels.json").write_text(json.dumps(_run(x=1.0)))
        return sp.CompletedProcess(cmd, 0)

    monkeypatch.setattr(kernels_pair.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["kernels_pair.py", f"A={a}", f"B={b}", "--out", str(tmp_path / "r"),
                                      "--rounds", "1", "--impls", "fa3", "--", "--quick"])
    assert kernels_pair.main() == 0
    assert [cmd[-3:] for cmd in seen] == [["--impls", "fa3", "--quick"]] * 2
    assert (tmp_path / "r" / "kernels-pair.json").is_file()
