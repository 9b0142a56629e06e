"""Does the compiler cache work, not only start? Called by cmake/CompilerCache.cmake.

    python compiler_cache_probe.py probe --sccache S --cxx CXX [--cuda NVCC] --work DIR --out RESULT.json
    python compiler_cache_probe.py stats --sccache S

`probe` answers, with sccache's own words, three questions before sccache is wired
in as the compiler launcher (see the comment at the top of CompilerCache.cmake):

1. What does this environment ask for? A private sccache server (a free port of its
   own) is started with this environment: its statistics name the backend
   (`cache_location`), `--dist-status` the scheduler.
2. Does it work? A tiny C++ file with a unique string in it is compiled through that
   server twice: both must succeed, and the second must be a cache hit (read-write
   cache). A read-only cache (SCCACHE_*_RW_MODE=READ_ONLY) passes when both compiles
   succeed and nothing failed to read. With a scheduler configured, the first compile
   runs on a build server, and a tiny CUDA file is compiled too (it must run remotely
   or fall back to local; a build server that cannot run the toolchain fails it).
3. Does the server the build will talk to (this environment's SCCACHE_SERVER_PORT or
   SCCACHE_SERVER_UDS) use the same backend and scheduler? A server keeps the
   configuration it was started with, so one left running by an earlier build with
   other SCCACHE_* settings would silently override these. It is restarted.

The answer is one JSON object (`--out`): `ok`, `failure` (a class name) and `message`
when not ok, and what was found: `backend`, `location`, `rw_mode`, `checks`,
`restarted`, `dist`. Secrets (URL credentials) never get into it.

`stats` prints sccache's statistics (the text that `sccache --show-stats` prints) and
one line saying how many compiles ran on build servers and how many here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from url_secrets import without_secrets  # noqa: E402  the project's one URL scrubber (cmake/url_secrets.py)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dist-compile"))
from compile_env import client_env  # noqa: E402  (what a compile sent to build servers may carry)

START_NOTE = "sccache could not start (its cache backend did not answer; check the SCCACHE_* settings)"
TIMEOUT_S = 300  # one sccache call; a first distributed compile packages the toolchain


class ProbeFailure(Exception):
    """failure: a class name; message: for the console (with sccache's own words);
    note: for the build info (no output of this machine: no paths)."""

    def __init__(self, failure: str, message: str, note: str = ""):
        super().__init__(message)
        self.failure = failure
        self.message = message
        self.note = note or message


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProbeFailure("timeout", f"'{' '.join(cmd[:3])} ...' did not answer within {TIMEOUT_S} s") from None


def output_of(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stderr + proc.stdout).split())[:1500]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_of(location: str) -> str:
    """sccache's cache_location -> a backend name: 'Local disk: "/x"' -> disk, 'redis, name: ...' -> redis."""
    if location.startswith("Local disk"):
        return "disk"
    return location.split(",", 1)[0].strip().lower() or "unknown"


def public_location(location: str) -> str:
    """What may go into the wheel: no local paths, no credentials."""
    if location.startswith("Local disk"):
        return "Local disk"
    return without_secrets(location)


def show_stats(sccache: str, env: dict[str, str]) -> dict:
    proc = run([sccache, "--show-stats", "--stats-format=json"], env)
    if proc.returncode != 0:
        raise ProbeFailure("start", f"sccache could not start ({output_of(proc)})", START_NOTE)
    return json.loads(proc.stdout)


def dist_status(sccache: str, env: dict[str, str]) -> dict:
    """{"scheduler": URL or None, "state": disabled|connected|not-connected, servers, cpus, detail}."""
    proc = run([sccache, "--dist-status"], env)
    try:
        status = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"scheduler": None, "state": "unknown", "detail": output_of(proc)}
    if "SchedulerStatus" in status:
        url, info = status["SchedulerStatus"]
        return {"scheduler": without_secrets(url), "state": "connected", "servers": info.get("num_servers", 0),
                "cpus": info.get("num_cpus", 0), "in_progress": info.get("in_progress", 0)}
    if "NotConnected" in status:
        url, detail = status["NotConnected"]
        return {"scheduler": without_secrets(url), "state": "not-connected", "detail": detail}
    return {"scheduler": None, "state": "disabled"}


def counters(stats: dict) -> dict[str, int]:
    s = stats["stats"]
    return {"hits": sum(s["cache_hits"]["counts"].values()), "misses": sum(s["cache_misses"]["counts"].values()),
            "errors": sum(s["cache_errors"]["counts"].values()), "read_errors": s["cache_read_errors"],
            "writes": s["cache_writes"], "write_errors": s["cache_write_errors"],
            "remote": sum(s.get("dist_compiles", {}).values()), "dist_errors": s.get("dist_errors", 0),
            "compilations": s.get("compilations", 0)}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def read_only_asked(env: dict[str, str]) -> bool:
    return any(k.startswith("SCCACHE_") and k.endswith("_RW_MODE") and v.strip().upper() == "READ_ONLY"
               for k, v in env.items())


def classify_compile_failure(proc: subprocess.CompletedProcess, env: dict[str, str], what: str) -> ProbeFailure:
    why = output_of(proc)
    conf = env.get("SCCACHE_CONF", "sccache's config file")
    if "http error status" in why and ("401" in why or "403" in why or "token" in why.lower()):
        return ProbeFailure("dist-auth",
                            f"the sccache-dist scheduler refused this client ({why}); every compile would fail. "
                            f"The token under [dist.auth] in {conf} must equal the scheduler's client_auth token "
                            "(dist-compile/README.md)", "the sccache-dist scheduler refused this client's token")
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


def check_private_server(args, env: dict[str, str], work: Path) -> dict:
    """Steps 1 and 2 on a server of our own: what is asked for, and does it work."""
    found: dict = {"checks": []}
    proc = run([args.sccache, "--start-server"], env)
    if proc.returncode != 0:
        raise ProbeFailure("start", f"sccache could not start ({output_of(proc)})", START_NOTE)
    stats = show_stats(args.sccache, env)
    found["location"] = stats.get("cache_location", "")
    found["version"] = stats.get("version", "")
    found["dist"] = dist_status(args.sccache, env)
    # With a scheduler, compiles leave this machine: like the build's (compile_env.py), the
    # probe's carry only what a compile needs; the server above holds the cache's settings.
    shipped = client_env(env) if found["dist"]["scheduler"] else env

    nonce = uuid.uuid4().hex
    source = work / "probe.cpp"
    source.write_text(f'const char* vfa_cache_probe() {{ return "{nonce}"; }}\n')
    before = counters(stats)
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

    found["dist"]["probe"] = None
    if found["dist"]["state"] == "connected":
        # Compiles on build servers: C++ above; CUDA's cicc/ptxas steps here.
        found["dist"]["probe"] = "C++ remote" if d1["remote"] else "C++ local (fell back)"
        if args.cuda:
            cu = work / "probe.cu"
            cu.write_text(f'__global__ void vfa_cache_probe_kernel(int* x) {{ x[0] = {len(nonce)}; }}\n'
                          f'const char* vfa_cache_probe_cu() {{ return "{nonce}"; }}\n')
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
        found["dist"]["remote_ok"] = bool(d1["remote"]) and cuda_remote
    return found


def server_view(sccache: str, env: dict[str, str]) -> tuple[str, str | None]:
    return show_stats(sccache, env).get("cache_location", ""), dist_status(sccache, env)["scheduler"]


def probe(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    private = dict(env, SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="120")
    private.pop("SCCACHE_SERVER_UDS", None)
    result: dict = {"ok": False, "failure": None, "message": "", "note": "", "restarted": None}
    try:
        found = check_private_server(args, private, work)
    except ProbeFailure as exc:
        result.update(failure=exc.failure, message=exc.message, note=exc.note)
        return result
    finally:
        run([args.sccache, "--stop-server"], private)
    asked = (found["location"], found["dist"]["scheduler"])
    result.update(ok=True, backend=backend_of(found["location"]), location=public_location(found["location"]),
                  rw_mode=found["rw_mode"], version=found["version"], checks=found["checks"], dist=found["dist"],
                  warning=found.get("warning", ""))

    # Step 3: the server the build's compiles will go to.
    try:
        running = server_view(args.sccache, env)
        if running != asked:
            result["restarted"] = {"was": public_location(running[0]), "was_scheduler": running[1]}
            run([args.sccache, "--stop-server"], env)
            running = server_view(args.sccache, env)
            if running != asked:
                raise ProbeFailure("mismatch", f"the sccache server still uses {public_location(running[0])} "
                                               f"after a restart, not {result['location']}")
        zero = run([args.sccache, "--zero-stats"], env)
        if zero.returncode != 0:
            raise ProbeFailure("start", f"sccache could not start ({output_of(zero)})", START_NOTE)
    except ProbeFailure as exc:
        result.update(ok=False, failure=exc.failure, message=exc.message, note=exc.note)
    return result


def stats(args) -> int:
    env = dict(os.environ)
    text = run([args.sccache, "--show-stats"], env)
    print(text.stdout, end="")
    try:
        c = counters(show_stats(args.sccache, env))
        status = dist_status(args.sccache, env)
    except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
        print(f"distributed compiles: unknown ({exc})")
        return 0
    if status["state"] != "disabled":
        local = max(c["compilations"] - c["remote"], 0)
        print(f"distributed compiles (scheduler {status['scheduler']}, {status['state']}): {c['remote']} ran on "
              f"build servers, {local} here ({c['dist_errors']} of them after a failed remote attempt)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--sccache", required=True)
    p.add_argument("--cxx", required=True)
    p.add_argument("--cuda", default="", help="nvcc, probed on build servers when a scheduler is configured")
    p.add_argument("--cuda-flag", action="append", default=[], help="an nvcc flag (-ccbin ...), repeatable")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    s = sub.add_parser("stats")
    s.add_argument("--sccache", required=True)
    args = parser.parse_args(argv)
    if args.command == "stats":
        return stats(args)
    result = probe(args)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
