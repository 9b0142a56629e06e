"""cmake/vfa_build/compiler_cache/sccache_launcher.py, the build's compiler launcher, with a stand-in for sccache that
fails the way sccache-dist does (a 401 from a scheduler restarted with new secrets; a job
that fails on a build server) and a stand-in compiler: a cluster failure is compiled here
and counted, once per unit; the first prints a line, the third turns the cluster off until
a back-off has passed (then one unit tries it again); a compile error in the source fails and is shown once, uncounted.
The same with the real scheduler and servers: tests/dist/test_sccache_dist.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BUILD_PY = Path(__file__).resolve().parents[2] / "cmake" / "vfa_build"  # the build's entry point
LAUNCHER = [str(BUILD_PY), "compiler_cache.sccache_launcher"]

# Stands in for sccache: with the build's no-[dist] config it runs the compiler; with the
# cluster's it fails as FAKE_CLUSTER says (or runs the compiler when the cluster is fine).
FAKE_SCCACHE = r'''#!/usr/bin/env python3
import os, subprocess, sys
with open(os.environ["FAKE_CALLS"], "a") as calls:
    calls.write(os.environ.get("SCCACHE_CONF", "") + "\n")
local = os.environ.get("SCCACHE_CONF", "").endswith("local.toml")
mode = "" if local else os.environ.get("FAKE_CLUSTER", "")
if mode == "refused":
    sys.stderr.write("sccache: Compiler killed by signal 1\n[\"x.module_id\"] http error status: Error 401: "
                     "Fixed token mismatch\n")
    sys.exit(254)
if mode == "refused-secret":  # a 401 whose text quotes a cache URL with its password
    sys.stderr.write("http error status: Error 401: redis://ci:hunter2hunter2@cache.example:6379 refused\n")
    sys.exit(254)
if mode == "fell-back-secret":  # sccache's own fallback, its reason in its log quoting a password
    out = sys.argv[sys.argv.index("-o") + 1]
    stem = os.path.basename(out).split(".")[0]
    with open(os.path.join(os.environ["FAKE_BUILD"], "vfa-sccache-dist.log"), "a") as log:
        log.write(f"WARN [{stem}.module_id]: Could not perform distributed compile, falling back to local: "
                  "cannot reach redis://ci:hunter2hunter2@cache.example:6379\n")
    sys.exit(subprocess.run(sys.argv[1:]).returncode)
if mode == "job-failed":
    proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    sys.stderr.write("sccache: Job failed on server 10.0.0.2:10501:\nbwrap: cannot create the sandbox\n"
                     + proc.stderr)
    sys.exit(1)
sys.exit(subprocess.run(sys.argv[1:]).returncode)
'''

# Stands in for the compiler: writes its -o, or fails with a compiler's error.
FAKE_COMPILER = r'''#!/usr/bin/env python3
import sys
out = sys.argv[sys.argv.index("-o") + 1]
if "broken" in out:
    sys.stderr.write("unit.cpp:1:32: error: 'undeclared_name' was not declared in this scope\n")
    sys.exit(1)
open(out, "w").write("object")
'''


@pytest.fixture
def build(tmp_path):
    for name, text in (("sccache", FAKE_SCCACHE), ("cc", FAKE_COMPILER)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "build").mkdir()
    settings = {"sccache": str(tmp_path / "sccache"), "build_dir": str(tmp_path / "build"), "dist": "on",
                "scheduler": "http://sched:10600", "server": {"SCCACHE_SERVER_UDS": "\\x00vfa-test-build"},
                "local": {"SCCACHE_SERVER_UDS": "\\x00vfa-test-local", "SCCACHE_CONF": str(tmp_path / "local.toml")},
                "max_cluster_failures": 3}
    (tmp_path / "build" / "vfa-sccache.json").write_text(json.dumps(settings))
    return tmp_path


def compile_unit(root: Path, unit: str, cluster: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "FAKE_CALLS": str(root / "calls.log"), "FAKE_CLUSTER": cluster,
           "FAKE_BUILD": str(root / "build"),
           "SCCACHE_CONF": str(root / "client.toml")}
    return subprocess.run([sys.executable, "-E", "-s", "-S", *LAUNCHER, str(root / "build" / "vfa-sccache.json"),
                           "--", str(root / "cc"), "-c", "unit.cpp", "-o", str(root / unit)],
                          env=env, capture_output=True, text=True, timeout=60)


def kinds(root: Path) -> list[str]:
    tsv = root / "build" / "vfa-dist-fallbacks.tsv"
    return [line.split("\t")[2] for line in tsv.read_text().splitlines()] if tsv.exists() else []


def confs(root: Path) -> list[str]:
    return [Path(line).name for line in (root / "calls.log").read_text().splitlines()]


@pytest.mark.parametrize("cluster", ["refused", "job-failed"])
def test_cluster_failures_compile_here_and_turn_the_cluster_off_after_three(build, cluster):
    results = [compile_unit(build, f"u{i}.o", cluster) for i in range(5)]
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert all((build / f"u{i}.o").read_text() == "object" for i in range(5))
    said = "".join(r.stderr for r in results)
    assert said.count("the sccache-dist cluster failed") == 1 and "compiled here instead" in results[0].stderr
    assert said.count("3 compiles failed on the sccache-dist cluster http://sched:10600") == 1
    assert "3 compiles failed" in results[2].stderr
    assert ("the token under [dist.auth] in SCCACHE_CONF" if cluster == "refused"
            else "A build server could not run the compile") in results[2].stderr
    if cluster == "refused":  # issue 34: a token the probe accepted and the scheduler now refuses: rotation,
        for line in (results[0].stderr, results[2].stderr):  # said with its fix from the first unit on
            assert "its secrets were most likely rotated since" in line, line
            assert "python dist-compile/cluster.py client --scheduler-url - --out SCCACHE_CONF" in line, line
    assert "Error 401" not in results[3].stderr + results[4].stderr  # quiet once the cluster is off
    assert kinds(build) == [cluster] * 3
    assert (build / "build" / "vfa-dist-off").exists()
    # Units 1-3: the cluster, then here; units 4 and 5: here only.
    assert confs(build) == ["client.toml", "local.toml"] * 3 + ["local.toml"] * 2


@pytest.mark.parametrize("cluster", ["refused-secret", "fell-back-secret"])
def test_what_the_launcher_records_and_prints_of_sccaches_words_holds_no_url_password(build, cluster):
    """Issue 34: the reasons the launcher prints and records come from sccache (its error, or its
    own log's fallback line, dist_bound.silent_fallback): they go through the one URL scrubber,
    and the build's record of them is 0600 from its creation."""
    results = [compile_unit(build, f"u{i}.o", cluster) for i in range(3)]
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    said = "".join(r.stdout + r.stderr for r in results)
    tsv = build / "build" / "vfa-dist-fallbacks.tsv"
    assert "cache.example:6379" in said and "cache.example:6379" in tsv.read_text()  # the reason is there,
    assert "hunter2" not in said and "hunter2" not in tsv.read_text()                  # its password is not
    assert kinds(build) == [cluster.replace("-secret", "")] * 3
    assert tsv.stat().st_mode & 0o777 == 0o600
    assert (build / "build" / "vfa-dist-off").stat().st_mode & 0o777 == 0o600


def off_switch(root: Path) -> dict:
    return json.loads((root / "build" / "vfa-dist-off").read_text())


def back_off_passed(root: Path) -> None:
    """What the switch holds once its back-off has passed (no waiting: its time is rewritten)."""
    state = off_switch(root)
    state["off_until"] = 1.0
    (root / "build" / "vfa-dist-off").write_text(json.dumps(state))


def test_the_cluster_is_tried_again_after_its_back_off_and_an_answer_turns_it_on(build):
    """Issue 34: a short outage (3 refusals) must not turn the cluster off for the rest of the build.
    While the back-off lasts units compile here without asking it; once it has passed, one unit
    tries it, and its answer turns the cluster back on for the units after it."""
    from vfa_build.cluster.dist_off import RETRY_FIRST_S
    for i in range(3):
        assert compile_unit(build, f"u{i}.o", "refused").returncode == 0
    assert off_switch(build)["backoff_s"] == RETRY_FIRST_S
    assert compile_unit(build, "here.o", "").returncode == 0  # the back-off has not passed: here only
    assert confs(build) == ["client.toml", "local.toml"] * 3 + ["local.toml"]
    back_off_passed(build)
    tried = compile_unit(build, "tried.o", "")
    assert tried.returncode == 0 and (build / "tried.o").read_text() == "object"
    assert "answered again (" in tried.stderr and "compiles go to it again" in tried.stderr, tried.stderr
    assert compile_unit(build, "after.o", "").returncode == 0
    assert confs(build)[-2:] == ["client.toml", "client.toml"]  # the try and the unit after it: the cluster
    assert off_switch(build)["off_until"] is None and kinds(build) == ["refused"] * 3


def test_a_failed_try_turns_the_cluster_off_twice_as_long_up_to_the_cap(build):
    from vfa_build.cluster.dist_off import RETRY_FIRST_S, RETRY_MAX_S
    said = "".join(compile_unit(build, f"u{i}.o", "refused").stderr for i in range(3))
    assert f"after {RETRY_FIRST_S:.0f} s one of them tries it again" in said, said
    back_off_passed(build)
    again = compile_unit(build, "again.o", "refused")
    assert again.returncode == 0 and confs(build)[-2:] == ["client.toml", "local.toml"]  # tried, then here
    assert f"failed {build / 'again.o'} again" in again.stderr, again.stderr
    assert f"for the next {2 * RETRY_FIRST_S:.0f} s" in again.stderr
    state = off_switch(build)
    assert state["backoff_s"] == 2 * RETRY_FIRST_S and state["off_until"] > 1.0
    calls = len(confs(build))
    assert compile_unit(build, "here.o", "refused").returncode == 0 and confs(build)[calls:] == ["local.toml"]
    state["backoff_s"], state["off_until"] = RETRY_MAX_S, 1.0
    (build / "build" / "vfa-dist-off").write_text(json.dumps(state))
    assert compile_unit(build, "capped.o", "refused").returncode == 0
    assert off_switch(build)["backoff_s"] == RETRY_MAX_S


def test_a_compile_error_fails_once_shown_and_is_no_cluster_failure(build):
    result = compile_unit(build, "broken.o", "job-failed")
    assert result.returncode == 1
    assert result.stderr.count("was not declared in this scope") == 1, result.stderr  # the local attempt's
    assert "Job failed on server" not in result.stderr
    assert kinds(build) == ["source-error"]
    assert not (build / "build" / "vfa-dist-off").exists()


def test_a_compile_error_on_a_working_cluster_is_not_retried(build):
    result = compile_unit(build, "broken.o", "")
    assert result.returncode == 1 and result.stderr.count("was not declared in this scope") == 1
    assert confs(build) == ["client.toml"] and kinds(build) == []


def test_a_healthy_cluster_runs_each_unit_once(build):
    assert compile_unit(build, "u.o", "").returncode == 0
    assert confs(build) == ["client.toml"] and kinds(build) == []


# --- the build's own server lives as long as the build (issue 29) -------------------------------
# On the 2-core machine both compile jobs held units for over 10 minutes, sccache's idle timeout
# (600 s by default, counted from the last new request, compiles running or not) stopped the
# server, both units compiled again from scratch outside it, and their results never reached the
# cache. Here: the real sccache and probe, SCCACHE_IDLE_TIMEOUT=2, units that compile for 6 s,
# or, where the idle timeout is to strike, for 15 s: a server that stops for being idle waits up
# to 10 s for the compiles it runs (sccache 0.16), then drops them.

# A gcc whose compiles of unit*.c take SLOW_S seconds (sccache's preprocessing and version
# checks are quick); each compile leaves compile.<pid> in $SLOW_MARKERS.
SLOW_GCC = """#!/bin/sh
case " $* " in
  *" -E "*|*" -vV "*|*" --version "*) ;;
  *unit*.c*) touch "$SLOW_MARKERS/compile.$$"; sleep "${SLOW_S:-6}" ;;
esac
exec gcc "$@"
"""


@pytest.fixture
def cached_build(tmp_path, request):
    """A build dir configured as the build does it (compiler_cache_probe.py probe: this build
    dir's own server, or with `explicit` one named by SCCACHE_SERVER_UDS), a slow gcc, and a
    ninja file that compiles three units through compile_unit.py and sccache_launcher.py, two
    at a time."""
    from support.cmake_runner import clean_env, tool
    explicit = getattr(request, "param", "") == "explicit"
    root = tmp_path
    (root / "markers").mkdir()
    gcc = root / "slow-gcc"
    gcc.write_text(SLOW_GCC)
    gcc.chmod(0o755)
    build = root / "build"
    build.mkdir()
    env = clean_env(SCCACHE_DIR=str(root / "cache"), SCCACHE_IDLE_TIMEOUT="2", SLOW_MARKERS=str(root / "markers"),
                    SCCACHE_ERROR_LOG=str(root / "sccache.log"))
    if explicit:
        env["SCCACHE_SERVER_UDS"] = f"\\x00vfa-test-{root.name}"
    probe = subprocess.run([sys.executable, str(BUILD_PY), "compiler_cache.compiler_cache_probe", "probe",
                            "--sccache", tool("sccache"), "--cxx", "g++", "--work", str(root / "probe"), "--build-dir", str(build),
                            "--out", str(root / "probe.json")], env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0 and json.loads((root / "probe.json").read_text())["ok"], probe.stderr
    settings = json.loads((build / "vfa-sccache.json").read_text())
    settings["uds"] = settings["server"].get("SCCACHE_SERVER_UDS") or env["SCCACHE_SERVER_UDS"]
    python = f"{sys.executable} -E -s -S"
    units = [f"unit{i}" for i in range(3)]
    for i, unit in enumerate(units):
        (build / f"{unit}.c").write_text(f"int {unit}_{root.name.replace('-', '_')}(void) {{ return {i}; }}\n")
    (build / "build.ninja").write_text(
        "rule cc\n"
        f"  command = {python} {BUILD_PY} units.compile_unit {build} -- {python} {' '.join(LAUNCHER)} "
        f"{build / 'vfa-sccache.json'}"
        f" -- {gcc} -c $in -o $out\n"
        + "".join(f"build {u}.o: cc {u}.c\n" for u in units))
    yield {"root": root, "build": build, "env": env, "settings": settings, "units": units}
    subprocess.run([tool("sccache"), "--stop-server"], env={**env, "SCCACHE_SERVER_UDS": settings["uds"]},
                   capture_output=True, timeout=60)



def ninja(build: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    from support.cmake_runner import tool
    return subprocess.run([tool("ninja"), "-C", str(build), "-j2", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def server_pids(settings: dict) -> list[int]:
    """The live sccache servers of this build dir (found by the socket name in their environment)."""
    import os
    want = f"SCCACHE_SERVER_UDS={settings['uds']}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if want in environ and b"SCCACHE_START_SERVER=1" in environ and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def eventually(predicate, seconds: float = 15) -> bool:
    import time
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def compiles(root: Path) -> int:
    return len(list((root / "markers").glob("compile.*")))


def rebuild_is_all_hits(b) -> None:
    """Every unit reached the cache: a rebuild from scratch compiles none of them."""
    for marker in (b["root"] / "markers").iterdir():
        marker.unlink()
    again = ninja(b["build"], b["env"], "-t", "clean")
    assert again.returncode == 0
    again = ninja(b["build"], b["env"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert compiles(b["root"]) == 0, "units of the first build were not in the cache"


OUTLAST_IDLE_TIMEOUT = {"SLOW_S": "15"}  # idle timeout 2 s + sccache's 10 s grace, and more


def test_units_longer_than_the_idle_timeout_all_reach_the_cache(cached_build):
    b = cached_build
    first = ninja(b["build"], {**b["env"], **OUTLAST_IDLE_TIMEOUT})
    assert first.returncode == 0, first.stdout + first.stderr
    assert compiles(b["root"]) == 3, "each unit compiles once, none again outside the server"
    assert "server" not in first.stdout + first.stderr
    # The build's end stops its server (the keeper): none is left running.
    assert eventually(lambda: not server_pids(b["settings"])), "the build's sccache server outlived the build"
    rebuild_is_all_hits(b)


def test_a_build_dir_removed_as_the_build_ends_has_its_server_stopped(cached_build):
    """`rm -rf build` right after the build (as pytest removes a passed test's tmp_path): the
    keeper, which wakes every KEEPER_POLL_S, finds no build dir, and stops the server all the
    same; it once died on the missing lock file and left the server running for good (CI's
    leftover check named it, issue 39)."""
    import shutil
    b = cached_build
    first = ninja(b["build"], {**b["env"], "SLOW_S": "0"})
    shutil.rmtree(b["build"])
    assert first.returncode == 0, first.stdout + first.stderr
    assert eventually(lambda: not server_pids(b["settings"])), "the server outlived its removed build dir"


def test_a_killed_server_is_replaced_and_the_units_still_cached(cached_build):
    """The server killed while two units compile (sccache's client then fails the compile): one
    line says so, both units compile again through a new server, the build succeeds."""
    import os
    import signal
    import threading
    b = cached_build

    def kill_the_server():
        assert eventually(lambda: compiles(b["root"]) >= 2 and server_pids(b["settings"]), 60)
        for pid in server_pids(b["settings"]):
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server)
    killer.start()
    first = ninja(b["build"], b["env"])
    killer.join()
    output = first.stdout + first.stderr
    assert first.returncode == 0, output
    assert output.count("the build's sccache server stopped while it compiled") == 1, output
    assert "Failed to send data" not in output
    assert eventually(lambda: not server_pids(b["settings"]))
    rebuild_is_all_hits(b)


@pytest.mark.parametrize("cached_build", ["explicit"], indirect=True)
def test_a_named_server_that_times_out_is_replaced_by_one_that_does_not(cached_build):
    """A server named by SCCACHE_SERVER_UDS keeps the user's settings, here a 2 s idle
    timeout: it stops while the units compile (sccache's client would then compile them outside
    it); the launcher starts one with no idle timeout in its place and says so once; the units
    reach the cache, and the build stops the server it started."""
    b = cached_build
    first = ninja(b["build"], {**b["env"], **OUTLAST_IDLE_TIMEOUT})
    output = first.stdout + first.stderr
    assert first.returncode == 0, output
    assert output.count("the build's sccache server stopped while it compiled") == 1, output
    assert "shut down unexpectedly" not in output
    assert eventually(lambda: not server_pids(b["settings"])), "the server the build started outlived it"
    rebuild_is_all_hits(b)


@pytest.mark.parametrize("end", ["a failure", "Ctrl-C"])
def test_the_build_stops_its_server_when_it_ends_otherwise(cached_build, end):
    import os
    import signal
    from support.cmake_runner import tool
    b = cached_build
    if end == "a failure":
        (b["build"] / "unit2.c").write_text("int broken(void) { return undeclared; }\n")
        result = ninja(b["build"], b["env"])
        assert result.returncode != 0 and "undeclared" in result.stdout
    else:
        proc = subprocess.Popen([tool("ninja"), "-C", str(b["build"]), "-j2"], env=b["env"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert eventually(lambda: compiles(b["root"]) >= 2 and server_pids(b["settings"]), 60)
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode != 0
    assert eventually(lambda: not server_pids(b["settings"])), f"the server outlived a build that ended in {end}"


def test_the_first_cluster_failure_is_said_when_a_parallel_one_lands_before_it_is_counted(tmp_path, monkeypatch,
                                                                                          capsys):
    """Issue 39, under load: two units failed on the cluster side by side, both lines were
    appended before either launcher counted, each counted 2, and nobody said the first line.
    Here a parallel unit's line lands right after this launcher's own."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("sccache_launcher_race",
                                                  BUILD_PY / "compiler_cache" / "sccache_launcher.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    fallbacks = tmp_path / launcher.FALLBACKS
    real_write = os.write

    def then_a_parallel_unit(fd, data):
        written = real_write(fd, data)
        with open(fallbacks, "ab") as f:
            f.write(b"1.000\tCMakeFiles/m.dir/other.cu.o\tunit-timeout\tno answer within 5 s\n")
        return written

    monkeypatch.setattr(launcher.os, "write", then_a_parallel_unit)
    launcher.record_fallback({"build_dir": str(tmp_path), "max_cluster_failures": 3, "scheduler": "http://s"},
                             "CMakeFiles/m.dir/x.cu.o", "unit-timeout", "no answer within 5 s")
    monkeypatch.undo()
    assert "the sccache-dist cluster failed CMakeFiles/m.dir/x.cu.o" in capsys.readouterr().err
    assert len(fallbacks.read_text().splitlines()) == 2
