"""cmake/vfa_build/compiler_cache/compiler_cache_probe.py with the real sccache (a build requirement) and the host
C++ compiler, each probe on a private server and cache dir of its own: a cache that
works, one that reads but cannot write (the build goes on, with a warning, recorded as
read-only), one that cannot be made (refused, naming SCCACHE_DIR); and what of it may
reach the wheel's build info (no paths, no credentials). The same probe runs inside a
configure in tests/dist/test_shared_cache.py (Redis, a server left running, ...)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from support.cmake_runner import clean_env, free_port, tool

from vfa_build.compiler_cache import compiler_cache_probe

# The probe as CMake runs it, through the build package's entry point.
PROBE = [str(Path(__file__).resolve().parents[2] / "cmake" / "vfa_build"), "compiler_cache.compiler_cache_probe"]


def probe_command(tmp_path: Path) -> list[str]:
    (tmp_path / "build").mkdir(exist_ok=True)
    return [sys.executable, *PROBE, "probe", "--sccache", tool("sccache"), "--cxx", shutil.which("c++"),
            "--work", str(tmp_path / "work"), "--build-dir", str(tmp_path / "build"),
            "--out", str(tmp_path / "result.json")]


def probe(tmp_path: Path, sccache_dir: Path, **env_extra: str) -> dict:
    env = clean_env(SCCACHE_DIR=str(sccache_dir), SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="0",
                    **env_extra)
    try:
        proc = subprocess.run(probe_command(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    finally:  # the probe leaves this environment's own server running, as a build would use it
        subprocess.run([tool("sccache"), "--stop-server"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "result.json").read_text())


@contextmanager
def silent_listener():
    """A TCP port that accepts connections and never answers (a hung scheduler or Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        server.close()


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


def test_an_sccache_conf_that_names_no_file_is_reported_with_its_path(tmp_path):
    missing = tmp_path / "no-such-client.toml"
    result = probe(tmp_path, tmp_path / "cache", SCCACHE_CONF=str(missing))
    assert result["ok"] is True, result["message"]  # the environment's cache settings still work
    assert f"SCCACHE_CONF names {missing}, which is not a file" in result["conf_problem"]
    assert "unset it" in result["conf_problem"]


def client_conf(path: Path, scheduler_url: str) -> Path:
    path.write_text(f'[dist]\nscheduler_url = "{scheduler_url}"\ntoolchains = []\n'
                    f'cache_dir = "{path.parent / "toolchains"}"\n\n[dist.auth]\ntype = "token"\ntoken = "t"\n')
    return path


def test_a_scheduler_that_never_answers_is_named_and_the_cache_works_without_it(tmp_path):
    with silent_listener() as port:
        conf = client_conf(tmp_path / "client.toml", f"http://127.0.0.1:{port}")
        started = time.monotonic()
        result = probe(tmp_path, tmp_path / "cache", SCCACHE_CONF=str(conf))
        took = time.monotonic() - started
    assert result["ok"] is True, result["message"]
    assert result["rw_mode"] == "read-write" and "second compile was a cache hit" in result["checks"]
    dist = result["dist"]
    assert dist["state"] == "not-answering" and dist["scheduler"] == f"http://127.0.0.1:{port}"
    assert "accepts connections but sent no answer within 5 s" in dist["detail"]
    assert took < 120, f"the probe took {took:.1f} s"  # a hang's bound: the message above says it stopped at 5 s
    settings = json.loads((tmp_path / "build" / "vfa-sccache.json").read_text())
    assert settings["dist"] == "off"
    local = Path(settings["server"]["SCCACHE_CONF"])
    assert "[dist" not in local.read_text() and local.stat().st_mode & 0o077 == 0


def test_a_cache_backend_that_never_answers_is_named_with_its_setting(tmp_path):
    with silent_listener() as port:
        result = probe(tmp_path, tmp_path / "cache", SCCACHE_REDIS_ENDPOINT=f"redis://127.0.0.1:{port}")
    assert result["ok"] is False and result["failure"] == "start"
    assert f"its cache backend (SCCACHE_REDIS_ENDPOINT=redis://127.0.0.1:{port})" in result["message"]
    assert "unset SCCACHE_REDIS_ENDPOINT to cache on the local disk" in result["message"]
    assert "sccache-dist" not in result["message"]


def test_the_probe_leaves_the_default_port_server_alone(tmp_path):
    """A concurrent build's server on the default port (4226), with other settings and
    statistics: it keeps running with both. In a network namespace of its own, so that the
    machine's real default-port server is not involved."""
    script = tmp_path / "default_server.py"
    script.write_text(f"""
import json, subprocess, sys
sccache = {tool("sccache")!r}
other = dict({dict(clean_env(SCCACHE_DIR=str(tmp_path / "other-cache"), SCCACHE_IDLE_TIMEOUT="0"))!r})
def stats():
    out = subprocess.run([sccache, "--show-stats", "--stats-format=json"], env=other, capture_output=True, text=True)
    return json.loads(out.stdout)
src = {str(tmp_path / "concurrent.cpp")!r}
open(src, "w").write("int concurrent() {{ return 1; }}\\n")
assert subprocess.run([sccache, "c++", "-c", src, "-o", src + ".o"], env=other).returncode == 0
before = stats()
mine = dict(other, SCCACHE_DIR={str(tmp_path / "cache")!r})
probe = subprocess.run({probe_command(tmp_path)!r}, env=mine, capture_output=True, text=True)
after = stats()
subprocess.run([sccache, "--stop-server"], env=other, capture_output=True)
subprocess.run([sys.executable, *{PROBE!r}, "stop", "--settings", {str(tmp_path / "build" / "vfa-sccache.json")!r}],
               env=mine, capture_output=True)
print(json.dumps({{"before": before, "after": after, "probe": probe.returncode}}))
""")
    proc = subprocess.run(["unshare", "--net", "sh", "-c", f"ip link set lo up && {sys.executable} {script}"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["probe"] == 0 and json.loads((tmp_path / "result.json").read_text())["ok"] is True
    before, after = seen["before"], seen["after"]
    assert before["stats"]["compile_requests"] == 1
    assert after["stats"] == before["stats"]  # neither zeroed nor restarted (a restart zeroes too)
    assert after["cache_location"] == before["cache_location"] and "other-cache" in after["cache_location"]


def test_a_refused_token_at_configure_names_rotation_and_the_fix():
    """Issue 34: a 401 at configure is said with its likely cause, the cluster's secrets rotated,
    and how to take the new token (the launcher says the same mid-build: fix_for("refused"))."""
    from vfa_build.compiler_cache.sccache_private_server import classify_compile_failure
    refused = subprocess.CompletedProcess([], 254, "", "http error status: Error 401: Fixed token mismatch\n")
    failure = classify_compile_failure(refused, {"SCCACHE_CONF": "/etc/ci/client.toml"}, "C++")
    assert failure.failure == "dist-auth" and "Error 401" in failure.message
    assert "must equal the scheduler's client_auth token" in failure.message
    assert "the cluster's secrets were most likely rotated" in failure.message
    assert "cluster.py client --scheduler-url - --out /etc/ci/client.toml" in failure.message


# Stands in for sccache where the probe needs a cluster (no scheduler runs here): a "server" per
# SCCACHE_SERVER_PORT/UDS, its settings fixed when it starts, as sccache's are (a [dist] scheduler
# in its SCCACHE_CONF; its cache read-only by SCCACHE_LOCAL_RW_MODE or rw_mode in that file). A
# compile on a server with a scheduler counts as one a build server made; each compile is logged
# with its server's settings, and a cache of its own stores what a read-write server compiled.
FAKE_SCCACHE = r'''#!PYTHON
import hashlib, json, os, subprocess, sys
STATE = "STATE"
path = os.path.join(STATE, "servers.json")
servers = json.load(open(path)) if os.path.exists(path) else {}
cache = set(json.load(open(os.path.join(STATE, "cache.json")))) if os.path.exists(os.path.join(STATE, "cache.json")) else set()
key = os.environ.get("SCCACHE_SERVER_UDS") or os.environ.get("SCCACHE_SERVER_PORT") or "4226"
args = sys.argv[1:]
ZERO = {"hits": 0, "writes": 0, "remote": 0, "compilations": 0, "requests": 0}

def start():
    conf = os.environ.get("SCCACHE_CONF", "")
    text = open(conf).read() if conf and os.path.isfile(conf) else ""
    read_only = os.environ.get("SCCACHE_LOCAL_RW_MODE") == "READ_ONLY" or 'rw_mode = "READ_ONLY"' in text
    servers[key] = {"dist": "scheduler_url" in text, "read_only": read_only, **ZERO}

def save():
    json.dump(servers, open(path, "w"))
    json.dump(sorted(cache), open(os.path.join(STATE, "cache.json"), "w"))

if args[0] == "--stop-server":
    servers.pop(key, None); save(); sys.exit(0)
if key not in servers:
    start()
s = servers[key]
if args[0] == "--start-server":
    start()
elif args[0] == "--zero-stats":
    s.update(ZERO)
elif args[0] == "--dist-status":
    print(json.dumps({"SchedulerStatus": ["http://sched.example:10600/", {"num_servers": 1, "num_cpus": 4,
                      "in_progress": 0}]} if s["dist"] else "Disabled"))
elif args[0] == "--show-stats":
    print(json.dumps({"cache_location": 'Local disk: "/fake"', "version": "0.0.0-fake", "stats": {
        "cache_hits": {"counts": {"C/C++": s["hits"]}}, "cache_misses": {"counts": {}}, "cache_errors": {"counts": {}},
        "cache_read_errors": 0, "cache_writes": s["writes"], "cache_write_errors": 0,
        "dist_compiles": {"127.0.0.1:10501": s["remote"]}, "dist_errors": 0, "compilations": s["compilations"],
        "compile_requests": s["requests"]}}))
else:
    s["requests"] += 1
    source = args[args.index("-c") + 1]
    digest = hashlib.sha256(open(source, "rb").read()).hexdigest()
    rc = subprocess.run(args).returncode
    if digest in cache:
        s["hits"] += 1
    else:
        s["compilations"] += 1
        s["remote"] += s["dist"]
        with open(os.path.join(STATE, "compiles.log"), "a") as log:
            log.write(json.dumps({"cluster": s["dist"], "read_only": s["read_only"]}) + "\n")
        if not s["read_only"] and rc == 0:
            cache.add(digest); s["writes"] += 1
    save(); sys.exit(rc)
save()
'''


def test_the_probe_never_stores_an_object_a_build_server_made(tmp_path):
    """Issue 34: the configure's probe compiled on the cluster through a server with the environment's
    cache settings, so with a read-write cache the cluster's probe object entered it. Now the cache
    is checked on a server without [dist] (read-write, as asked), the cluster on one whose cache is
    read-only, and the probe reports both truly. A stand-in sccache records every compile's server."""
    state = tmp_path / "state"
    state.mkdir()
    fake = tmp_path / "sccache"
    fake.write_text(FAKE_SCCACHE.replace("#!PYTHON", f"#!{sys.executable}").replace('"STATE"', repr(str(state))))
    fake.chmod(0o755)
    with socket.socket() as closed:  # a scheduler address nothing listens at: not hung (the stand-in answers)
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    conf = client_conf(tmp_path / "client.toml", f"http://127.0.0.1:{port}")
    (tmp_path / "build").mkdir()
    command = probe_command(tmp_path)
    command[command.index("--sccache") + 1] = str(fake)
    proc = subprocess.run(command, env=clean_env(SCCACHE_CONF=str(conf), SCCACHE_DIR=str(tmp_path / "cache")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] is True, result
    compiles = [json.loads(line) for line in (state / "compiles.log").read_text().splitlines()]
    assert {"cluster": True, "read_only": True} in compiles  # the cluster was probed ...
    assert {"cluster": True, "read_only": False} not in compiles, compiles  # ... never into a writable cache
    assert "C++ compile on a build server" in result["checks"] and result["dist"]["state"] == "connected"
    assert "second compile was a cache hit" in result["checks"]  # the cache itself checked read-write
    assert result["rw_mode"] == "read-only" and any("(the cache itself was read-write)" in c for c in result["checks"])
