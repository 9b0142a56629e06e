"""Does the compiler cache work, not only start? Called by cmake/CompilerCache.cmake.

    python compiler_cache_probe.py probe --sccache S --cxx CXX [--cuda NVCC] --work DIR --build-dir B --out RESULT.json
    python compiler_cache_probe.py stats --sccache S [--settings B/vfa-sccache.json]
    python compiler_cache_probe.py stop --settings B/vfa-sccache.json

`probe` answers, with sccache's own words, four questions before sccache is wired
in as the compiler launcher (see the comment at the top of CompilerCache.cmake):

0. What is configured? SCCACHE_CONF must name a file that exists (sccache itself ignores
   a missing one without a word). A [dist] scheduler_url there is asked one HTTP
   question, bounded (SCHEDULER_ANSWER_S): one that accepts connections and never
   answers would hold every sccache server start past sccache's startup timeout, so
   this build then runs with the same settings minus [dist] (compiles here, cached).
1. What does this environment ask for? A private sccache server (a free port of its
   own) is started with this environment: its statistics name the backend
   (`cache_location`), `--dist-status` the scheduler.
2. Does it work? A tiny C++ file with a unique string in it is compiled through that
   server twice: both must succeed, and the second must be a cache hit (read-write
   cache). A read-only cache (SCCACHE_*_RW_MODE=READ_ONLY) passes when both compiles
   succeed and nothing failed to read. With a scheduler configured, the first compile
   runs on a build server, and a tiny CUDA file is compiled too (it must run remotely
   or fall back to local; a build server that cannot run the toolchain fails it).
3. Which server will the build's compiles go to? Without an SCCACHE_SERVER_PORT or
   SCCACHE_SERVER_UDS in the environment, one of this build dir's own (an abstract
   unix socket named after the build dir): the default-port server, which another
   build on this machine may be using, is never stopped, restarted or zeroed. With
   one set, that server is the build's: it is restarted when it runs with other
   settings (a server keeps the configuration it started with) and its statistics are
   zeroed. What the build's launcher needs (cmake/sccache_launcher.py) goes into
   B/vfa-sccache.json.

The answer is one JSON object (`--out`): `ok`, `failure` (a class name) and `message`
when not ok, and what was found: `backend`, `location`, `rw_mode`, `checks`,
`restarted`, `dist`, `conf_problem`. Secrets (URL credentials) never get into it.

`stats` (the end of the build) writes sccache's statistics (the text that
`sccache --show-stats` prints) into the build's compile log, and prints one line saying how
many units the cache answered and, with a scheduler, one saying how many compiles ran on
build servers and how many here. With --settings it reads the build's own servers and the
launcher's fallbacks and writes them into B/build_info.json's compiler_cache.dist:
`build` (remote compiles, compiles here, fallbacks, the units) and `used` (did any
compile of this build run on a build server). Like the rest of compiler_cache, they are
this machine's readings: the wheel's build info does not hold them. `stop` stops the
build's own servers (tests; a build dir being removed).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from url_secrets import secrets_in, without_secrets  # noqa: E402  the project's one URL scrubber (cmake/url_secrets.py)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dist-compile"))
from compile_env import client_env  # noqa: E402  (what a compile sent to build servers may carry)
from dist_trust import read_only_conf, read_only_server_env  # noqa: E402  (cmake/dist_trust.py)
from dist_bound import DIST_LOG  # noqa: E402  (cmake/dist_bound.py: the cluster server's log the launcher reads)

COMPILE_ENV_SCRIPT = Path(__file__).resolve().parent.parent / "dist-compile" / "compile_env.py"

try:
    import tomllib
except ImportError:  # Python < 3.11: no [dist]-less copy of SCCACHE_CONF, no local fallback server
    tomllib = None

START_NOTE = "sccache could not start (check the SCCACHE_* settings)"
TIMEOUT_S = 300  # one sccache call; a first distributed compile packages the toolchain
SCHEDULER_ANSWER_S = 5  # sccache's own connect timeout to a scheduler is 5 s
# Written into the build dir by `probe`, read by cmake/sccache_launcher.py and `stats`.
SETTINGS = "vfa-sccache.json"
LOCAL_CONF = "vfa-sccache-local.toml"
DIST_CONF = "vfa-sccache-dist.toml"  # SCCACHE_CONF with its caches read-only (cluster_server_settings)
FALLBACKS = "vfa-dist-fallbacks.tsv"  # one line per unit the launcher compiled here after a cluster failure
# What the build dir's own servers had counted when the builds that ran them stopped them
# (sccache_launcher.py stops them when ninja ends), since the last end-of-build report: added
# to the live servers' counts by `stats`, which then clears it.
COUNTS = "vfa-sccache-counts.json"
DIST_OFF = "vfa-dist-off"  # exists once the launcher stopped sending compiles to the cluster
MAX_CLUSTER_FAILURES = 3
# Probe failures that a build without [dist] may not have: it is tried before giving up the cache.
DIST_FAILURES = ("start", "dist-auth", "dist-toolchain")
# Settings that select a remote cache backend (sccache's docs): named when a server cannot start.
BACKEND_VARS = ("SCCACHE_REDIS", "SCCACHE_REDIS_ENDPOINT", "SCCACHE_REDIS_CLUSTER_ENDPOINTS", "SCCACHE_MEMCACHED",
                "SCCACHE_MEMCACHED_ENDPOINT", "SCCACHE_BUCKET", "SCCACHE_GCS_BUCKET", "SCCACHE_AZURE_BLOB_CONTAINER",
                "SCCACHE_WEBDAV_ENDPOINT", "SCCACHE_GHA_ENABLED", "SCCACHE_OSS_BUCKET", "SCCACHE_COS_BUCKET")


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


# --- 0. what is configured -------------------------------------------------------------

def sccache_conf_path(env: dict[str, str]) -> tuple[Path, bool]:
    """The config file sccache reads, and whether SCCACHE_CONF named it (sccache's config_file())."""
    if env.get("SCCACHE_CONF"):
        return Path(env["SCCACHE_CONF"]), True
    base = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "/")) / ".config")
    return base / "sccache" / "config", False


def read_conf(path: Path) -> dict | None:
    """The parsed config file, or None when it is missing or cannot be parsed here (sccache
    then says what is wrong with it when its server starts)."""
    try:
        text = path.read_text()
        if path.suffix == ".json":
            return json.loads(text)
        return tomllib.loads(text) if tomllib else None
    except (OSError, ValueError):
        return None


def without_dist(path: Path) -> str | None:
    """The config file's text minus its [dist] tables (the same cache settings, no scheduler),
    checked by parsing both; None when that cannot be made safely."""
    text = path.read_text()
    if path.suffix == ".json":
        conf = json.loads(text)
        conf.pop("dist", None)
        return json.dumps(conf)
    if tomllib is None:
        return None
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$", line)
        if header:
            skipping = header.group(1).split(".")[0].strip().strip("\"'") == "dist"
        if not skipping:
            kept.append(line)
    local = "".join(kept)
    try:
        want, got = tomllib.loads(text), tomllib.loads(local)
    except ValueError:
        return None
    want.pop("dist", None)
    return local if got == want else None


def scheduler_credentials(url: str, public_url: str, conf_path: Path) -> ProbeFailure | None:
    """A scheduler URL that carries a user, password or query: refused for what it is. sccache-dist
    authenticates a client by the token under [dist.auth], never by the URL, and sccache writes the
    URL into its logs and `--dist-status` output (a 401 would be blamed on the token)."""
    found = secrets_in(url)
    if not found:
        return None
    return ProbeFailure("dist-credentials",
                        f"the sccache-dist scheduler_url in {conf_path} carries {' and '.join(found)} "
                        f"({public_url} without it): sccache-dist takes a client's credentials from the token under "
                        "[dist.auth] only, never from the URL, and sccache would write the URL into its logs and "
                        "its --dist-status output. Take the credentials out of scheduler_url (a proxy that needs "
                        "its own login belongs in front of the scheduler, not in the URL); the token stays in "
                        "[dist.auth] of that 0600 file (dist-compile/cluster.py client writes it so)",
                        "the scheduler URL carries credentials")


def scheduler_hang(url: str, seconds: float = SCHEDULER_ANSWER_S) -> str | None:
    """How a scheduler that accepts connections but does not answer HTTP looks, or None.
    A refused or unreachable one is sccache's to report (its server starts and says
    'not connected'); one that accepts and stays silent holds the server's start."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=seconds)
    try:
        try:
            conn.connect()
        except OSError:
            return None
        try:
            conn.request("GET", "/api/v1/scheduler/status", headers={"Connection": "close"})
            conn.getresponse()
        except (TimeoutError, socket.timeout):
            return f"it accepts connections but sent no answer within {seconds:g} s"
        except (OSError, http.client.HTTPException):
            return None
        return None
    finally:
        conn.close()


def backend_settings(env: dict[str, str], conf: dict | None, conf_path: Path) -> list[str]:
    """The settings that pick a remote cache backend, for a message (no credentials)."""
    found = [f"{k}={without_secrets(env[k])}" if "://" in env[k] else k
             for k in BACKEND_VARS if env.get(k)]
    for name in (conf or {}).get("cache", {}) or {}:
        if name != "disk":
            found.append(f"[cache.{name}] in {conf_path}")
    return found


def start_failure(proc: subprocess.CompletedProcess, env: dict[str, str], conf: dict | None,
                  conf_path: Path) -> ProbeFailure:
    why = output_of(proc)
    backends = backend_settings(env, conf, conf_path)
    if backends:
        named = ", ".join(backends)
        how = ("did not answer within sccache's startup timeout (10 s; server_startup_timeout_ms in its config "
               "file)" if "timed out" in why.lower() else "could not be reached")
        return ProbeFailure("start", f"sccache could not start ({why}): its cache backend ({named}) {how}. Check "
                                     "that it is up and reachable from here, or unset "
                                     f"{backends[0].split('=')[0]} to cache on the local disk",
                            "sccache could not start (its cache backend did not answer)")
    return ProbeFailure("start", f"sccache could not start ({why}); check the SCCACHE_* settings", START_NOTE)


# --- 1. and 2. a private server ----------------------------------------------------------

def show_stats(sccache: str, env: dict[str, str], failure: ProbeFailure | None = None) -> dict:
    proc = run([sccache, "--show-stats", "--stats-format=json"], env)
    if proc.returncode != 0:
        raise failure or ProbeFailure("start", f"sccache could not start ({output_of(proc)})", START_NOTE)
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
            "compilations": s.get("compilations", 0), "requests": s.get("compile_requests", 0)}


UNIT_LANGUAGES = {"CUDA": "CUDA", "C/C++": "C++"}  # sccache's language of a CUDA unit, a C++ unit


def unit_counts(stats: dict) -> dict[str, int]:
    """counters() plus the hits and misses of whole units (hits:CUDA, misses:C/C++, ...)."""
    found = counters(stats)
    for kind in ("hits", "misses"):
        for language in UNIT_LANGUAGES:
            found[f"{kind}:{language}"] = stats["stats"][f"cache_{kind}"]["counts"].get(language, 0)
    return found


def saved_counts(build_dir: Path) -> dict[str, dict[str, int]]:
    try:
        return json.loads((build_dir / COUNTS).read_text())
    except (OSError, ValueError):
        return {}


def save_counts(sccache: str, env: dict[str, str], build_dir: Path, role: str) -> None:
    """Adds what a server of the build's has counted to COUNTS (role: "server", "local"), before
    it is stopped."""
    try:
        now = unit_counts(show_stats(sccache, env))
    except (ProbeFailure, ValueError, KeyError):
        return
    saved = saved_counts(build_dir)
    saved[role] = {k: saved.get(role, {}).get(k, 0) + v for k, v in now.items()}
    tmp = build_dir / (COUNTS + ".tmp")
    tmp.write_text(json.dumps(saved) + "\n")
    os.replace(tmp, build_dir / COUNTS)


def with_saved(live: dict[str, int], build_dir: Path, role: str) -> dict[str, int]:
    saved = saved_counts(build_dir).get(role, {})
    return {k: live.get(k, 0) + saved.get(k, 0) for k in live.keys() | saved.keys()}


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


def check_private_server(args, env: dict[str, str], work: Path, start_failed) -> dict:
    """Steps 1 and 2 on a server of our own: what is asked for, and does it work."""
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


def on_private_server(args, env: dict[str, str], work: Path, start_failed) -> dict:
    private = dict(env, SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="120")
    private.pop("SCCACHE_SERVER_UDS", None)
    try:
        return check_private_server(args, private, work, start_failed)
    finally:
        run([args.sccache, "--stop-server"], private)


# --- 3. the build's servers ---------------------------------------------------------------

def own_server(build_dir: Path, role: str) -> str:
    """An abstract unix socket for this user and build dir (no file, no port to collide)."""
    key = hashlib.sha256(f"{os.getuid()}:{build_dir.resolve()}".encode()).hexdigest()[:20]
    return f"\\x00vfa-sccache-{role}-{key}"


def server_view(sccache: str, env: dict[str, str]) -> tuple[str, str | None]:
    return show_stats(sccache, env).get("cache_location", ""), dist_status(sccache, env)["scheduler"]


def launcher_settings(settings_path: Path) -> dict:
    return json.loads(settings_path.read_text())


def probe(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    build_dir = Path(args.build_dir or args.work)
    env = dict(os.environ)
    result: dict = {"ok": False, "failure": None, "message": "", "note": "", "restarted": None,
                    "conf_problem": ""}
    for stale in (FALLBACKS, DIST_OFF, SETTINGS, LOCAL_CONF, COUNTS, DIST_CONF, DIST_LOG):
        (build_dir / stale).unlink(missing_ok=True)

    # 0. The config file: there, and with a scheduler that answers?
    conf_path, named = sccache_conf_path(env)
    conf = read_conf(conf_path) if conf_path.is_file() else None
    if named and not conf_path.is_file():
        result["conf_problem"] = (f"SCCACHE_CONF names {conf_path}, which is not a file: sccache ignores it without a "
                                  "word, so no [dist] scheduler and no [cache] settings of it apply to this build. "
                                  "Point SCCACHE_CONF at the file (dist-compile/cluster.py client writes one) or "
                                  "unset it")
    scheduler_url = ((conf or {}).get("dist") or {}).get("scheduler_url")
    local_conf = None
    if scheduler_url:
        text = without_dist(conf_path)
        if text is not None:
            local_conf = build_dir / LOCAL_CONF
            local_conf.touch(mode=0o600)  # it may hold cache credentials, as the original does
            local_conf.chmod(0o600)
            local_conf.write_text(text)
    dist_mode = "on" if scheduler_url else "none"
    public_url = without_secrets(scheduler_url or "")
    probe_env = env
    dist_failure: ProbeFailure | None = None
    credentials = scheduler_credentials(scheduler_url, public_url, conf_path) if scheduler_url else None
    if credentials is not None and local_conf is not None:
        # Never sent, never logged: the cluster is left out of this build (as for a refused token).
        dist_failure, scheduler_url = credentials, None
    hang = scheduler_hang(scheduler_url) if scheduler_url else None

    def start_failed(proc):
        return start_failure(proc, probe_env, conf, conf_path)

    try:
        if credentials is not None:
            if local_conf is None:
                raise credentials
            dist_mode = "off"
            probe_env = dict(env, SCCACHE_CONF=str(local_conf))
            found = on_private_server(args, probe_env, work, start_failed)
        elif hang:
            if local_conf is None:
                raise ProbeFailure("dist-hung", f"the sccache-dist scheduler {public_url} does not answer ({hang}), "
                                                "and every sccache server start waits for it. Restart the "
                                                f"scheduler, or remove [dist] from {conf_path}",
                                   "the sccache-dist scheduler did not answer")
            dist_mode = "off"
            probe_env = dict(env, SCCACHE_CONF=str(local_conf))
            found = on_private_server(args, probe_env, work, start_failed)
        else:
            try:
                found = on_private_server(args, probe_env, work, start_failed)
            except ProbeFailure as exc:
                if exc.failure not in DIST_FAILURES or dist_mode != "on" or local_conf is None:
                    raise
                # Does the cache work without [dist]? Then the cluster alone is what failed.
                probe_env = dict(env, SCCACHE_CONF=str(local_conf))
                try:
                    found = on_private_server(args, probe_env, work, start_failed)
                except ProbeFailure:
                    raise exc from None
                dist_mode = "off"
                dist_failure = exc
    except ProbeFailure as exc:
        result.update(failure=exc.failure, message=exc.message, note=exc.note)
        return result
    if dist_failure is not None and dist_failure.failure != "start":
        # A refused token, servers that cannot run the toolchain: every remote compile would fail.
        found["dist"] = {"scheduler": public_url, "state": "refused", "detail": dist_failure.message,
                         "note": dist_failure.note, "probe": None}
    elif dist_mode == "off":
        if dist_failure is not None:  # the server started without [dist] only: the scheduler held it
            hang = f"an sccache server with it configured did not start ({dist_failure.message})"
        found["dist"] = {"scheduler": public_url, "state": "not-answering", "detail": hang, "probe": None}
    asked = (found["location"], found["dist"]["scheduler"] if dist_mode != "off" else None)
    result.update(ok=True, backend=backend_of(found["location"]), location=public_location(found["location"]),
                  rw_mode=found["rw_mode"], version=found["version"], checks=found["checks"], dist=found["dist"],
                  warning=found.get("warning", ""))

    # 3. The build's server: this build dir's own, or the one the environment names.
    explicit = bool(env.get("SCCACHE_SERVER_UDS") or env.get("SCCACHE_SERVER_PORT"))
    server = {} if explicit else {"SCCACHE_SERVER_UDS": own_server(build_dir, "build")}
    if dist_mode == "off":
        server["SCCACHE_CONF"] = str(local_conf)
    local = None
    if dist_mode == "on" and local_conf is not None:
        local = {"SCCACHE_SERVER_UDS": own_server(build_dir, "local"), "SCCACHE_CONF": str(local_conf)}
    if dist_mode == "on":
        server.update(cluster_server_settings(conf_path, build_dir))  # dist_trust.py: the shared cache read-only
    build_env = dict(env, **server)
    try:
        if local:
            run([args.sccache, "--stop-server"], dict(env, **local))
        if not explicit:
            # Ours alone: stopped, so that the first compile starts it with these settings and zero counts.
            run([args.sccache, "--stop-server"], build_env)
        elif dist_mode == "on":
            # Read-only for the cluster (dist_trust.py): sccache shows no cache mode, so it restarts.
            result["restarted"] = {"was": public_location(server_view(args.sccache, build_env)[0]),
                                   "why": "read-only cache while compiles go to the cluster"}
            run([args.sccache, "--stop-server"], build_env)
            started = run([args.sccache, "--start-server"], build_env)  # connected to the cluster from now on
            if started.returncode != 0:
                raise start_failed(started)
        else:
            running = server_view(args.sccache, build_env)
            if running != asked:
                result["restarted"] = {"was": public_location(running[0]), "was_scheduler": running[1]}
                run([args.sccache, "--stop-server"], build_env)
                running = server_view(args.sccache, build_env)
                if running != asked:
                    raise ProbeFailure("mismatch", f"the sccache server still uses {public_location(running[0])} "
                                                   f"after a restart, not {result['location']}")
            zero = run([args.sccache, "--zero-stats"], build_env)
            if zero.returncode != 0:
                raise start_failed(zero)
    except ProbeFailure as exc:
        result.update(ok=False, failure=exc.failure, message=exc.message, note=exc.note)
        return result
    # With a scheduler, compiles leave this machine: sccache runs through compile_env.py, which
    # hands it only what a compile needs (the server it starts keeps the full environment).
    client = ([sys.executable, "-E", "-s", "-S", str(COMPILE_ENV_SCRIPT), args.sccache] if dist_mode == "on"
              else [args.sccache])
    settings = {"sccache": args.sccache, "client": client, "build_dir": str(build_dir), "dist": dist_mode,
                "scheduler": public_url,
                "server": server, "own_server": not explicit, "local": local,
                "max_cluster_failures": MAX_CLUSTER_FAILURES}
    (build_dir / SETTINGS).write_text(json.dumps(settings, indent=1) + "\n")
    return result


def cluster_server_settings(conf_path: Path, build_dir: Path) -> dict[str, str]:
    """What the build's sccache server gets when its compiles go to a cluster: every cache
    backend read-only (dist_trust.py: a build server's object must not reach the shared
    cache), through the environment and, for a cache configured in SCCACHE_CONF, a 0600 copy
    of that file with rw_mode = "READ_ONLY" in its [cache.*] tables."""
    settings = read_only_server_env()
    # Its warnings in a 0600 file of the build dir: sccache's silent fallbacks, which the
    # launcher counts (dist_bound.py); sccache appends to it and keeps its mode.
    log = build_dir / DIST_LOG
    log.touch(mode=0o600)
    log.chmod(0o600)
    settings["SCCACHE_ERROR_LOG"] = str(log)
    level = os.environ.get("SCCACHE_LOG", "")
    settings["SCCACHE_LOG"] = level if level.split(",")[0].lower() in ("warn", "info", "debug", "trace") else "warn"
    copy = read_only_conf(conf_path) if conf_path.is_file() else None
    if copy is not None:
        path = build_dir / DIST_CONF
        path.touch(mode=0o600)  # it may hold cache credentials, as the original does
        path.chmod(0o600)
        path.write_text(copy)
        settings["SCCACHE_CONF"] = str(path)
    return settings


# --- the end of the build ----------------------------------------------------------------

def fallback_lines(build_dir: Path) -> list[list[str]]:
    try:
        return [line.split("\t") for line in (build_dir / FALLBACKS).read_text().splitlines() if line]
    except OSError:
        return []


def build_report(sccache: str, settings: dict) -> dict:
    """What this build's servers and launcher did: remote compiles, fallbacks, failures."""
    build_dir = Path(settings["build_dir"])
    env = dict(os.environ, **settings["server"])
    main = with_saved(unit_counts(show_stats(sccache, env)), build_dir, "server")
    local = (with_saved(unit_counts(show_stats(sccache, dict(os.environ, **settings["local"]))), build_dir, "local")
             if settings["local"] else None)
    lines = fallback_lines(build_dir)
    fallbacks = [line for line in lines if line[2:3] != ["source-error"]]  # sccache_launcher.SOURCE_ERROR
    # sccache counts a job that ran on a build server and failed there among its dist_compiles.
    failed_remote = sum(1 for line in lines if line[2:3] in (["job-failed"], ["source-error"]))
    return {"dist": settings["dist"], "scheduler": settings["scheduler"],
            "remote_compiles": max(main["remote"] - failed_remote, 0), "remote_jobs_failed": failed_remote,
            "compiles_here": max(main["compilations"] - main["remote"], 0) + (local or {}).get("compilations", 0),
            "sccache_fallbacks": main["dist_errors"], "launcher_fallbacks": len(fallbacks),
            "compile_requests": main["requests"] + (local or {}).get("requests", 0),
            "cluster_turned_off": (build_dir / DIST_OFF).exists(),
            "fallback_units": [line[1] for line in fallbacks if len(line) > 1]}


def record_build(settings: dict, report: dict) -> None:
    """Into the build dir's build_info.json (compiler_cache.dist): `build`, the counts, and
    `used`, whether any compile of the build ran on a build server. The wheel's record holds
    no compiler_cache block (BuildInfo.cmake: this machine's readings)."""
    if not report["compile_requests"]:
        return  # nothing was compiled: what an earlier build recorded still holds
    info_path = Path(settings["build_dir"]) / "build_info.json"
    try:
        info = json.loads(info_path.read_text())
        info["compiler_cache"]["dist"]["used"] = report["remote_compiles"] > 0
        info["compiler_cache"]["dist"]["build"] = report
    except (OSError, ValueError, KeyError, TypeError):
        return
    tmp = info_path.with_name(info_path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, info_path)


def stop_servers(sccache: str, settings: dict, build_server: bool) -> None:
    for overrides in ([settings["server"]] if build_server and settings["server"] else []) + \
            ([settings["local"]] if settings["local"] else []):
        run([sccache, "--stop-server"], dict(os.environ, **overrides))


def hits_line(counts: dict[str, int]) -> str:
    """How many of the build's units the compiler cache answered (unit_counts: a CUDA unit is
    one "CUDA" compile, its device-code, PTX and CUBIN steps are counted apart)."""
    parts, hits, total = [], 0, 0
    for language, name in UNIT_LANGUAGES.items():
        h = counts.get(f"hits:{language}", 0)
        n = h + counts.get(f"misses:{language}", 0)
        if n:
            parts.append(f"{name} {h}/{n}")
            hits, total = hits + h, total + n
    if not total:
        return "no unit compiled"
    return f"{hits} of {total} units from the cache ({', '.join(parts)})"


def log_stats(settings: dict | None, text: str) -> str | None:
    """sccache's statistics table into the build's compile log (cmake/compile_unit.py's), which
    it returns; None without a build dir or when the log cannot be written."""
    if settings is None:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compile_unit import COMPILE_LOG, append_log  # the log every unit's output goes to
    log = str(Path(settings["build_dir"]) / COMPILE_LOG)
    return log if append_log(log, f"==> sccache --show-stats (the build's compiler cache)\n{text}") else None


def stats(args) -> int:
    settings = launcher_settings(Path(args.settings)) if args.settings else None
    if settings is not None:
        # A server this asks for is started like the compiles' (no idle timeout) and stopped
        # when the build ends, as theirs are (cmake/sccache_launcher.py).
        from sccache_launcher import claim_servers, server_env
        from compile_unit import this_build
        build = this_build()
        claim_servers(settings, args.settings, build)
        env = server_env(settings, settings["server"], build)
    else:
        env = dict(os.environ)
    text = run([args.sccache, "--show-stats"], env)
    log = log_stats(settings, text.stdout)
    if log is None:
        print(text.stdout, end="")
    else:
        try:
            summary = hits_line(with_saved(unit_counts(show_stats(args.sccache, env)), Path(settings["build_dir"]),
                                           "server"))
        except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
            summary = f"statistics unreadable ({exc})"
        print(f"vendored-flash-attn: compiler cache: {summary}; sccache's statistics are in {log}")
    if settings is not None:
        try:
            report = build_report(args.sccache, settings)
        except (ProbeFailure, json.JSONDecodeError, KeyError) as exc:
            print(f"distributed compiles: unknown ({exc})")
            return 0
        record_build(settings, report)
        if settings["dist"] != "none":
            fell_back = report["sccache_fallbacks"] + report["launcher_fallbacks"]
            print(f"distributed compiles (scheduler {settings['scheduler']}, {settings['dist']}): "
                  f"{report['remote_compiles']} ran on build servers, {report['compiles_here']} here ({fell_back} of "
                  f"them after a failed remote attempt)")
            if settings["dist"] == "on" and report["compiles_here"] and not report["remote_compiles"]:
                print(f"vendored-flash-attn: none of this build's {report['compiles_here']} compiles ran on the "
                      f"sccache-dist cluster {settings['scheduler']} (its scheduler or servers did not take them; "
                      "`sccache --dist-status` with this SCCACHE_CONF and the cluster's logs say why)")
            if report["cluster_turned_off"]:
                print(f"the cluster failed {report['launcher_fallbacks']} compiles of this build, which then ran "
                      f"here: {Path(settings['build_dir']) / FALLBACKS} lists them")
        # The next build tries the cluster again and counts from zero (a server named by
        # SCCACHE_SERVER_PORT/UDS keeps its counts: zeroed at configure, read by whoever set it).
        stop_servers(args.sccache, settings, build_server=False)
        if settings.get("own_server"):
            run([args.sccache, "--zero-stats"], env)
        for name in (FALLBACKS, DIST_OFF, COUNTS):
            (Path(settings["build_dir"]) / name).unlink(missing_ok=True)
        return 0
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


def stop(args) -> int:
    settings = launcher_settings(Path(args.settings))
    stop_servers(settings["sccache"], settings, build_server=True)
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
    p.add_argument("--build-dir", help="where the launcher's settings go (vfa-sccache.json; default: --work)")
    p.add_argument("--out", required=True)
    s = sub.add_parser("stats")
    s.add_argument("--sccache", required=True)
    s.add_argument("--settings", help="the build's vfa-sccache.json: its own servers and fallbacks")
    t = sub.add_parser("stop")
    t.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    if args.command == "stats":
        return stats(args)
    if args.command == "stop":
        return stop(args)
    result = probe(args)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def scrubbed_crash(text: str, environ: dict[str, str]) -> str:
    """A crash's text (CMake prints it) without the credentials of any URL in the
    environment (SCCACHE_REDIS_ENDPOINT, a scheduler URL ...): an exception message may
    quote one, and the probe's own scrubbing of its answers did not run."""
    return without_secrets(text, [value for value in environ.values() if "://" in value or "@" in value])


def main_scrubbed(argv: list[str] | None = None) -> int:
    """main, failing closed: a crash's text goes out scrubbed (scrubbed_crash), status 1."""
    try:
        return main(argv)
    except Exception:  # noqa: BLE001
        import traceback

        sys.stderr.write(scrubbed_crash(traceback.format_exc(), dict(os.environ)))
        return 1


if __name__ == "__main__":
    sys.exit(main_scrubbed())
