"""The compiler-cache probe's steps 1 and 2, on a private sccache server: what is asked for, does it work.

A server of its own (a free port, this environment) says which backend and scheduler this
environment asks for; a tiny C++ file with a unique string is compiled through it twice
(both must succeed, the second must be a cache hit; a read-only cache passes when nothing
failed to read); with a scheduler, the first compile runs on a build server and a tiny CUDA
file is compiled too. A failure is classified (ProbeFailure: start, read, write, compile,
dist-auth, dist-toolchain) with sccache's own words. Used by cmake/vfa_build/compiler_cache/compiler_cache_probe.py.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from pathlib import Path

from vfa_build.cluster.compile_env import client_env  # (cmake/vfa_build/cluster/compile_env.py: what a compile sent to build servers may carry)
from vfa_build.compiler_cache.sccache_config import refused_fix  # what to do about a refused token (also the launcher's)
from vfa_build.compiler_cache.sccache_stats import ProbeFailure, counters, delta, dist_status, output_of, run, show_stats


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_only_asked(env: dict[str, str]) -> bool:
    return any(k.startswith("SCCACHE_") and k.endswith("_RW_MODE") and v.strip().upper() == "READ_ONLY"
               for k, v in env.items())


def classify_compile_failure(proc: subprocess.CompletedProcess, env: dict[str, str], what: str) -> ProbeFailure:
    why = output_of(proc)
    conf = env.get("SCCACHE_CONF", "sccache's config file")
    if "http error status" in why and ("401" in why or "403" in why or "token" in why.lower()):
        return ProbeFailure("dist-auth",
                            f"the sccache-dist scheduler refused this client ({why}); every compile would fail: "
                            + refused_fix(conf, accepted_before=False),
                            "the sccache-dist scheduler refused this client's token")
    if "Job failed on server" in why:
        return ProbeFailure("dist-toolchain",
                            f"a build server could not run the {what} compiler ({why}); every compile sent there "
                            "would fail. The build servers must run this client's OS and CPU architecture (an "
                            f"aarch64 client needs aarch64 servers), and a [[dist.toolchains]] entry in {conf} "
                            "must point at a working archive (dist-compile/README.md)",
                            f"a build server could not run the {what} compiler")
    hint = ("check that SCCACHE_DIR (or its default, ~/.cache/sccache) is a writable folder"
            if "directory" in why.lower() or "permission" in why.lower() or "read-only" in why.lower()
            else "check the SCCACHE_* settings")
    return ProbeFailure("compile", f"a {what} compile through sccache failed ({why}); {hint}",
                        f"a {what} compile through sccache failed; {hint}")


def compile_through(sccache: str, env: dict[str, str], compiler: list[str], source: Path, what: str) -> None:
    obj = source.with_suffix(source.suffix + ".o")
    obj.unlink(missing_ok=True)
    proc = run([sccache, *compiler, "-c", str(source), "-o", str(obj)], env, cwd=source.parent)
    if proc.returncode != 0 or not obj.is_file():
        raise classify_compile_failure(proc, env, what)


def wait_for_write(sccache: str, env: dict[str, str], before: dict[str, int], seconds: float = 20) -> dict[str, int]:
    """sccache stores a result after it answers the compile: wait until it did (or failed to)."""
    deadline = time.monotonic() + seconds
    while True:
        now = counters(show_stats(sccache, env))
        if now["writes"] > before["writes"] or now["write_errors"] > before["write_errors"]:
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def check_private_server(args, env: dict[str, str], work: Path, start_failed, cache: bool = True) -> dict:
    """Steps 1 and 2 on a server of our own: what is asked for, and does it work. <cache>: the
    cache is checked (two compiles); else only the cluster the server is connected to."""
    found: dict = {"checks": []}
    proc = run([args.sccache, "--start-server"], env)
    if proc.returncode != 0:
        raise start_failed(proc)
    stats = show_stats(args.sccache, env)
    found["location"] = stats.get("cache_location", "")
    found["version"] = stats.get("version", "")
    found["dist"] = dist_status(args.sccache, env)
    # With a scheduler, compiles leave this machine: like the build's (compile_env.py), the
    # probe's carry only what a compile needs; the server above holds the cache's settings.
    shipped = client_env(env) if found["dist"]["scheduler"] else env

    nonce = uuid.uuid4().hex
    if cache:
        found.update(check_cache(args, env, shipped, work, nonce, counters(stats)))
        cpp_remote = found.pop("cpp_remote")
    elif found["dist"]["state"] == "connected":
        # The cluster alone (the cache was checked on a server without [dist]): one C++ compile.
        source = work / "probe-cluster.cpp"
        source.write_text(f'const char* vfa_cluster_probe() {{ return "{nonce}"; }}\n', encoding="utf-8")
        before = counters(stats)
        compile_through(args.sccache, shipped, [args.cxx], source, "C++")
        cpp_remote = delta(counters(show_stats(args.sccache, env)), before)["remote"]
        found["checks"].append("C++ compile through sccache")
        if cpp_remote:
            found["checks"].append("C++ compile on a build server")
    else:
        cpp_remote = 0

    found["dist"]["probe"] = None
    if found["dist"]["state"] == "connected":
        # Compiles on build servers: C++ above; CUDA's cicc/ptxas steps here.
        found["dist"]["probe"] = "C++ remote" if cpp_remote else "C++ local (fell back)"
        if args.cuda:
            cu = work / "probe.cu"
            cu.write_text(f'__global__ void vfa_cache_probe_kernel(int* x) {{ x[0] = {len(nonce)}; }}\n'
                          f'const char* vfa_cache_probe_cu() {{ return "{nonce}"; }}\n', encoding="utf-8")
            before = counters(show_stats(args.sccache, env))
            compile_through(args.sccache, shipped, [args.cuda, *args.cuda_flag], cu, "CUDA")
            d = delta(counters(show_stats(args.sccache, env)), before)
            found["dist"]["probe"] += ", CUDA " + ("remote" if d["remote"] else "local (fell back)")
            cuda_remote = bool(d["remote"])
            if cuda_remote:
                found["checks"].append("CUDA compile steps on a build server")
        else:
            cuda_remote = True
        # The job pool is sized for the cluster only when the heavy (CUDA) units run there.
        found["dist"]["remote_ok"] = bool(cpp_remote) and cuda_remote
    return found


def check_cache(args, env: dict[str, str], shipped: dict[str, str], work: Path, nonce: str, before: dict) -> dict:
    """Step 2: a unique C++ file compiled twice; the second must be a cache hit (read-write)."""
    found: dict = {"checks": []}
    source = work / "probe.cpp"
    source.write_text(f'const char* vfa_cache_probe() {{ return "{nonce}"; }}\n', encoding="utf-8")
    compile_through(args.sccache, shipped, [args.cxx], source, "C++")
    first = wait_for_write(args.sccache, env, before)
    compile_through(args.sccache, shipped, [args.cxx], source, "C++")
    second = counters(show_stats(args.sccache, env))
    d1, d2 = delta(first, before), delta(second, first)
    found["checks"].append("C++ compile through sccache")
    if d1["remote"]:
        found["checks"].append("C++ compile on a build server")
    if d1["read_errors"] or d1["errors"] or d2["read_errors"] or d2["errors"]:
        raise ProbeFailure("read", "sccache could not read its cache (cache errors during a probe compile); "
                                   "check the SCCACHE_* settings of the backend")
    if d2["hits"] >= 1:
        found["rw_mode"] = "read-write"
        found["checks"].append("second compile was a cache hit")
    elif read_only_asked(env):
        # sccache counts the writes it skips as write errors: only reads are checked here.
        found["rw_mode"] = "read-only"
        found["checks"].append("read-only cache: read without errors, nothing stored (as asked)")
    elif d1["write_errors"]:
        found["rw_mode"] = "read-only"
        found["warning"] = ("sccache reads its cache but could not write to it: this build's results will not "
                            "be stored. Fix the backend's write access, or set its SCCACHE_*_RW_MODE=READ_ONLY "
                            "if reading only is intended")
    else:
        raise ProbeFailure("write", "a compile through sccache was not stored in its cache (no write, no error "
                                    "reported; the second compile missed); check the SCCACHE_* settings")
    found["cpp_remote"] = d1["remote"]
    return found


def on_private_server(args, env: dict[str, str], work: Path, start_failed,
                      cluster_env: dict[str, str] | None = None) -> dict:
    """Steps 1 and 2 on a private server of <env>. With <cluster_env> (a scheduler is configured):
    the cache is checked on a server of <env> (its config without [dist]: nothing leaves this
    machine), and the cluster on a second one of <cluster_env>, whose cache is read-only as the
    build's cluster server's is, so no object a build server made enters any cache."""
    found = _on_one_server(args, env, work, start_failed, cache=True)
    if cluster_env is not None:
        cluster = _on_one_server(args, cluster_env, work, start_failed, cache=False)
        found["dist"] = cluster["dist"]
        found["checks"] += cluster["checks"]
    return found


def _on_one_server(args, env: dict[str, str], work: Path, start_failed, cache: bool) -> dict:
    private = dict(env, SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="120")
    private.pop("SCCACHE_SERVER_UDS", None)
    try:
        return check_private_server(args, private, work, start_failed, cache)
    finally:
        run([args.sccache, "--stop-server"], private)
