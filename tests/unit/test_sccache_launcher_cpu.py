"""cmake/sccache_launcher.py, the build's compiler launcher, with a stand-in for sccache that
fails the way sccache-dist does (a 401 from a scheduler restarted with new secrets; a job
that fails on a build server) and a stand-in compiler: a cluster failure is compiled here
and counted, once per unit; the first prints a line, the third turns the cluster off for
the rest of the build; a compile error in the source fails and is shown once, uncounted.
The same with the real scheduler and servers: tests/dist/test_sccache_dist.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[2] / "cmake" / "sccache_launcher.py"

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
           "SCCACHE_CONF": str(root / "client.toml")}
    return subprocess.run([sys.executable, "-E", "-s", "-S", str(LAUNCHER), str(root / "build" / "vfa-sccache.json"),
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
    assert "Error 401" not in results[3].stderr + results[4].stderr  # quiet once the cluster is off
    assert kinds(build) == [cluster] * 3
    assert (build / "build" / "vfa-dist-off").exists()
    # Units 1-3: the cluster, then here; units 4 and 5: here only.
    assert confs(build) == ["client.toml", "local.toml"] * 3 + ["local.toml"] * 2


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
