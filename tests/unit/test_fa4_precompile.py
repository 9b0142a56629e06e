"""The build steps of cmake/fa4_precompile.py that FA4Package.cmake runs, on a CPU with no
cutlass: the probe, FA4's build record, and a precompile that must not fail a build that
did not ask for it (VFA_FA4_PRECOMPILE=auto)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from support.synthetic_upstream import fa4_cute_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def precompile():
    spec = importlib.util.spec_from_file_location("fa4_precompile_steps", ROOT / "cmake" / "fa4_precompile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def staged(precompile, tmp_path, monkeypatch):
    import vendored_flash_attn

    # `compile` adds the stage to our package's search path: keep that out of other tests.
    monkeypatch.setattr(vendored_flash_attn, "__path__", list(vendored_flash_attn.__path__))
    src = tmp_path / "upstream"
    for rel, text in fa4_cute_files().items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dest = tmp_path / "stage"
    configure = {"sources": {"commit": "c" * 40, "verified": True}, "precompile": {"mode": "auto", "runs": []}}
    summary = precompile.stage(src / "flash_attn/cute", dest)
    return dest, precompile.write_record(dest, configure, summary)


def test_the_record_holds_configure_facts_and_what_was_staged(staged):
    dest, record = staged
    assert record == dest / "vendored_flash_attn/_fa4/build_info.json"
    data = json.loads(record.read_text())
    assert data["sources"] == {"commit": "c" * 40, "verified": True}
    assert data["staged"] == {"files": 8, "bytes": data["staged"]["bytes"], "rewritten": 3}
    assert data["package"] == "vendored_flash_attn._fa4.cute"


def test_probe_says_why_kernels_cannot_be_precompiled_here(precompile):
    found = precompile.probe()
    assert found["stage"] == ""
    assert "nvidia-cutlass-dsl is not installed" in found["precompile"]


def test_a_best_effort_precompile_that_fails_warns_ships_nothing_and_records_why(precompile, staged, capsys):
    dest, record = staged
    out = dest / "vendored_flash_attn/_fa4/kernels"
    out.mkdir()
    code = precompile.main(["compile", "--stage", str(dest), "--out", str(out), "--arch", "sm_90a",
                            "--record", str(record), "--best-effort"])
    assert code == 0
    assert not list(out.rglob("*.o"))
    assert "WARNING: vendored-flash-attn: FA4 kernels for sm_90a (Python " in capsys.readouterr().out
    run = json.loads(record.read_text())["precompile"]["runs"]
    assert len(run) == 1 and run[0]["arch"] == "sm_90a" and run[0]["kernels"] == 0
    assert "cutlass" in run[0]["error"]


def test_a_failed_best_effort_run_removes_its_own_kernels_only(precompile, staged, monkeypatch):
    # Several Pythons (and archs) compile into one folder: a run that fails halfway takes
    # back what it wrote, and leaves the kernels of the runs before it.
    dest, record = staged
    out = dest / "vendored_flash_attn/_fa4/kernels"
    earlier = out / "cu12.9/fp-py310/fwd/earlier.o"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"kernel of another Python")

    def half_done(stage_root, out_dir, arch, calls, **kwargs):
        partial = out_dir / "cu12.9/fp-py311/fwd/partial.o"
        partial.parent.mkdir(parents=True)
        partial.write_bytes(b"half")
        raise RuntimeError("the DSL died")

    monkeypatch.setattr(precompile, "compile_selection", half_done)
    assert precompile.main(["compile", "--stage", str(dest), "--out", str(out), "--arch", "sm_90a",
                            "--record", str(record), "--best-effort"]) == 0
    assert [p.name for p in out.rglob("*.o")] == ["earlier.o"]


def test_an_asked_for_precompile_that_fails_fails(precompile, staged):
    dest, record = staged
    with pytest.raises(ModuleNotFoundError, match="cutlass"):
        precompile.main(["compile", "--stage", str(dest), "--out", str(dest / "k"), "--arch", "sm_90a"])


def test_a_run_in_workers_counts_each_kernel_once(precompile):
    # With workers sharing the output folder, a call's before/after listing can also hold a
    # kernel another worker wrote (and the split-KV combine kernel is reached by many calls).
    call = {"error": None, "refused": None}
    report = {"flavour": "cu12.9", "python": "3.12", "cutlass": "4.6.0.dev0", "tvm_ffi": "0.1.15", "fingerprint": "f",
              "jobs": 2, "calls": [{**call, "call": "a", "objects": {"fwd/a.o": 10, "fwd_combine/c.o": 5}},
                                   {**call, "call": "b", "objects": {"fwd/b.o": 20, "fwd_combine/c.o": 5}},
                                   {**call, "call": "c", "objects": {"fwd/b.o": 20}}]}
    summary = precompile._run_summary("sm_90a", report, [], precompile.Selection())
    assert (summary["kernels"], summary["bytes"], summary["calls"], summary["jobs"]) == (3, 35, 3, 2)
