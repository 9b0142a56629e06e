"""The build's own sccache servers live as long as the build; one that stops is replaced.

They live as long as the build (claim_servers, keep_servers): sccache stops
a server SCCACHE_IDLE_TIMEOUT seconds (600 by default) after the last *new* compile request,
whatever it is still compiling, and its clients then compile again from scratch, uncached.
So a server of this build dir's own is started with no idle timeout, and a keeper process
stops it once the build tool (ninja) has ended -- done, failed or interrupted. A server that
stops anyway (killed, or one named by SCCACHE_SERVER_PORT/UDS with an idle timeout of its
own) is noticed when sccache reports it; the launcher says so in one line (through the
progress monitor at once), and compiles the unit again through a new server, so that its
result reaches the cache (compile_through_server).

Used by cmake/vfa_build/compiler_cache/sccache_launcher.py (each compile), whose ``--keep`` runs the keeper
(keep_servers), and by whatever reads a build's server (build_monitor.py, the end-of-build
report): they reach it as the compiles do (claim_servers, server_env).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# What marks the processes of one compile, the unit's name, and how a line reaches the console at once.
from vfa_build.units.compile_unit import COMPILE_ID, marked_processes, output_of, say_now

# The keeper runs as the launcher's `--keep`, through the build package's entry point (compile_unit.py
# knows the launcher's processes by its name).
ENTRY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = "compiler_cache.sccache_launcher"

OWNER = "vfa-sccache-owner"  # the build (this_build()) whose keeper stops the build's servers
STARTED = "vfa-sccache-started.json"  # servers named by SCCACHE_SERVER_PORT/UDS this build restarted
SERVERS_LOCK = "vfa-sccache.lock"
RESTARTS = "vfa-sccache-restarts.tsv"  # one line per server death this build said
# What sccache 0.16's client says when its server went away during a compile: after a shutdown
# (an idle timeout, --stop-server) it then compiles the unit itself, uncached; after a crash the
# compile fails.
SERVER_GONE = re.compile(r"The server looks like it shut down unexpectedly|"
                         r"Failed to send data to or receive data from server")
MAX_SERVER_RESTARTS = 3  # per unit; after that the unit compiles as sccache's client decides
KEEPER_POLL_S = 0.5


def own_servers(settings: dict) -> list[dict]:
    """The settings (environment overrides) of each server that is this build dir's alone:
    its main one unless SCCACHE_SERVER_PORT/UDS named one, and the no-[dist] one."""
    return ([settings["server"]] if settings.get("own_server") else []) + \
        ([settings["local"]] if settings.get("local") else [])


def server_env(settings: dict, overrides: dict, build: str | None) -> dict[str, str]:
    """The environment of a client of one of the build's servers. A server the client starts
    gets no idle timeout when a keeper will stop it (a build tool runs this launch): this build
    dir's own, or one named by SCCACHE_SERVER_PORT/UDS that this build has had to restart
    (STARTED; otherwise such a server keeps the user's settings). So a client that starts while
    a restart is under way cannot start a server that times out again."""
    env = dict(os.environ, **overrides)
    if build is not None and (overrides in own_servers(settings) or overrides in started_servers(settings)):
        env["SCCACHE_IDLE_TIMEOUT"] = "0"
    return env


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def build_running(build: str) -> bool:
    """Whether the build tool named by this_build() ("PID:START") still runs."""
    pid, _, start = build.partition(":")
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
        return text[text.rindex(")") + 2:].split()[19] == start
    except (OSError, ValueError, IndexError):
        return False


def started_servers(settings: dict) -> list[dict]:
    try:
        return json.loads(read_text(os.path.join(settings["build_dir"], STARTED)) or "[]")
    except ValueError:
        return []


def stop_servers(settings: dict) -> None:
    """Stops the build dir's own servers and those the build restarted, their counts kept for
    the end-of-build report (sccache_stats.py's COUNTS); quietly: `--stop-server`
    prints the statistics."""
    from vfa_build.compiler_cache import sccache_stats  # not at the top: this module runs once per unit and stays small
    for overrides in own_servers(settings) + started_servers(settings):
        role = "local" if overrides == settings.get("local") else "server"
        try:
            sccache_stats.save_counts(settings["sccache"], dict(os.environ, **overrides),
                                      Path(settings["build_dir"]), role)
        except OSError:
            pass  # the build dir is gone: its counts have nowhere to go, the server is stopped all the same
        try:
            subprocess.run([settings["sccache"], "--stop-server"], env=dict(os.environ, **overrides),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass


class ServersLock:
    """flock on BUILD_DIR/vfa-sccache.lock: one launcher at a time claims or restarts a server."""

    def __init__(self, settings: dict):
        self.path = os.path.join(settings["build_dir"], SERVERS_LOCK)

    def __enter__(self):
        self.file = open(self.path, "a", encoding="utf-8")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.file.close()


def claim_servers(settings: dict, settings_path: str, build: str | None, restarted: bool = False) -> None:
    """The first launch of a build makes the build dir's own servers this build's: a server
    left by an earlier build (which may have another idle timeout) is stopped, so that this
    build's first compile starts one with none, and a keeper process is started that stops
    them when the build tool ends. Later launches of the same build only read the owner file.
    `restarted`: the build has started a server in place of one that stopped (server_gone),
    which its keeper stops too."""
    owner = os.path.join(settings["build_dir"], OWNER)
    if build is None or not (own_servers(settings) or restarted) or read_text(owner) == build:
        return
    try:
        with ServersLock(settings):
            if read_text(owner) == build:
                return
            if not restarted:
                stop_servers(settings)
                try:
                    os.unlink(os.path.join(settings["build_dir"], STARTED))
                except OSError:
                    pass
            with open(owner + ".tmp", "w", encoding="utf-8") as f:
                f.write(build)
            os.replace(owner + ".tmp", owner)
            # Detached (a session of its own, no inherited output: pip waits for its pipes to
            # close), without the compile's mark (an interrupt stops what carries it).
            env = {k: v for k, v in os.environ.items() if k != COMPILE_ID}
            subprocess.Popen([sys.executable, "-E", "-s", "-S", ENTRY, LAUNCHER, "--keep",
                              os.path.abspath(settings_path), build], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                             close_fds=True)
    except OSError:
        pass  # no keeper: the servers run until sccache's own idle timeout stops them


def keep_servers(settings_path: str, build: str) -> int:
    """The keeper: waits for the build tool to end, then stops the build's own servers unless a
    later build has claimed them."""
    try:
        with open(settings_path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return 1
    owner = os.path.join(settings["build_dir"], OWNER)
    # Out of the build dir it was started in: sccache's client (--stop-server) cannot run in a
    # removed working directory.
    os.chdir("/")
    while build_running(build):
        time.sleep(KEEPER_POLL_S)
    try:
        with ServersLock(settings):
            if read_text(owner) == build:
                stop_servers(settings)
                for name in (OWNER, STARTED):
                    try:
                        os.unlink(os.path.join(settings["build_dir"], name))
                    except OSError:
                        pass
    except FileNotFoundError:
        # The build dir was removed as the build ended (`rm -rf build`, a test's tmp_path): no later
        # build can claim its servers, and nothing else stops them (they have no idle timeout).
        stop_servers(settings)
    return 0


def run_watching(command: list[str], env: dict[str, str], stop_on_gone: bool) -> tuple[int, bool, bool]:
    """Runs a client of a compile server, its stdout passed on and its stderr passed on line by
    line; returns (exit status, whether its server went away, whether a signal came). When the
    server goes away and `stop_on_gone`, the client (and the compile it starts in its place)
    is stopped at once and its message not passed on."""
    received: list[int] = []
    state: dict = {"proc": None}

    def forward(signum, _frame):
        received.append(signum)
        proc = state["proc"]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    gone = False
    try:
        try:
            proc = state["proc"] = subprocess.Popen(command, env=env, stderr=subprocess.PIPE,
                                                    start_new_session=True)
        except OSError as error:
            sys.stderr.write(f"{command[0]}: {error}\n")
            return 127, False, bool(received)
        if received and proc.poll() is None:
            proc.send_signal(received[0])
        for line in proc.stderr:
            if SERVER_GONE.search(line.decode("utf-8", "replace")) and not received:
                gone = True
                if stop_on_gone:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    continue
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
        proc.wait()
        rc = proc.returncode
        return (rc if rc >= 0 else 128 - rc), gone, bool(received)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_leftovers(mark: bytes) -> None:
    """Stops what a server that went away left of this compile (its compiler runs on, orphaned)."""
    me = os.getpid()
    for pid in marked_processes(mark):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def server_gone(settings: dict, overrides: dict, unit: str, since: float, settings_path: str,
                build: str | None) -> None:
    """Starts a server in place of one that went away, with no idle timeout (the build's keeper
    stops it), and says so in one line per death: the first launcher whose unit it held says
    it; the others, whose compiles started before that line, stay quiet."""
    path = os.path.join(settings["build_dir"], RESTARTS)
    report = True
    try:
        with ServersLock(settings):
            said = read_text(path).splitlines()
            report = not (said and float(said[-1].split("\t")[0]) >= since)
            if report:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(f"{time.time():.3f}\t{unit}\n")
            # Recorded before it starts: from here on every client of this server asks for no
            # idle timeout (server_env), and the keeper stops whichever server takes the address.
            if build is not None and overrides not in own_servers(settings):
                started = started_servers(settings)
                if overrides not in started:
                    with open(os.path.join(settings["build_dir"], STARTED), "w", encoding="utf-8") as f:
                        json.dump(started + [overrides], f)
            subprocess.run([settings["sccache"], "--start-server"],
                           env={**os.environ, **overrides, "SCCACHE_IDLE_TIMEOUT": "0"},
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    if build is not None and overrides not in own_servers(settings):
        claim_servers(settings, settings_path, build, restarted=True)
    if report:
        say_now(settings["build_dir"],
                f"the build's sccache server stopped while it compiled {unit}; a new one takes its place, and "
                "the units it was compiling start again through it, so that their results reach the cache")


def compile_through_server(settings: dict, command: list[str], env: dict[str, str], overrides: dict,
                           settings_path: str, build: str | None) -> int:
    """The compile through sccache; when its server goes away, again through a new one."""
    mark_value = env.get(COMPILE_ID) or f"sccache-launcher-{os.getpid()}-{time.time_ns()}"
    env = dict(env, **{COMPILE_ID: mark_value})
    unit = output_of(command)
    rc = 1
    for attempt in range(MAX_SERVER_RESTARTS + 1):
        since = time.time()
        rc, gone, interrupted = run_watching(command, env, stop_on_gone=attempt < MAX_SERVER_RESTARTS)
        if not gone or interrupted or attempt == MAX_SERVER_RESTARTS:
            return rc
        stop_leftovers(f"{COMPILE_ID}={mark_value}".encode())
        server_gone(settings, overrides, unit, since, settings_path, build)
    return rc
