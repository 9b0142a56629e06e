"""CPU checks of the FA4 parts of the benchmarks (issue 17): kernels.py's FA4 rows, ratios
and "FA4 >= FA3 on every case" answer (run() with its GPU steps replaced), first_call.py's
cache states, bar and absent rows, import_time.py's lazy-import check and summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_benchmarks_cpu import ROOT, BENCH, load

kernels = load("kernels")
first_call = load("first_call")
import_time = load("import_time")
common = load("common")

PYTHON_DIR = ROOT / "python"


# --- kernels.py ------------------------------------------------------------------------

def test_every_case_runs_fa4_right_after_fa3_on_the_same_inputs():
    cases = kernels.all_cases()
    visits = kernels.plan_visits(cases, list(kernels.IMPLS))
    for case in cases:
        visit = next(v for v in visits if v[0][0] == case.name)
        impls = [impl for _, impl in visit]
        assert impls[:2] == ["fa3", "fa4"], (case.name, impls)
    # every (case, impl) planned once
    keys = [k for v in visits for k in v]
    assert len(keys) == len(set(keys))


def _row(case, impl, median_ms=None, status="ok", note=""):
    return {"case": case, "impl": impl, "status": status, "note": note, "median_ms": median_ms}


ALL = [c.name for c in kernels.all_cases()]


def test_fa4_versus_fa3_yes_only_when_every_case_ran_both_and_fa4_was_not_slower():
    rows = [r for n in ALL for r in (_row(n, "fa3", 1.0), _row(n, "fa4", 1.0 if n != ALL[0] else 0.9))]
    verdict = kernels.fa4_versus_fa3(rows, ALL, ALL)
    assert verdict["answer"] == "yes" and verdict["ratios"][ALL[0]] == pytest.approx(1 / 0.9)
    assert verdict["lowest"] == pytest.approx(1.0)


def test_fa4_versus_fa3_one_slower_case_answers_no():
    rows = [r for n in ALL for r in (_row(n, "fa3", 1.0), _row(n, "fa4", 1.0))]
    rows[-1]["median_ms"] = 1.01  # FA4 on the last case, 1 % slower
    verdict = kernels.fa4_versus_fa3(rows, ALL, ALL)
    assert verdict["answer"] == "no" and ALL[-1] in verdict["why"]
    # a slower case decides it even in a partial run
    assert kernels.fa4_versus_fa3(rows[-2:], ALL[-1:], ALL)["answer"] == "no"


def test_fa4_versus_fa3_is_undecided_when_fa4_is_absent_failed_or_cases_were_left_out():
    absent = [r for n in ALL for r in (_row(n, "fa3", 1.0),
                                       _row(n, "fa4", status="unavailable", note="no cutlass"))]
    verdict = kernels.fa4_versus_fa3(absent, ALL, ALL)
    assert verdict["answer"] == "undecided" and "FA4 unavailable (no cutlass)" in verdict["why"]
    fast = [r for n in ALL[:2] for r in (_row(n, "fa3", 1.0), _row(n, "fa4", 0.5))]
    verdict = kernels.fa4_versus_fa3(fast, ALL[:2], ALL)
    assert verdict["answer"] == "undecided" and verdict["cases_not_run"] == ALL[2:]
    failed = [r for n in ALL for r in (_row(n, "fa3", 1.0), _row(n, "fa4", 0.5))]
    failed[1] = _row(ALL[0], "fa4", status="error", note="boom")
    assert kernels.fa4_versus_fa3(failed, ALL, ALL)["answer"] == "undecided"


class _FakeInputs:
    def __init__(self, case, seed=0):
        self.case = case

    def nbytes(self):
        return 1 << 40  # larger than any L2: one input set


def _fake_gpu(monkeypatch, medians, absent=None, compiles=0):
    """run() with every GPU step replaced: FA3 at 1 ms, the others per ``medians``."""
    last = {}

    def make_call(impl, inp):
        def fn():
            last["impl"] = impl
            return impl
        fn.impl = impl
        return fn, (lambda o: o)

    def time_cuda(fns, **kwargs):
        impl = fns[0].impl
        ms = medians.get(impl, 1.0)
        return common.Timing(ms, ms * 0.99, ms * 1.01, ms * 0.98, 30, "fake")

    def time_first_call(fn):
        fn()
        return 3.0 if last["impl"] == "fa4" else 0.01

    user_cache = {"n": 0}

    def fa4_user_cache_kernels():
        value = user_cache["n"]
        user_cache["n"] += compiles  # every FA4 first call adds ``compiles`` kernels
        return value

    monkeypatch.setattr(kernels.common, "machine_info", lambda gpu=True: {"gpu": {"name": "fake"}})
    monkeypatch.setattr(kernels.common, "build_info_dict", lambda: {})
    monkeypatch.setattr(kernels.common, "measure_ceilings", lambda quick, timer: {
        "bf16_matmul_tflops": 800.0, "fp8_matmul_tflops": None, "copy_gbs": 4000.0})
    monkeypatch.setattr(kernels.common, "l2_bytes", lambda: 50 << 20)
    monkeypatch.setattr(kernels.common, "time_cuda", time_cuda)
    monkeypatch.setattr(kernels.common, "time_first_call", time_first_call)
    monkeypatch.setattr(kernels.common, "relative_l2", lambda a, b: 0.001)
    monkeypatch.setattr(kernels, "Inputs", _FakeInputs)
    monkeypatch.setattr(kernels, "make_call", make_call)
    monkeypatch.setattr(kernels, "availability", lambda impl: (absent or {}).get(impl))
    monkeypatch.setattr(kernels, "fa4_user_cache_kernels", fa4_user_cache_kernels)


def test_run_puts_fa4_beside_fa3_with_ratios_and_writes_the_answer_to_json(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch, {"fa4": 0.8, "sdpa": 1.25, "fa2": 2.0, "fa3_fp8": 0.7}, compiles=1)
    args = kernels.parse_args(["--out", str(tmp_path), "--timer", "events", "--plain"])
    result = kernels.run(args)
    fa4_rows = [r for r in result["rows"] if r["impl"] == "fa4"]
    assert {r["case"] for r in fa4_rows} == set(ALL) and all(r["status"] == "ok" for r in fa4_rows)
    row = fa4_rows[0]
    # the first call (a compile: one kernel added to the user cache) is timed apart, not in the median
    assert row["first_call_s"] == 3.0 and row["median_ms"] == 0.8
    assert row["extra"]["fa4_user_cache_new_kernels"] == 1 and "CuTe DSL compile" in row["note"]
    assert row["speedup_vs_fa3"] == pytest.approx(1.25)
    sdpa = next(r for r in result["rows"] if r["impl"] == "sdpa")
    assert sdpa["speedup_vs_fa3"] == pytest.approx(0.8)
    assert result["fa4_vs_fa3"]["answer"] == "yes" and result["absent"] == {}
    path = common.write_json(tmp_path / "kernels.json", result)
    assert json.loads(path.read_text())["fa4_vs_fa3"]["answer"] == "yes"
    kernels.print_results(result, plain=True)
    out = capsys.readouterr().out
    assert "FA4 >= FA3 on every case: yes" in out
    columns, table = kernels.side_by_side(result)
    assert columns[:3] == ["case", "FA2 us", "FA3 bf16 us"] and "FA4 bf16 us" in columns
    assert "FA4 vs FA3" in columns
    line = table[[c["name"] for c in result["cases"]].index(ALL[0])]
    assert line[columns.index("FA4 bf16 us")] == "800.0" and line[columns.index("FA4 vs FA3")] == "1.250x"


def test_an_absent_fa4_is_one_note_not_rows_and_leaves_the_answer_undecided(monkeypatch, tmp_path, capsys):
    reason = "unavailable: FA4 failed to load: FA4DependencyError: nvidia-cutlass-dsl is not installed"
    _fake_gpu(monkeypatch, {"fa4": 0.5}, absent={"fa4": reason})
    result = kernels.run(kernels.parse_args(["--out", str(tmp_path), "--plain"]))
    assert result["absent"] == {"fa4": reason}
    assert {r["status"] for r in result["rows"] if r["impl"] == "fa4"} == {"unavailable"}
    assert result["fa4_vs_fa3"]["answer"] == "undecided"
    kernels.print_results(result, plain=True)
    out = capsys.readouterr().out
    assert f"FA4 absent: {reason}" in out
    assert "FA4 bf16" not in out  # neither a row nor a column
    assert "FA4 >= FA3 on every case: undecided" in out
    columns, _ = kernels.side_by_side(result)
    assert not any(c.startswith("FA4") for c in columns)


def test_kernels_arguments():
    args = kernels.parse_args(["--impls", "fa3", "fa4", "--cases", "decode"])
    assert args.impls == ["fa3", "fa4"] and args.budget_s >= 300
    with pytest.raises(SystemExit):
        kernels.parse_args(["--impls", "fa5"])


def test_kernels_dry_run_lists_fa4_without_a_gpu():
    proc = subprocess.run([sys.executable, str(BENCH / "kernels.py"), "--dry-run", "--cases", "decode_seed"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "paged_decode_seed: FA3 bf16, FA4 bf16, FA2, FA3 FP8"


# --- first_call.py ---------------------------------------------------------------------

def test_fa4_cache_states_get_their_own_environment(tmp_path):
    from vendored_flash_attn.families.fa4 import cache as fa4_cache

    plan = {step["state"]: step["env"] for step in first_call.fa4_plan(tmp_path)}
    assert list(plan) == ["shipped", "jit", "user cache"]
    # the caller's environment must not leak an "off" into the shipped state, nor a user cache
    base = {fa4_cache.SHIPPED_KERNELS_ENV: "off", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/elsewhere",
            "VLLM_FLASH_ATTN_VERSION": "3", "PATH": "/bin"}
    envs = {state: first_call.child_env(None, tmp_path / "jit", False, extra, base=base)
            for state, extra in plan.items()}
    assert fa4_cache.SHIPPED_KERNELS_ENV not in envs["shipped"]
    assert envs["jit"][fa4_cache.SHIPPED_KERNELS_ENV] == envs["user cache"][fa4_cache.SHIPPED_KERNELS_ENV] == "off"
    assert fa4_cache.shipped_kernels_disabled(envs["jit"]) and not fa4_cache.shipped_kernels_disabled(envs["shipped"])
    users = {state: env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] for state, env in envs.items()}
    assert users["user cache"] == users["jit"] != users["shipped"]
    assert all(Path(u).is_relative_to(tmp_path) for u in users.values())
    assert all(env["VFA_FIRST_CALL_FA_VERSION"] == "4" and "VLLM_FLASH_ATTN_VERSION" not in env
               for env in envs.values())


def _fa4_run(state, first=0.01, decode=0.02, kernels_seen=(0, 0, 0, 0), **extra):
    steps = ("before", "load", "first_call", "first_decode")
    return dict({"fa4_cache": state, "times": {"fa4_load_s": 9.0, "first_call_s": first, "first_decode_s": decode,
                                                "second_call_s": 0.001},
                 "user_cache_kernels": dict(zip(steps, kernels_seen))}, **extra)


def test_fa4_bar_needs_a_fast_first_call_and_no_compile_per_shape():
    bars = first_call.fa4_bars([_fa4_run("shipped"), _fa4_run("jit", 3.0, 2.0, (0, 0, 1, 2))])
    assert [b["verdict"] for b in bars] == ["PASS", "PASS"]
    slow = first_call.fa4_bars([_fa4_run("shipped", first=0.06)])
    assert [b["verdict"] for b in slow] == ["FAIL", "PASS"]
    # fast, but the decode kernel was compiled (not shipped): the bar fails
    compiled = first_call.fa4_bars([_fa4_run("shipped", kernels_seen=(0, 0, 0, 1))])
    assert [b["verdict"] for b in compiled] == ["PASS", "FAIL"] and compiled[1]["compiled"] == 1
    assert first_call.fa4_compiled(_fa4_run("jit", kernels_seen=(0, 0, 1, 2))) == {
        "fa4.load": 0, "first_call_s": 1, "first_decode_s": 1}


def test_fa4_absent_gives_reasons_not_verdicts():
    bars = first_call.fa4_bars([{"fa4_cache": "shipped", "absent": "no CUDA GPU is visible", "times": {}}])
    assert {b["verdict"] for b in bars} == {"n/a"} and all("FA4 absent: no CUDA GPU" in b["why"] for b in bars)
    error = first_call.fa4_bars([{"fa4_cache": "shipped", "error": "RuntimeError: x", "times": {"fa4_load_s": 9.0}}])
    assert {b["verdict"] for b in error} == {"FAIL"}
    columns, rows, notes = first_call.fa4_table({"runs": [{"fa4_cache": "shipped", "absent": "no GPU",
                                                           "times": {"import_vfa_s": 0.001}}],
                                                 "fa4_bars": bars})
    assert rows[0][-1] == "FA4 absent: no GPU"


def test_first_call_fa4_only_on_a_machine_without_fa4_reports_absent(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(BENCH / "first_call.py"), "--fa4-only", "--plain",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FA4 absent: " in proc.stdout
    result = json.loads((tmp_path / "first_call.json").read_text())
    assert [r["fa4_cache"] for r in result["runs"]] == ["shipped"]  # absent: the other states are skipped
    assert result["runs"][0]["cutlass_after_import"] is False
    assert {b["verdict"] for b in result["fa4_bars"]} == {"n/a"}


# --- import_time.py --------------------------------------------------------------------

def test_lazy_check_flags_cutlass_before_fa4_is_used_only():
    ok = {"kind": "fa4_first_use", "modules": {"import torch": ["torch"], "import vendored_flash_attn": ["torch"],
                                               "fa4.load()": ["torch", "cutlass"]}}
    assert import_time.lazy_violations([ok]) == []
    bad = {"kind": "vfa_alone", "modules": {"import vendored_flash_attn": ["cutlass"]}}
    assert import_time.lazy_violations([ok, bad]) == [
        "import vendored_flash_attn alone sample 1: cutlass in sys.modules after import vendored_flash_attn"]


def test_summary_medians_and_fa4_absence():
    samples = [{"kind": "torch_vfa", "steps": {"import torch": t, "import vendored_flash_attn": 0.001},
                "modules": {}, "process_wall_s": t + 0.5} for t in (3.0, 1.0, 2.0)]
    samples.append({"kind": "fa4_first_use", "steps": {"import torch": 2.0}, "modules": {},
                    "absent": "FA4DependencyError: x", "process_wall_s": 2.5})
    summary = import_time.summarise(samples)
    assert summary["torch_vfa"]["steps"]["import torch"]["median_s"] == 2.0
    assert summary["torch_vfa"]["process_wall_median_s"] == 2.5
    assert summary["fa4_first_use"]["absent"] == "FA4DependencyError: x"
    assert import_time.step_median(summary, "fa4_first_use", "import torch") == 2.0
    assert import_time.step_median(summary, "fa4_first_use", "fa4.load()") is None


def _import_time(tmp_path, extra_path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, extra_path), str(PYTHON_DIR)]))
    return subprocess.run([sys.executable, str(BENCH / "import_time.py"), "--repeats", "1", "--kinds",
                           "vfa_alone", "--plain", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_import_time_passes_when_the_package_import_stays_lazy(tmp_path):
    proc = _import_time(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    result = json.loads((tmp_path / "import_time.json").read_text())
    assert result["lazy_check"]["verdict"] == "PASS"
    assert result["summary"]["vfa_alone"]["steps"]["import vendored_flash_attn"]["n"] == 1
    assert "CHECK PASS" in proc.stdout


def test_import_time_fails_when_cutlass_is_imported_with_the_package(tmp_path):
    # A process in which cutlass is loaded by the time vendored_flash_attn is imported (here:
    # a sitecustomize): what a package that imported cutlass eagerly would look like.
    site = tmp_path / "site"
    (site / "cutlass").mkdir(parents=True)
    (site / "cutlass" / "__init__.py").write_text("")
    (site / "sitecustomize.py").write_text("import cutlass\n")
    proc = _import_time(tmp_path / "out", extra_path=[site])
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "import_time.json").read_text())
    assert result["lazy_check"]["verdict"] == "FAIL" and result["lazy_check"]["violations"]
    assert "CHECK FAIL" in proc.stdout


def test_import_time_arguments():
    assert import_time.parse_args([]).repeats >= 5
    with pytest.raises(SystemExit):
        import_time.parse_args(["--repeats", "0"])


@pytest.mark.parametrize("module", [first_call, import_time], ids=["first_call", "import_time"])
def test_child_scripts_compile(module):
    compile(module.CHILD, f"<{module.__name__} child>", "exec")


@pytest.mark.parametrize("fwd,shipped_off,expected", [
    ({"shipped": "/site/k/fwd", "aliases": 0}, False, "yes"),
    # Python 3.12 on the H200 loading the wheel's Python 3.11 files through its index
    ({"shipped": None, "aliases": 108}, False, "shared (108)"),
    ({"shipped": None, "aliases": 0}, False, "none"),
    ({"shipped": None, "aliases": 0}, True, "off"),
])
def test_fa4_table_says_where_the_shipped_kernels_come_from(fwd, shipped_off, expected):
    run = _fa4_run("shipped", fa4_cache_layout={"shipped_off": shipped_off, "kinds": {"fwd": fwd}})
    columns, rows, _notes = first_call.fa4_table({"runs": [run]})
    assert rows[0][columns.index("shipped dir")] == expected
