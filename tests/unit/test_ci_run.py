"""CI's CPU step (.ci/run) fails a run that tested nothing: pytest's exit status 5 (nothing
collected) stands, and --require-cpu-tiers (tests/conftest.py) fails a run in which a CPU
tier (unit, build, dist, upstream-adapter) ran no test, naming it in pytest's closing line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# One quick test of each required tier.
ONE_PER_TIER = ["tests/unit/test_package.py",
                "tests/build/test_torch_metadata.py::test_does_not_import_torch",
                "tests/dist/test_versioning.py::test_label_from_the_real_pin_and_torch",
                "tests/unit/test_upstream_adapter.py::test_kvcache_lse_layout"]


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    """This repository's pytest, as .ci/run starts it, on a few tests."""
    return subprocess.run([sys.executable, "-m", "pytest", "--require-cpu-tiers", "-q",
                           "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def closing_line(result) -> str:
    return result.stdout.strip().splitlines()[-1]


def test_a_run_of_every_tier_passes():
    result = pytest_run(*ONE_PER_TIER)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "required tier" not in closing_line(result), result.stdout
    assert "build (tests/build): 1 ran" in result.stdout


def test_a_tier_that_ran_nothing_fails_the_run():
    result = pytest_run(*ONE_PER_TIER[:2])  # dist and upstream-adapter left out
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.match(r"\d+ passed, 2 required tier\(s\) ran nothing in ", closing_line(result)), result.stdout
    assert "FAILED dist (tests/dist): 0 ran" in result.stdout
    assert "FAILED upstream-adapter" in result.stdout and "FAILED build" not in result.stdout


def test_a_tier_whose_tests_are_all_deselected_ran_nothing():
    result = pytest_run(*ONE_PER_TIER, "-k", "not test_label_from_the_real_pin")
    assert result.returncode == 1 and "FAILED dist" in result.stdout, result.stdout


def test_deselecting_everything_fails():
    result = pytest_run(*ONE_PER_TIER, "-k", "zzz")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.match(r"\d+ deselected, 4 required tier\(s\) ran nothing in ", closing_line(result)), result.stdout


def test_ci_run_keeps_pytests_exit_status_and_asks_for_every_tier(tmp_path):
    """.ci/run itself, with its bootstrap and Python replaced by stand-ins that record the
    command and exit with pytest's status for "no tests collected"."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci/run", tmp_path / ".ci/run")
    bootstrap = tmp_path / ".ci/bootstrap"
    bootstrap.write_text("#!/bin/sh\nexit 0\n")
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nexit 5\n')
    for path in (bootstrap, python):
        path.chmod(0o755)
    result = subprocess.run([str(tmp_path / ".ci/run"), "-k", "zzz"], capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"]}, timeout=60)
    assert result.returncode == 5, result.stdout + result.stderr
    assert (tmp_path / ".venv/bin/args").read_text().split() == [
        "-m", "pytest", "--require-cpu-tiers", "--numprocesses=2", "--dist=loadfile", "-k", "zzz"]


def test_skips_are_summed_up_by_reason_none_reading_like_an_error():
    """Issue 29: .ci/run ended with 37 SKIPPED lines, some "got empty parameter set" (a
    parametrisation with no case for this build), which reads like a bug. The GPU tier skips
    on a CPU machine; its skips come grouped, one line per reason."""
    result = pytest_run("tests/gpu/test_varlen_gpu.py", "tests/gpu/test_kernel_files_gpu.py")
    out = result.stdout
    if " skipped" not in closing_line(result):
        pytest.skip("these GPU tests ran here: nothing skipped to sum up")
    assert "SKIPPED [" not in out and "got empty parameter set" not in out, out
    summary = out[out.index("skipped, by reason"):].splitlines()[1:]
    lines = [line for line in summary if re.match(r"\d+ skipped \(", line)]
    assert lines and sum(int(line.split()[0]) for line in lines) == int(
        re.search(r"(\d+) skipped", closing_line(result)).group(1)), out
    assert len({line.split(": ", 1)[1] for line in lines}) == len(lines)  # one line per reason


def scratch_session(tmp_path: Path, test_code: str, *options: str) -> subprocess.CompletedProcess:
    """A pytest session of one test file in a scratch folder, with tests/conftest.py's session
    harness (its conftest is loaded there as that folder's)."""
    conftest = str(ROOT / "tests/conftest.py")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT / 'python')!r}]\n"
        f"harness = {{'__name__': 'vfa_conftest', '__file__': {conftest!r}}}\n"
        f"exec(compile(open({conftest!r}).read(), {conftest!r}, 'exec'), harness)\n"
        "globals().update({k: v for k, v in harness.items() if k.startswith('pytest_')})\n")
    (tmp_path / "test_scratch.py").write_text(test_code)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_scratch.py"), *options], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_a_process_a_test_leaves_running_is_named_stopped_and_fails_the_run(tmp_path):
    """Issue 39: .ci/run left a server running. A test starts a daemon (its parent exits at
    once, as sccache's server does); the session names it, stops it and fails."""
    pid_file = tmp_path / "daemon.pid"
    code = ("import subprocess\n"
            "def test_starts_a_daemon():\n"
            f"    subprocess.run(['sh', '-c', 'sleep 600 & echo $! > {pid_file}'], check=True)\n")
    result = scratch_session(tmp_path, code, "--leftover-grace=1")
    pid = int(pid_file.read_text())
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"FAILED pid {pid}, started in test_scratch.py::test_starts_a_daemon (call): sleep 600"
            in result.stdout), result.stdout
    assert "1 passed, 1 leftover process(es)" in closing_line(result)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_load_check_runs_busy_processes_beside_the_tests_and_stops_them(tmp_path):
    code = ("import os\n"
            "from pathlib import Path\n"
            "def hogs():\n"
            "    return [p for p in Path('/proc').glob('[0-9]*') if (p / 'cmdline').exists()\n"
            "            and b'while True: pass' in (p / 'cmdline').read_bytes()\n"
            "            and (p / 'stat').read_text().rsplit(')', 1)[1].split()[1] == str(os.getpid())]\n"
            "def test_beside_busy_processes(tmp_path):\n"
            f"    Path({str(tmp_path / 'hogs')!r}).write_text(' '.join(p.name for p in hogs()))\n")
    result = scratch_session(tmp_path, code, "--load-check=3")
    assert result.returncode == 0, result.stdout + result.stderr
    hogs = (tmp_path / "hogs").read_text().split()
    assert len(hogs) == 3, hogs
    assert re.search(r"3 busy processes beside the tests \(\d+ CPUs\) for \d+ s", result.stdout), result.stdout
    alive = [pid for pid in hogs if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, "a hog outlived the session"


@pytest.mark.parametrize("python, says", [
    # a Python 3.10 (Ubuntu 22.04's): the test tools' cibuildwheel>=3.1 needs 3.11
    ("3.10", "Python 3.10.13 ('{python}') is older than the 3.11 the build and test tools need "
             "(cibuildwheel>=3.1 requires it; the wheel itself supports pyproject.toml's requires-python): "
             "name a newer one with PYTHON=/path/to/python3.11"),
    # Debian's Python without python3-venv
    ("no-venv", "Python 3.12.3 ('{python}') has no venv module with pip (ensurepip): install it "
                "(Debian/Ubuntu: apt-get install python3-venv"),
    ("missing", "no '{python}' on PATH: install Python >= 3.11 or name one with PYTHON=/path/to/python3"),
])
def test_bootstrap_says_in_one_line_what_a_first_run_lacks(tmp_path, python, says):
    """Issue 39: on Python 3.10 the first command ended in a bare "No module named 'tomllib'".
    Stand-in Pythons: one that is 3.10 (this interpreter, told so), one without venv's pip."""
    fake = tmp_path / f"python-{python}"
    version = {"3.10": (3, 10, 13), "no-venv": (3, 12, 3)}.get(python)
    if version:
        told = f"import sys; sys.version_info = {(*version, 'final', 0)}; exec(sys.argv[1])"
        fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python {".".join(map(str, version))}"; '
                        f'exit 0; }}\n[ "$1" = -c ] || exit 9\n'
                        + ('case "$2" in *ensurepip*) exit 1;; esac\n' if python == "no-venv" else "")
                        + f'exec {sys.executable} -c "{told}" "$2"\n')
        fake.chmod(0o755)
    venv = tmp_path / "venv"
    result = subprocess.run([str(ROOT / ".ci/bootstrap")], capture_output=True, text=True, timeout=120,
                            env={"PATH": os.environ["PATH"], "PYTHON": str(fake), "VENV": str(venv)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("bootstrap: ") and result.stderr.count("\n") == 1, result.stderr
    assert says.format(python=fake) in result.stderr, result.stderr
    assert not venv.exists()
