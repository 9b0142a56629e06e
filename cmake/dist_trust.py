"""What a build trusts of the objects an sccache-dist cluster returns (dist-compile/README.md,
"Trust model").

A build server holding a valid token can return any object for a compile it is sent. Two
rules keep such an object out of what others use:

1. Not into the shared cache. sccache writes the result of a remote compile into its cache
   as if it had compiled it, and records no server for it (its statistics count compiles
   per server, not which object came from where), so a cache entry cannot carry the
   identity of the server that built it. A build whose compiles go to a cluster therefore
   reads the shared cache and writes nothing into it: its sccache server runs with every
   backend read-only (read_only_server_env, and read_only_conf for a cache configured in
   SCCACHE_CONF), as Bazel's remote execution keeps results of untrusted executors out of
   the action cache. Builds that compile on their own machine fill the cache.
     compiler_cache_probe.py (the build's servers) calls these.
2. A sample checked here. With VFA_DIST_VERIFY=N (release builds: docs/release.md), one unit
   in N of those compiled through the cluster's server is compiled again on this machine,
   through an sccache server of its own with an empty cache and no cluster (sccache splits
   an nvcc call into steps, and the cluster runs some of them: the same split here), and
   must give the same object; a difference fails the build (verify_unit). sccache's
   compiles are deterministic (nvcc alone is not: its per-process temporary names,
   tmpxft_<pid>_<n>, are set equal before the bytes are compared, should one appear).
     sccache_launcher.py calls verify_unit after a compile through the cluster succeeded.

Standard library only (the launcher runs once per unit, as `python -E -s -S`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Every cache backend's read-only switch in sccache 0.16 (its config.rs); the one of the
# backend in use applies, the others are ignored.
RW_MODE_VARS = ("SCCACHE_LOCAL_RW_MODE", "SCCACHE_S3_RW_MODE", "SCCACHE_REDIS_RW_MODE", "SCCACHE_MEMCACHED_RW_MODE",
                "SCCACHE_GCS_RW_MODE", "SCCACHE_GHA_RW_MODE", "SCCACHE_AZURE_RW_MODE", "SCCACHE_WEBDAV_RW_MODE",
                "SCCACHE_OSS_RW_MODE", "SCCACHE_COS_RW_MODE")
READ_ONLY = "READ_ONLY"
# Written at configure (cmake/DistTrust.cmake) into the build dir.
VERIFY_FILE = "vfa-dist-verify.json"
# nvcc names its temporary files (and symbols derived from them) after its process id.
NVCC_TEMPORARY = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")


def read_only_server_env() -> dict[str, str]:
    """The variables that make an sccache server's cache read-only, whichever backend it uses."""
    return {name: READ_ONLY for name in RW_MODE_VARS}


def read_only_conf(path: Path) -> str | None:
    """The text of the sccache config file <path> with rw_mode = "READ_ONLY" in each of its
    [cache.<backend>] tables (its [dist] kept); None when it has no cache table, or when
    such a copy cannot be made safely (checked by parsing both)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        conf = json.loads(text)
        caches = conf.get("cache") or {}
        if not caches:
            return None
        for table in caches.values():
            table["rw_mode"] = READ_ONLY
        return json.dumps(conf)
    try:
        import tomllib
    except ImportError:
        return None
    try:
        want = tomllib.loads(text)
    except ValueError:
        return None
    if not want.get("cache"):
        return None
    lines, in_cache = [], False
    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[\s*([^\]\[]+?)\s*\]\s*(#.*)?$", line)
        if header:
            in_cache = header.group(1).split(".")[0].strip().strip("\"'") == "cache" and "." in header.group(1)
            lines.append(line if line.endswith("\n") else line + "\n")
            if in_cache:
                lines.append(f'rw_mode = "{READ_ONLY}"\n')
            continue
        if in_cache and re.match(r"\s*rw_mode\s*=", line):
            continue
        lines.append(line)
    copy = "".join(lines)
    try:
        got = tomllib.loads(copy)
    except ValueError:
        return None
    for table in want["cache"].values():
        table["rw_mode"] = READ_ONLY
    return copy if got == want else None


# --- 2. a sample checked here -------------------------------------------------------------

def verify_every(build_dir: str) -> int:
    """VFA_DIST_VERIFY as the configure wrote it: 0 (off) or N (one unit in N)."""
    try:
        return int(json.loads((Path(build_dir) / VERIFY_FILE).read_text(encoding="utf-8")).get("every", 0))
    except (OSError, ValueError):
        return 0


def in_sample(unit: str, every: int) -> bool:
    """Whether <unit> is among the one in <every> checked: by its name, the same in every build."""
    if every <= 0:
        return False
    return int(hashlib.sha256(unit.encode()).hexdigest(), 16) % every == 0


def comparable(data: bytes) -> bytes:
    """An object's bytes with nvcc's per-process temporary names set equal (same length)."""
    return NVCC_TEMPORARY.sub(b"tmpxft_00000000_00000000", data)


def _with_output(command: list[str], output: str, depfile: str) -> list[str]:
    """<command> writing its object to <output> (and any -MF depfile to <depfile>)."""
    changed = list(command)
    for flag, path in (("-o", output), ("-MF", depfile)):
        if flag in changed[:-1]:
            changed[changed.index(flag) + 1] = path
    return changed


def _object_of(command: list[str]) -> str | None:
    return command[command.index("-o") + 1] if "-o" in command[:-1] else None


def compile_here(sccache: str, command: list[str], scratch: Path) -> subprocess.CompletedProcess:
    """<command> compiled on this machine by an sccache server of its own with an empty cache
    and no [dist]: the compile the cluster's server would have run, step for step (sccache
    splits an nvcc call into its steps itself, and gives other bytes than nvcc alone), with
    nothing read from any cache. sccache's decomposed compiles are deterministic."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    (scratch / "empty.toml").write_text("", encoding="utf-8")
    env.update(SCCACHE_DIR=str(scratch / "cache"), SCCACHE_CONF=str(scratch / "empty.toml"), SCCACHE_IDLE_TIMEOUT="0",
               SCCACHE_SERVER_UDS=f"\\x00vfa-verify-{os.getpid()}-{hashlib.sha256(str(scratch).encode()).hexdigest()[:12]}")
    try:
        return subprocess.run([sccache, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def verify_unit(settings: dict, unit: str, command: list[str]) -> int:
    """After <command> (a compiler and its arguments) succeeded through the cluster's sccache
    server: when <unit> is in the sample, compile it here (compile_here) and compare. Returns
    0 when it matches (or is not checked), else 1, having said why and removed the object (so
    nothing links it and a rebuild compiles it again)."""
    every = verify_every(settings["build_dir"])
    obj = _object_of(command)
    if obj is None or not in_sample(unit, every):
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="vfa-verify-", dir=settings["build_dir"]))
    here = str(scratch / "here.o")
    try:
        local = compile_here(settings["sccache"], _with_output(command, here, f"{here}.d"), scratch)
        if local.returncode != 0:
            print(f"vendored-flash-attn: VFA_DIST_VERIFY: {unit} compiled through the sccache-dist cluster, but "
                  f"its compile here failed ({local.returncode}):\n{local.stderr.decode(errors='replace')[-2000:]}",
                  file=sys.stderr)
            _remove(obj)
            return 1
        got, want = comparable(Path(obj).read_bytes()), comparable(Path(here).read_bytes())
        if got == want:
            return 0
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"vendored-flash-attn: VFA_DIST_VERIFY: the object of {unit} that came through the sccache-dist "
              f"cluster {settings.get('scheduler', '')} differs from a compile of the same command here ({len(got)} "
              f"bytes against {len(want)}, first difference at byte {first}): a build server returned something "
              f"other than the compiler makes. The build stops: nothing it built from the cluster can be trusted. "
              f"Find the server (`sccache --show-stats` with this build's server counts compiles per server; its "
              f"log), take it out of the cluster and rotate the key (dist-compile/README.md, \"Trust model\").",
              file=sys.stderr)
        _remove(obj)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
