"""tests/gpu/kernel_coverage.py and kernel_log.py: which compiled units the GPU tests ran.

The table is read from real nvcc objects (two small units that share one kernel, laid out
as the build lays them out); the report from log records as kernel_log.py writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests/gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cov = _load("kernel_coverage")
klog = _load("kernel_log")

SHARED = "template <int N> __global__ void shared_kernel(float* x) { x[threadIdx.x] += N; }\n"
UNIT_A = SHARED + """
namespace flash { template <int D, bool Causal> __global__ void fwd(float* x) { x[0] = D + Causal; } }
void run_a(float* x) { flash::fwd<64, true><<<1, 1>>>(x); flash::fwd<64, false><<<1, 1>>>(x);
                       shared_kernel<4><<<1, 32>>>(x); }
"""
UNIT_B = SHARED + """
namespace flash { template <int D, bool Causal> __global__ void fwd(float* x) { x[0] = D * Causal; } }
void run_b(float* x) { flash::fwd<128, true><<<1, 1>>>(x); shared_kernel<4><<<1, 32>>>(x); }
"""
# The names as the profiler reports them (CUPTI, demangled).
A_CAUSAL = "void flash::fwd<64, true>(float*)"
A_FULL = "void flash::fwd<64, false>(float*)"
B_CAUSAL = "void flash::fwd<128, true>(float*)"
SHARED_4 = "void shared_kernel<4>(float*)"


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    nvcc = shutil.which("nvcc") or (Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists()
                                    else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed (CI and the build machines have it)")
    build = tmp_path_factory.mktemp("build")
    units = build / "CMakeFiles/_vendored_fa3_C.dir/src/hopper/instantiations"
    units.mkdir(parents=True)
    for name, text in (("unit_a.cu", UNIT_A), ("unit_b.cu", UNIT_B)):
        (build / name).write_text(text)
        subprocess.run([str(nvcc), "-c", "-arch=sm_80", str(build / name), "-o", str(units / f"{name}.o")],
                       check=True, capture_output=True, timeout=300)
    return build


def test_the_table_lists_each_units_kernels_by_their_profiler_names(build, tmp_path):
    out = tmp_path / "table.json"
    assert cov.main(["table", "--build", str(build), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    norm = cov.normalize
    assert table == {"unit_a.cu": sorted(map(norm, [A_CAUSAL, A_FULL, SHARED_4])),
                     "unit_b.cu": sorted(map(norm, [B_CAUSAL, SHARED_4]))}


def test_an_empty_build_dir_is_refused(tmp_path, capsys):
    assert cov.main(["table", "--build", str(tmp_path), "--out", str(tmp_path / "t.json")]) == 2
    assert "no CUDA object" in capsys.readouterr().err


TABLE = {"unit_a.cu": sorted(map(cov.normalize, [A_CAUSAL, A_FULL, SHARED_4])),
         "unit_b.cu": sorted(map(cov.normalize, [B_CAUSAL, SHARED_4])),
         "flash_api.cpp": []}


def record(test, outcome, *kernels):
    return {"test": test, "outcome": outcome, "kernels": list(kernels)}


def test_a_unit_counts_only_when_a_passing_test_ran_one_of_its_own_kernels():
    result = cov.coverage(TABLE, [
        record("t::causal64", "passed", A_CAUSAL, SHARED_4),
        # the shared kernel ran, but it is also unit_a's: it says nothing about unit_b
        record("t::only_shared", "passed", SHARED_4),
        record("t::causal128", "failed", B_CAUSAL),  # a failing test does not count
    ])
    assert result["not_run"] == ["unit_b.cu"]
    assert result["units"]["unit_a.cu"] == {"kernels": 3, "own_kernels": 2, "own_kernels_run": 1,
                                            "tests": 1, "example": "t::causal64"}
    assert "flash_api.cpp" not in result["units"]  # no kernels: nothing to run
    ok = cov.coverage(TABLE, [record("t::a", "passed", A_FULL), record("t::b", "passed", B_CAUSAL.replace(" ", ""))])
    assert ok["not_run"] == []


def test_report_exit_status_and_summary(tmp_path, capsys):
    table = tmp_path / "table.json"
    table.write_text(json.dumps(TABLE))
    log = tmp_path / "kernels.jsonl"
    log.write_text(json.dumps(record("t::a", "passed", A_CAUSAL)) + "\n")
    assert cov.main(["report", "--table", str(table), "--log", str(log), "--out", str(tmp_path / "c.json")]) == 1
    assert "1 of 2 CUDA units ran in a passing test" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["not_run"] == ["unit_b.cu"]
    log.write_text(log.read_text() + json.dumps(record("t::b", "passed", B_CAUSAL)) + "\n")
    assert cov.main(["report", "--table", str(table), "--log", str(log)]) == 0
    assert "2 of 2 CUDA units" in capsys.readouterr().out
    # no log: the tests ran without VFA_KERNEL_LOG; a broken line: not silently dropped
    assert cov.main(["report", "--table", str(table), "--log", str(tmp_path / "none.jsonl")]) == 2
    log.write_text("{not json\n")
    with pytest.raises(SystemExit, match="line 1 is not JSON"):
        cov.main(["report", "--table", str(table), "--log", str(log)])


def test_kernel_names_from_profiler_events():
    cuda = SimpleNamespace(name=A_CAUSAL, device_type="DeviceType.CUDA", kernels=[])
    cpu_op = SimpleNamespace(name="aten::add", device_type="DeviceType.CPU",
                             kernels=[SimpleNamespace(name=B_CAUSAL)])
    assert klog.kernel_names([cuda, cpu_op]) == sorted([A_CAUSAL, B_CAUSAL])
    assert klog.kernel_names(None) == []


def _pytest(args, cwd, log):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", klog.ENV)}
    if log is not None:
        env[klog.ENV] = str(log)
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_gpu_conftest_logs_every_test_when_asked_and_only_then(tmp_path):
    log = tmp_path / "kernels.jsonl"
    # On this GPU-less machine every GPU test is skipped at setup: each still gets its line.
    _pytest([str(ROOT / "tests/gpu/test_selector_gpu.py"), "-m", "gpu"], ROOT, log)
    records = cov.read_log(log.read_text().splitlines())
    assert records and {r["outcome"] for r in records} == {"skipped"}
    assert all(r["test"].startswith("tests/gpu/test_selector_gpu.py::") and r["kernels"] == [] for r in records)
    _pytest([str(ROOT / "tests/gpu/test_selector_gpu.py"), "-m", "gpu"], ROOT, None)
    assert len(log.read_text().splitlines()) == len(records)  # unset: nothing logged


def test_a_test_that_ran_is_logged_with_its_outcome(tmp_path):
    """The call path (profiler around the test) on a machine without a GPU: no kernels, but
    the outcome of each test that ran."""
    pytest.importorskip("torch")
    (tmp_path / "conftest.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom kernel_log import KernelLog\n"
        "def pytest_configure(config):\n"
        "    import os\n    config.pluginmanager.register(KernelLog(os.environ['VFA_KERNEL_LOG']))\n"
        % str(ROOT / "tests/gpu"))
    (tmp_path / "test_x.py").write_text("def test_ok():\n    assert True\n\ndef test_bad():\n    assert False\n")
    log = tmp_path / "kernels.jsonl"
    _pytest(["test_x.py"], tmp_path, log)
    records = {r["test"]: r for r in cov.read_log(log.read_text().splitlines())}
    assert {t: r["outcome"] for t, r in records.items()} == {"test_x.py::test_ok": "passed",
                                                               "test_x.py::test_bad": "failed"}


def expecting(test, unit, *kernels):
    return {**record(test, "passed", *kernels), "expects": unit}


def test_a_test_that_names_its_unit_must_have_run_it():
    """test_kernel_files_gpu.py names the file each call must run; the report holds the
    launched kernels against it: the expected unit's kernel ran, none owned only by another
    expected unit did (a shared kernel counts for both; a unit no test expects may run beside)."""
    table = {**TABLE, "combine.cu": [cov.normalize("void combine_kernel<4>(Params)")]}
    result = cov.coverage(table, [
        expecting("t::a", "unit_a.cu", A_CAUSAL, "void combine_kernel<4>(Params)"),  # right, combine beside
        expecting("t::shared", "unit_b.cu", SHARED_4),  # a kernel both units hold: fine for either
        expecting("t::b", "unit_b.cu", B_CAUSAL),
        expecting("t::went_to_a", "unit_b.cu", A_FULL),  # dispatched to another expected unit
        expecting("t::none", "unit_a.cu", "void at::native::fill_kernel(float)"),  # no kernel of its unit
        expecting("t::both", "unit_a.cu", A_CAUSAL, B_CAUSAL),  # its unit, and another expected one too
        {**expecting("t::failed", "unit_a.cu", B_CAUSAL), "outcome": "failed"},  # failed: the suite says so
    ])
    assert result["expected_checked"] == 6
    assert result["expected_wrong"] == [
        {"test": "t::went_to_a", "expects": "unit_b.cu", "ran": ["unit_a.cu"]},
        {"test": "t::none", "expects": "unit_a.cu", "ran": []},
        {"test": "t::both", "expects": "unit_a.cu", "ran": ["unit_b.cu"]}]
    assert "3 of 6 tests that name their unit ran it" in cov.summary(result)


def test_report_fails_on_a_test_that_ran_another_unit(tmp_path, capsys):
    table = tmp_path / "table.json"
    table.write_text(json.dumps(TABLE))
    log = tmp_path / "kernels.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in (
        expecting("t::a", "unit_a.cu", A_CAUSAL), expecting("t::b", "unit_b.cu", B_CAUSAL))))
    assert cov.main(["report", "--table", str(table), "--log", str(log)]) == 0
    log.write_text(log.read_text() + json.dumps(expecting("t::wrong", "unit_a.cu", B_CAUSAL)) + "\n")
    assert cov.main(["report", "--table", str(table), "--log", str(log)]) == 1
    assert "t::wrong: expects unit_a.cu, ran unit_b.cu" in capsys.readouterr().out


def test_the_log_carries_the_unit_a_test_names(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "conftest.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom kernel_log import KernelLog\n"
        "def pytest_configure(config):\n"
        "    import os\n    config.pluginmanager.register(KernelLog(os.environ['VFA_KERNEL_LOG']))\n"
        % str(ROOT / "tests/gpu"))
    (tmp_path / "test_x.py").write_text(
        "def test_named(record_property):\n    record_property('kernel_file', 'flash_fwd_x_sm90.cu')\n\n"
        "def test_plain():\n    pass\n")
    log = tmp_path / "kernels.jsonl"
    _pytest(["test_x.py"], tmp_path, log)
    records = {r["test"]: r for r in cov.read_log(log.read_text().splitlines())}
    assert records["test_x.py::test_named"]["expects"] == "flash_fwd_x_sm90.cu"
    assert "expects" not in records["test_x.py::test_plain"]
