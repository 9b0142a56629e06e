"""The staged H200 scripts (tests/gpu/session_h200.sh, slice_h200.sh) on the CPU machine,
with a stand-in for `pip wheel` and sccache: the defines reach the detached build intact
(a value with a quote too), and each session lives in a fresh folder under TMPDIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture
def stand_ins(tmp_path):
    """PYTHON that records `-m pip wheel` arguments (and fails the cluster helper, so the
    session script's build B ends at once), and a PATH whose sccache does nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args = tmp_path / "pip-wheel-args.txt"
    fake_py = bin_dir / "fakepy"
    fake_py.write_text(f"""#!/usr/bin/env bash
if [[ "$1 $2 $3" == "-m pip wheel" ]]; then printf '%s\\n' "$@" >> {args}; exit 0; fi
# A checkout with carried wheels (.whl/) installs them first: nothing to install here.
if [[ "$1 $2 $3" == "-m pip install" ]]; then exit 0; fi
if [[ "$1 $2" == "-m pip" || "$1" == *cluster.py ]]; then exit 1; fi
exec {sys.executable} "$@"
""")
    (bin_dir / "sccache").write_text("#!/bin/sh\nexit 0\n")
    for f in (fake_py, bin_dir / "sccache"):
        f.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("VFA_", "SCCACHE_"))},
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": str(fake_py), "TMPDIR": str(tmp),
           "OUT": str(tmp_path / "out"), "SOURCE_CACHE_FROM": str(cache), "WAIT_S": "60",
           "SESSION_POINTER": str(tmp_path / "session.ptr"), "SLICE_POINTER": str(tmp_path / "slice.ptr"),
           "EXTRA_DEFINES": "-Ccmake.define.VFA_NOTE=it's -Ccmake.define.VFA_OTHER=\"x\""}
    return env, args, tmp


def run(script: str, *stage: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "tests/gpu" / script), *stage], env=env, capture_output=True,
                          text=True, timeout=300)


def test_session_script_passes_defines_intact_and_uses_a_fresh_folder(stand_ins, tmp_path):
    env, args, tmp = stand_ins
    result = run("session_h200.sh", "start", env=env)
    # Build B (the cluster) fails by design here; build A must have run with every define.
    assert "build A: exit 0" in result.stdout, result.stdout + result.stderr
    recorded = args.read_text().splitlines()
    assert "-Ccmake.define.VFA_NOTE=it's" in recorded and '-Ccmake.define.VFA_OTHER="x"' in recorded
    assert "-Ccmake.define.VFA_FA3_HEAD_DIMS=128,256" in recorded
    session = Path((tmp_path / "session.ptr").read_text().strip())
    assert session.parent == tmp and session.name.startswith("vfa-session.")
    assert any(a.startswith(f"-Cbuild-dir={session}/") for a in recorded)
    # A second start makes another folder and leaves the first alone.
    run("session_h200.sh", "start", env=env)
    second = Path((tmp_path / "session.ptr").read_text().strip())
    assert second != session and session.is_dir()


def test_slice_script_builds_the_named_slice(stand_ins, tmp_path):
    env, args, tmp = stand_ins
    result = run("slice_h200.sh", "start", "fa2-hd32-64", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = args.read_text().splitlines()
    for define in ("-Ccmake.define.VFA_PRESET=full", "-Ccmake.define.VFA_BUILD_FA3=OFF",
                   "-Ccmake.define.VFA_FA2_HEAD_DIMS=32,64", "-Ccmake.define.VFA_NOTE=it's"):
        assert define in recorded
    session = Path((tmp_path / "slice.ptr").read_text().strip())
    assert session.parent == tmp and (session / "results/slice.txt").read_text().strip() == "fa2-hd32-64"
    assert run("slice_h200.sh", "start", "no-such-slice", env=env).returncode != 0


def test_later_stages_need_the_start_stage(stand_ins):
    env, _args, _tmp = stand_ins
    result = run("slice_h200.sh", "wait", env=env)
    assert result.returncode != 0 and "run the start stage first" in result.stderr


def test_check_stage_needs_a_wheel_and_its_kernel_table(stand_ins, tmp_path):
    """`check DIR` runs a wheel built elsewhere; without the kernel table of the build that
    made it, coverage cannot be judged, so it refuses before installing anything."""
    env, _args, tmp = stand_ins
    built = tmp_path / "fa2-hd32-64"
    built.mkdir()
    (built / "vendored_flash_attn-0.1.0-cp310-abi3-linux_x86_64.whl").write_bytes(b"")
    result = run("slice_h200.sh", "check", str(built), env=env)
    assert result.returncode == 2 and "kernel-table.json" in result.stderr, result.stdout + result.stderr
    # With no slice session on the machine, the check made one of its own.
    session = Path((tmp_path / "slice.ptr").read_text().strip())
    assert session.parent == tmp and session.is_dir()


def test_upstream_tests_fail_the_stage_on_a_failure_and_say_when_not_run(tmp_path):
    """h200_lib.sh's upstream_tests (the `test` and `check` stages of slice_h200.sh): the
    runner's exit status reaches the stage, and without the carried file it says so."""
    project = tmp_path / "project"
    (project / "tests/upstream").mkdir(parents=True)
    runner = project / "tests/upstream/run_upstream_tests.py"
    out = tmp_path / "results"
    out.mkdir()

    def upstream_tests(runner_exit: int) -> subprocess.CompletedProcess:
        runner.write_text(f"import sys\nprint('runner ran', sys.argv[1:])\nsys.exit({runner_exit})\n")
        script = f'ROOT={project}; PY={sys.executable}; . {ROOT / "tests/gpu/h200_lib.sh"}; upstream_tests {out}'
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)

    result = upstream_tests(0)
    assert result.returncode == 0 and "upstream's test file NOT run" in result.stdout
    assert "runner ran" not in result.stdout
    (project / ".upstream-tests").mkdir()
    (project / ".upstream-tests/test_vllm_flash_attn.py").write_text("")
    result = upstream_tests(1)
    assert result.returncode == 1 and "runner ran" in result.stdout, result.stdout + result.stderr
    assert "--file" in (out / "upstream-tests.log").read_text()
    assert upstream_tests(0).returncode == 0


def test_serving_script_overlays_and_runs_the_named_stages(tmp_path):
    """tests/gpu/serving_h200.sh with a stand-in Python: this checkout's Python files go over
    the installed package, each stage runs its script with the results under $OUT/serving
    (overhead.py given the carried upstream wrapper when present), and an unknown stage stops."""
    site = tmp_path / "site" / "vendored_flash_attn"
    site.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    fake_py = tmp_path / "fakepy"
    fake_py.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == "-c" ]]; then echo {site}; exit 0; fi
printf '%s\\n' "$*" >> {calls}
exit 0
""")
    fake_py.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake_py), "OUT": str(tmp_path / "out"), "FA4_SITE": str(tmp_path / "none")}
    result = run("serving_h200.sh", "serving", "overhead", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (site / "interface.py").read_bytes() == (ROOT / "python/vendored_flash_attn/interface.py").read_bytes()
    assert (site / "knobs.json").read_bytes() == (ROOT / "cmake/knobs.json").read_bytes()
    assert (site / "measured.json").is_file()
    lines = calls.read_text().splitlines()
    out = tmp_path / "out" / "serving"
    assert f"{ROOT}/benchmarks/serving.py --out {out} --plain" in lines
    overhead = [line for line in lines if "overhead.py" in line]
    carried = ROOT / ".upstream-tests" / "flash_attn_interface.py"
    # OVERHEAD_RUNS (5) whole runs, each in its folder, then their summary
    assert [line.split(" --out ")[1].split()[0] for line in overhead[:-1]] == [
        f"{out}/overhead-run{i}" for i in range(1, 6)]
    assert all(("--upstream-file" in line) == carried.is_file() for line in overhead[:-1])
    assert "overhead.py --summarize" in overhead[-1] and f"--out {out}" in overhead[-1]
    assert not any(line.startswith("-m pytest") for line in lines)  # only the stages named
    bad = run("serving_h200.sh", "bench", env={**env, "OVERLAY_SOURCE": "0"})
    assert bad.returncode == 2 and "unknown stage bench" in bad.stderr
