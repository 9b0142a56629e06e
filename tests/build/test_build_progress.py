"""What a user sees while the modules compile (cmake/BuildProgress.cmake): progress lines
while a unit is still compiling, upstream warnings kept off the console but in the log,
errors shown at once and in full.

The project is configured for real on the synthetic upstream; its compiles go through
tests/support/fake_compiler.py (a slow unit, noise, a failure, a real compile with a
broken header) so a build takes seconds. The same wiring runs through pip with real
nvcc and sccache in tests/build/test_wheel.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cmake_runner import clean_env, configure, tool

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_compiler.py"
SLOW = "flash_fwd_hdim128_bf16_paged_sm90"


@pytest.fixture(scope="module")
def project(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    cache = Path(sources["VFA_SOURCE_CACHE"])
    launcher = f"{sys.executable};{FAKE}"
    build = root / "build"
    defines = {**sources, "VFA_PRESET": "minimal"}  # sources: pin, filled cache, no compiler cache
    result = configure(build, {
        **defines, "CMAKE_CUDA_COMPILER_LAUNCHER": launcher, "CMAKE_CXX_COMPILER_LAUNCHER": launcher,
        # Two compile jobs whatever this machine has; a progress line every second.
        "MAX_JOBS": "2", "VFA_BUILD_MEMORY_MB": "65536", "VFA_BUILD_PROGRESS_INTERVAL": "1"})
    assert result.returncode == 0, result.output[-5000:]
    assert "Added CUDA NVCC flags" not in result.output  # torch's -gencode line, which we do not use
    assert "for sm_90a" in result.output
    # torch's CMake warnings about what this build does not use (issue 19): not shown
    assert "library kineto not found" not in result.output and "CMAKE_CUDA_ARCHITECTURES" not in result.output
    assert "status lines and warnings are hidden (--log-level=STATUS shows them)" in result.output
    # Upstream's messages are located where the compiles read it: the staged copy of CUTLASS.
    commands = json.loads((build / "compile_commands.json").read_text())
    cutlass = next(Path(inc[2:]).parent for c in commands for inc in c["command"].split()
                   if inc.startswith("-I") and "/cutlass-" in inc and inc.endswith("/include"))
    assert not str(cutlass).startswith(str(cache)), "the compiles read the source cache, not the staged copy"
    empty = root / "empty.o"
    subprocess.run(["c++", "-x", "c++", "-c", os.devnull, "-o", str(empty)], check=True)
    return {"root": root, "build": build, "cutlass": cutlass, "defines": defines, "empty": empty,
            "launcher": launcher}


class Build:
    def __init__(self, returncode: int, lines: list[tuple[float, str]], seconds: float, markers: Path,
                 log_path: Path):
        self.returncode, self.lines, self.seconds, self.markers = returncode, lines, seconds, markers
        self.log_path = log_path
        self.log = log_path.read_text() if log_path.exists() else ""

    @property
    def output(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def first(self, *needles: str) -> float:
        """When the first line holding every needle was read (time.time())."""
        for t, text in self.lines:
            if all(n in text for n in needles):
                return t
        raise AssertionError(f"no line with {needles} in:\n{self.output[-6000:]}")

    def index(self, *needles: str) -> int:
        """The place of the first line holding every needle in the output."""
        for i, (_, text) in enumerate(self.lines):
            if all(n in text for n in needles):
                return i
        raise AssertionError(f"no line with {needles} in:\n{self.output[-6000:]}")

    def timed_out(self, unit: str) -> bool:
        """Whether a unit planned "until:release" ended because nothing released it."""
        return any(self.markers.glob(f"{unit}*.timedout"))


def build(project, plan: list[list[str]], name: str, timeout: float = 600, keep_logs: bool = False,
          release_when=None) -> Build:
    """`cmake --build` from clean, its output read line by line as it comes (no TTY, as in CI);
    the compile log of an earlier build removed unless `keep_logs`. Once `release_when(lines)`
    holds of the lines read so far, the markers folder gets `release`: a unit planned
    "until:release" ends then (an event of the console, never a delay). `timeout` only
    bounds a hang."""
    build_dir = project["build"]
    subprocess.run([tool("cmake"), "--build", str(build_dir), "--target", "clean"], env=clean_env(),
                   capture_output=True, check=True)
    if not keep_logs:
        (build_dir / "vfa-compile.log").unlink(missing_ok=True)
    markers = project["root"] / f"markers-{name}"
    markers.mkdir()
    env = clean_env(FAKE_COMPILE_PLAN=json.dumps(plan), FAKE_MARKERS=str(markers),
                    FAKE_NOISE_ROOT=str(project["cutlass"]), FAKE_EMPTY_OBJECT=str(project["empty"]))
    start = time.time()
    proc = subprocess.Popen([tool("cmake"), "--build", str(build_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    released = release_when is None
    for line in proc.stdout:
        lines.append((time.time(), line.rstrip("\n")))
        if not released and release_when([text for _, text in lines]):
            (markers / "release").touch()
            released = True
        assert time.time() - start < timeout, "the build hangs"
    proc.wait(timeout=timeout)
    return Build(proc.returncode, lines, time.time() - start, markers, build_dir / "vfa-compile.log")


def _running_and_warned(lines: list[str]) -> bool:
    return (any("[vfa" in line and f"running {SLOW}.cu" in line for line in lines)
            and any("\u2018ours\u2019" in line for line in lines))


@pytest.fixture(scope="module")
def slow(project) -> Build:
    """One build for two tests: a slow unit among fast ones, every unit printing noise. The
    slow unit ends once the console has shown a status line naming it and a fast unit's
    warning (so however loaded the machine, the fast units are done before it and a status
    line comes while it runs); were either held back until it ended, it would end only after
    300 s, with a marker that says so."""
    return build(project, [[SLOW, "until:release"]], "slow", release_when=_running_and_warned)


def test_progress_lines_appear_while_a_slow_unit_compiles(slow):
    b = slow
    assert b.returncode == 0, b.output[-5000:]
    b.first("[vfa", "compiling 22 units, 2 at a time")
    seen = b.index("[vfa", "done", f"running {SLOW}.cu", "left")
    assert not b.timed_out(SLOW), "the progress line came only when the slow unit ended"
    assert seen < b.index("[vfa", f"compiled {SLOW}.cu")
    b.first("[vfa", f"compiled {SLOW}.cu (FA3 CUDA)", "[22/22]")
    # ninja's own lines follow once the monitor is done, and the modules link.
    b.first("Linking CXX shared module _vendored_fa3_C")
    progress = (b.log_path.parent / "vfa-progress.log").read_text()
    assert f"running {SLOW}.cu" in progress


def test_upstream_warnings_go_to_the_log_not_the_console(slow):
    b = slow
    assert b.returncode == 0, b.output[-5000:]
    assert "is deprecated" not in b.output and "note: declared here" not in b.output
    assert b.output.count("unused variable \u2018ours\u2019") == 22  # a warning that is not upstream's
    b.first("[vfa", "22/22 compiled", "44 compiler warnings in upstream code not shown here", str(b.log_path))


def test_warnings_are_shown_when_their_unit_ends_not_when_the_monitor_does(slow):
    """Issue 29: while the monitor holds ninja's console, ninja keeps every other unit's output
    until the monitor ends: a warning of a unit that ended in the first seconds came after the
    slow unit, out of order. Each follows its unit's line, as it comes."""
    b = slow
    first = b.index("unused variable \u2018ours\u2019")
    assert not b.timed_out(SLOW), "the warnings waited for the monitor to end"
    assert first < b.index("[vfa", f"compiled {SLOW}.cu")
    summary = next(i for i, (_, text) in enumerate(b.lines) if "22/22 compiled" in text)
    assert not [text for _, text in b.lines[summary:] if "\u2018ours\u2019" in text], "a warning came after the end"
    assert b.log.count("\u2018long4\u2019 is deprecated") == 22
    assert b.log.count("note: declared here") == 44
    assert b.log.count("==> CMakeFiles/") == 22


def test_a_failing_unit_fails_the_build_with_its_error_shown_at_once(project):
    # the slow unit ends once the console has shown the error: were it held back until then,
    # the slow unit would end after 300 s, saying so
    error = "error: deliberate failure of this unit"
    plan = [["hopper/flash_api.cpp", f"fail-after:{SLOW}"], [SLOW, "until:release"]]
    b = build(project, plan, "fail", release_when=lambda lines: any(error in line for line in lines))
    assert b.returncode != 0
    # A rebuild: ninja now knows the monitor runs long and starts it first, in its dry run
    # too; the count must still hold every unit.
    b.first("[vfa", "compiling 22 units, 2 at a time")
    b.first(f"{project['cutlass']}/hopper/flash_api.cpp:12:3: error: deliberate failure of this unit")
    assert not b.timed_out(SLOW), "the error waited for the other compile to end"
    b.first("[vfa", "FAILED flash_api.cpp (C++)", "its errors follow",
            "ninja stops once the compile still running ends")
    b.first("FAILED: [code=1] CMakeFiles/_vendored_fa3_C.dir/")
    b.first("2 warnings located in upstream code are not shown here", "vfa-compile.log")
    assert "is deprecated" not in b.output
    assert "deliberate failure" in b.log and "is deprecated" in b.log
    # stops once the slow unit ends (no hang: build() bounds it)


def test_a_real_compile_error_is_shown(project, tmp_path):
    """The real compiler, with a header that it reads as an upstream (CUTLASS) file: its
    warning there is noise, its error there is shown."""
    upstream_file = project["cutlass"] / "include" / "cutlass" / "vfa_test.h"
    broken = tmp_path / "broken.h"
    broken.write_text(f'#line 5 "{upstream_file}"\n'
                      '#warning "an upstream warning, for the log only"\n'
                      "static int vfa_broken_on_purpose = vfa_no_such_symbol;\n")
    b = build(project, [["hopper/flash_api.cpp", f"real:{broken}"]], "real")
    assert b.returncode != 0
    b.first(f"{upstream_file}:6:", "error:", "vfa_no_such_symbol")
    b.first("[vfa", "FAILED flash_api.cpp (C++)")
    assert "for the log only" not in b.output
    assert "for the log only" in b.log and "vfa_no_such_symbol" in b.log


def test_progress_off_leaves_ninjas_own_output(project):
    """Reconfigures the module's build dir (seconds: the compilers are known by then)."""
    knobs = {**project["defines"], "CMAKE_CUDA_COMPILER_LAUNCHER": project["launcher"],
             "CMAKE_CXX_COMPILER_LAUNCHER": project["launcher"], "MAX_JOBS": "2", "VFA_BUILD_MEMORY_MB": "65536"}
    build_dir = project["build"]
    try:
        off = configure(build_dir, {**knobs, "VFA_BUILD_PROGRESS": "off"})
        assert off.returncode == 0, off.output[-3000:]
        ninja_file = (build_dir / "build.ninja").read_text()
        assert "build_progress" not in ninja_file and "units.compile_unit" not in ninja_file
        assert f"LAUNCHER = {project['launcher'].replace(';', ' ')} " in ninja_file
        bad = configure(build_dir, {**knobs, "VFA_BUILD_PROGRESS_INTERVAL": "soon"})
        assert bad.returncode != 0 and "VFA_BUILD_PROGRESS_INTERVAL" in bad.text and "an integer from 1 to 99999" in bad.text
    finally:
        again = configure(build_dir, {**knobs, "VFA_BUILD_PROGRESS": "on", "VFA_BUILD_PROGRESS_INTERVAL": "1"})
        assert again.returncode == 0, again.output[-3000:]
    assert "units.compile_unit" in (build_dir / "build.ninja").read_text()


def test_a_reused_build_dir_keeps_the_last_two_builds_logs(project):
    """Issue 16: vfa-compile.log and vfa-progress.tsv grew forever in a reused build dir."""
    build_dir = project["build"]
    for name in ("rotate-1", "rotate-2", "rotate-3"):
        b = build(project, [], name, keep_logs=True)
        assert b.returncode == 0, b.output[-3000:]
    for log in ("vfa-compile.log", "vfa-progress.tsv", "vfa-progress.log"):
        assert (build_dir / log).exists() and (build_dir / f"{log}.1").exists(), log
    assert (build_dir / "vfa-compile.log").read_text().count("==> CMakeFiles/") == 22
    assert (build_dir / "vfa-compile.log.1").read_text().count("==> CMakeFiles/") == 22
    events = (build_dir / "vfa-progress.tsv").read_text().splitlines()
    assert sum(e.startswith("start\t") for e in events) == 22
    assert (build_dir / "vfa-progress.log").read_text().count("compiling 22 units") == 1


def _alive(pid: int) -> bool:
    """A stand-in compile's process still runs (not a zombie, not a reused pid)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X") and b"fake_compiler" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False


def pip_tool_args() -> list[str]:
    """What scikit-build-core passes to ninja in a pip build (pyproject.toml's build.tool-args)."""
    import tomllib
    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["scikit-build"]["build"]["tool-args"]


def test_an_interrupt_stops_the_compiles_and_says_so_in_one_line(project):
    """Ctrl-C (SIGINT to the foreground process group, as a terminal sends it) while two
    units compile: both stop at once, and one progress line says so. Run as pip runs it (with
    pyproject.toml's ninja arguments), nothing of a compile follows that line (issue 29: ninja
    printed the last status line it had held back, "Building CXX object ...", after it)."""
    import signal
    build_dir = project["build"]
    subprocess.run([tool("cmake"), "--build", str(build_dir), "--target", "clean"], env=clean_env(),
                   capture_output=True, check=True)
    markers = project["root"] / "markers-interrupt"
    markers.mkdir()
    # the slow units never end by themselves (until a file nobody makes: 300 s)
    env = clean_env(FAKE_COMPILE_PLAN=json.dumps([["instantiations", "until:never"]]), FAKE_MARKERS=str(markers),
                    FAKE_EMPTY_OBJECT=str(project["empty"]))
    proc = subprocess.Popen([tool("cmake"), "--build", str(build_dir), "--", *pip_tool_args()], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "[vfa" in line and "running" in line and "instantiations" not in line and ".cu " in line:
                if len(list(markers.glob("*sm90.cu.o.started"))) >= 2:
                    break
        os.killpg(proc.pid, signal.SIGINT)
        lines += [line.rstrip("\n") for line in proc.stdout]
        proc.wait(timeout=240)  # a hang's bound: the compiles it stopped would have run 300 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = "\n".join(lines)
    assert proc.returncode != 0
    said = [line for line in lines if "[vfa" in line and "interrupted" in line]
    assert len(said) == 1, output[-3000:]
    assert "interrupted (SIGINT): stopped the 2 compiles that were running" in said[0]
    assert "nothing of this build compiles any more" in said[0]
    after = lines[lines.index(said[0]) + 1:]
    assert not [line for line in after if "Building" in line or "object" in line], output[-3000:]
    started = {p.name[:-len(".started")] for p in markers.glob("*.started")}
    ended = {p.name[:-len(".ended")] for p in markers.glob("*.ended")}
    assert [u for u in started - ended if "sm90.cu.o" in u], "no slow unit was running"
    # every compile it started has stopped: none of their processes runs on
    running = [p.name for p in markers.glob("*.pid") if _alive(int(p.read_text()))]
    assert not running, f"a compile went on: {running}"
    assert not list(markers.glob("*.timedout"))
