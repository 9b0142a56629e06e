"""cmake/compiler_cache_probe.py with the real sccache (a build requirement) and the host
C++ compiler, each probe on a private server and cache dir of its own: a cache that
works, one that reads but cannot write (the build goes on, with a warning, recorded as
read-only), one that cannot be made (refused, naming SCCACHE_DIR); and what of it may
reach the wheel's build info (no paths, no credentials). The same probe runs inside a
configure in tests/dist/test_shared_cache.py (Redis, a server left running, ...)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from support.cmake_runner import clean_env, free_port, tool

PROBE = Path(__file__).resolve().parents[2] / "cmake" / "compiler_cache_probe.py"
_spec = importlib.util.spec_from_file_location("compiler_cache_probe", PROBE)
compiler_cache_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiler_cache_probe)


def probe(tmp_path: Path, sccache_dir: Path) -> dict:
    env = clean_env(SCCACHE_DIR=str(sccache_dir), SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="0")
    out = tmp_path / "result.json"
    try:
        proc = subprocess.run([sys.executable, str(PROBE), "probe", "--sccache", tool("sccache"),
                               "--cxx", shutil.which("c++"), "--work", str(tmp_path / "work"), "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=120)
    finally:  # the probe leaves this environment's own server running, as a build would use it
        subprocess.run([tool("sccache"), "--stop-server"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_a_working_cache_is_read_write_and_recorded_without_its_path(tmp_path):
    result = probe(tmp_path, tmp_path / "cache")
    assert result["ok"] is True, result["message"]
    assert (result["backend"], result["location"], result["rw_mode"]) == ("disk", "Local disk", "read-write")
    assert "second compile was a cache hit" in result["checks"]
    assert str(tmp_path) not in json.dumps(result)


def test_a_cache_that_reads_but_cannot_write_goes_on_with_a_warning(tmp_path):
    # Its shard folders are files: lookups miss, every store fails (root too cannot
    # make a folder below a file), and sccache starts as if nothing were wrong.
    cache = tmp_path / "cache"
    (cache / "preprocessor").mkdir(parents=True)
    for shard in "0123456789abcdef":
        (cache / shard).write_text("not a folder")
    result = probe(tmp_path, cache)
    assert result["ok"] is True, result["message"]
    assert result["rw_mode"] == "read-only"
    assert "second compile was a cache hit" not in result["checks"]
    assert "sccache reads its cache but could not write to it" in result["warning"]
    assert "Fix the backend's write access, or set its SCCACHE_*_RW_MODE=READ_ONLY" in result["warning"]


def test_a_cache_dir_that_cannot_be_made_is_refused_naming_sccache_dir(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    result = probe(tmp_path, tmp_path / "a-file" / "cache")
    assert result["ok"] is False and result["failure"] == "compile"
    assert "check that SCCACHE_DIR (or its default, ~/.cache/sccache) is a writable folder" in result["message"]
    assert "Not a directory" in result["message"]  # sccache's own words, for the console
    assert str(tmp_path) not in result["note"]  # the note goes into the build info


def test_what_reaches_the_build_info_has_no_paths_or_credentials():
    clean = compiler_cache_probe.without_secrets
    assert clean("redis, name: redis://ci:s3cret@cache:6379/0?password=x, prefix: /") == \
        "redis, name: redis://cache:6379/0, prefix: /"
    assert clean("scheduler https://tok@sched.example:10600/") == "scheduler https://sched.example:10600/"
    assert compiler_cache_probe.public_location('Local disk: "/home/ci/.cache/sccache"') == "Local disk"
    assert compiler_cache_probe.backend_of('Local disk: "/home/ci/.cache/sccache"') == "disk"
    assert compiler_cache_probe.backend_of("redis, name: redis://cache:6379, prefix: /") == "redis"
