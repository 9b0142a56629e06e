"""sccache as this build's compiler launcher, and what happens when the sccache-dist
cluster fails a compile.

    sccache_launcher.py BUILD_DIR/vfa-sccache.json -- COMPILER ARGS...

wired in by cmake/CompilerCache.cmake (CMAKE_<LANG>_COMPILER_LAUNCHER; compile_unit.py, when
build progress is on, runs in front of it), run as `python -E -s -S`. The settings file is
written at configure by compiler_cache_probe.py: the sccache executable, the server the
build's compiles go to (this build dir's own unless SCCACHE_SERVER_PORT/UDS is set), and
whether a [dist] scheduler is used ("on": sccache runs through cmake/vfa_build/cluster/compile_env.py),
was found not answering or refusing at configure ("off": the server runs with SCCACHE_CONF
minus [dist]) or is not configured ("none").

sccache falls back to a local compile by itself when a build server dies or cannot be
reached, but not in two cases, where the compile fails and so would the build:

  * the scheduler or a server refuses a request (HTTP 4xx: a token changed after
    configure, a scheduler restarted with new secrets): "http error status: Error 401"
    -- nothing was compiled;
  * a compile that ran on a build server failed ("sccache: Job failed on server ..."):
    a broken sandbox or toolchain there -- or an error in the source.

Two more are the cluster's too (cmake/vfa_build/cluster/dist_bound.py): a unit the cluster did not finish within
its bound (from the unit's expected time: a hung scheduler held units for minutes, silently)
is stopped and compiled here; a unit sccache itself compiled here after giving up on a build
server (a hung server: about 30 s each, without a word) is counted.

With dist "on", this launcher retries such a unit here, through a second server of this
build dir that runs the same cache settings without [dist] (or, when no such copy of the
config could be made, the compiler itself, uncached). The retry tells the two apart: an
error in the source fails here too and is shown once, as the compiler printed it; a unit
that compiles here was a cluster failure and is counted (BUILD_DIR/vfa-dist-fallbacks.tsv).
The first one prints one line; after `max_cluster_failures` of them (3) the next units skip
the cluster (BUILD_DIR/vfa-dist-off) with one more line naming the fix, until a back-off has
passed: then one unit tries it again, and its answer turns it back on, its failure off for
twice as long (dist_off.py). The build's end (compiler_cache_probe.py stats) reports the
counts and clears both files.

The build's own servers live as long as the build, and one that stops during a compile is
replaced (cmake/vfa_build/compiler_cache/sccache_servers.py says how); `--keep` runs their keeper.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

# The unit's name (as in vfa-progress.tsv) and the build this launch belongs to.
from vfa_build.units.compile_unit import output_of, say_now, this_build
# Objects from the cluster: a sample compiled here again, each object's origin recorded.
from vfa_build.cluster.dist_trust import dist_counts, purges, record_origin, servers_of, take_object, verify_unit
from vfa_build.cluster.dist_output import abandon, drop, private_output, with_output  # (where the cluster writes)
from vfa_build.cluster.dist_bound import (BOUND_FIXES, bound_seconds, log_size, run_bounded,  # (the cluster's
                        STATUS_TIMEOUT_S, silent_fallback)                    # time per unit)
from vfa_build.compiler_cache.sccache_servers import claim_servers, compile_through_server, keep_servers, server_env
# What this launcher shows and records of sccache's words goes without URL passwords (the one scrubber).
from vfa_build.url_secrets import without_env_secrets

# The cluster off after max_cluster_failures, and tried again after a back-off (dist_off.py).
from vfa_build.cluster.dist_off import RETRY_MAX_S, route, turn_off, turn_on

# sccache_build_report.py's FALLBACKS (that module is not imported here: this one runs once per
# unit and stays small).
FALLBACKS = "vfa-dist-fallbacks.tsv"
# sccache's HttpClientError, a 4xx from the scheduler or a server: "http error status: Error 401:
# Fixed token mismatch" through nvcc's steps, "didn't get a successful HTTP status, got `Error
# 401: ...`" for a plain compile.
REFUSED = re.compile(r"(?:http error status: |didn't get a successful HTTP status, got `)(Error \d+[^`\n]*)")
JOB_FAILED = "sccache: Job failed on server"
# A unit whose remote job failed and which fails here too: an error in the source, not the
# cluster's. Recorded (sccache counts its remote job among the build servers' compiles, and the
# report takes the failed ones out) but not counted as a cluster failure.
SOURCE_ERROR = "source-error"


def exec_command(command: list[str], env: dict[str, str]) -> int:
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        print(f"{command[0]}: {error}", file=sys.stderr)
        return 127
    return 127  # not reached


def run_captured(command: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes, int | None]:
    """(exit status, stdout, stderr, signal received). A signal sent to this launcher alone
    reaches the compile too; one that came before the compile started is sent right after."""
    received: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum, _frame):
        received.append(signum)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as error:
            return 127, b"", f"{command[0]}: {error}\n".encode(), (received or [None])[0]
        if received and proc.poll() is None:
            proc.send_signal(received[0])
        out, err = proc.communicate()
        return proc.returncode, out, err, (received or [None])[0]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def scrubbed(data: bytes) -> bytes:
    if not data:
        return data
    return without_env_secrets(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def show(out: bytes, err: bytes) -> None:
    """A compile's output, as sccache and the compiler wrote it but for URL passwords."""
    sys.stdout.buffer.write(scrubbed(out))
    sys.stdout.flush()
    sys.stderr.buffer.write(scrubbed(err))
    sys.stderr.flush()


def cluster_failure(text: str) -> tuple[str, str] | None:
    """("refused" | "job-failed", a short reason) when the cluster may be what failed."""
    text = without_env_secrets(text)  # before the reason is cut: a cut could leave half a password
    refused = REFUSED.search(text)
    if refused:
        return "refused", " ".join(refused.group(1).split())[:200]
    if JOB_FAILED in text:
        tail = text[text.index(JOB_FAILED):].splitlines()
        return "job-failed", " ".join(" ".join(tail[:2]).split())[:200]
    return None


def fix_for(kind: str) -> str:
    if kind in BOUND_FIXES:  # dist_bound.py's kinds: the cluster did not answer in time
        return BOUND_FIXES[kind]
    if kind == "refused":
        from vfa_build.compiler_cache.sccache_config import refused_fix  # not at the top: this module runs once per unit
        # The probe passed with this token (dist "on"): a refusal now is most likely a rotation.
        return f"The cluster refused this client (a 401/403): {refused_fix('SCCACHE_CONF', accepted_before=True)}"
    return ("A build server could not run the compile (its sandbox or toolchain: see that server's log; "
            "`sccache --dist-status` with this SCCACHE_CONF lists the servers): fix or stop it "
            "(dist-compile/README.md)")


def record(settings: dict, unit: str, kind: str, reason: str) -> int:
    """Appends a line for the unit; returns its place among the build's cluster failures (not
    how many there are once it is read back: units failing side by side, both appended before
    either counted, each read 2, and no launcher said the first line; under load, issue 39)."""
    line = f"{time.time():.3f}\t{unit}\t{kind}\t{without_env_secrets(reason)}\n".encode("utf-8", "replace")
    path = os.path.join(settings["build_dir"], FALLBACKS)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # sccache's words: 0600, as its log
        try:
            os.write(fd, line)  # one write: lines of parallel units never interleave
        finally:
            os.close(fd)
        place = 0
        with open(path, "rb") as f:
            for entry in f:
                place += entry.split(b"\t")[2:3] != [SOURCE_ERROR.encode()]
                if entry == line:
                    break
        return place
    except OSError:
        return 1


def record_fallback(settings: dict, unit: str, kind: str, reason: str) -> None:
    """Counts one unit the cluster failed; prints the first line and, at the limit, the last."""
    build_dir = settings["build_dir"]
    reason = without_env_secrets(reason)
    count = record(settings, unit, kind, reason)
    limit = settings.get("max_cluster_failures", 3)
    if count == 1:
        # A refused token refuses every unit: its fix is said at once.
        fix = f" {fix_for(kind)}." if kind == "refused" else ""
        print(f"vendored-flash-attn: the sccache-dist cluster failed {unit} ({reason}); compiled here instead. "
              f"After {limit} such failures this build stops sending compiles to the cluster.{fix}", file=sys.stderr)
    if count >= limit:
        off = turn_off(build_dir, unit)  # dist_off.py: None when it is off already
        if off is None:
            return
        backoff, first = off
        if first:
            print(f"vendored-flash-attn: {count} compiles failed on the sccache-dist cluster {settings['scheduler']} "
                  f"(last: {reason}); the next units compile here, cached, without the cluster, and after "
                  f"{backoff:.0f} s one of them tries it again (after each failed try twice as long, up to "
                  f"{RETRY_MAX_S:.0f} s). {fix_for(kind)}.", file=sys.stderr)
        else:
            print(f"vendored-flash-attn: the sccache-dist cluster {settings['scheduler']} failed {unit} again "
                  f"({reason}); units compile here for the next {backoff:.0f} s, then one tries it again. "
                  f"{fix_for(kind)}.", file=sys.stderr)


def local_command(settings: dict, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The unit compiled here: through this build's no-[dist] server, or the compiler itself."""
    if settings.get("local"):
        return [settings["sccache"], *command], dict(os.environ, **settings["local"])
    return command, dict(os.environ)


def compile_here_instead(settings: dict, command: list[str], unit: str, build: str | None) -> int:
    """<unit> compiled here (the build's no-[dist] server, or the compiler itself), its output
    shown and its origin recorded; the exit status."""
    local, local_env = local_command(settings, command)
    if settings.get("local"):
        local_env = server_env(settings, settings["local"], build)
    rc, out, err, _ = run_captured(local, local_env)
    if rc == 0:
        record_origin(settings["build_dir"], unit, "here")
    show(out, err)
    return rc if rc >= 0 else 128 - rc


def launch(settings: dict, command: list[str], settings_path: str = "") -> int:
    build = this_build()
    claim_servers(settings, settings_path, build)
    env = server_env(settings, settings["server"], build)
    # With a scheduler: cmake/vfa_build/cluster/compile_env.py in front of sccache (what a compile shipped
    # to build servers may carry). The local server below has no [dist]: plain sccache.
    mode = settings["dist"]
    unit = output_of(command)
    bound, expected = bound_seconds(settings["build_dir"], unit) if mode == "on" else (0.0, 0.0)
    # dist_off.py: after max_cluster_failures the cluster is off until its back-off has passed; then
    # this unit may be the one that tries it again ("try"), while the others compile here for its bound.
    where = route(settings["build_dir"], unit, bound + STATUS_TIMEOUT_S) if mode == "on" else "cluster"
    if where == "here":
        local, local_env = local_command(settings, command)
        record_origin(settings["build_dir"], output_of(command), "here")  # dist_trust.py: compiled here
        if settings.get("local"):
            return compile_through_server(settings, local, server_env(settings, settings["local"], build),
                                          settings["local"], settings_path, build)
        return exec_command(local, local_env)
    if mode != "on":
        through_sccache = [*settings.get("client", [settings["sccache"]]), *command]
        return compile_through_server(settings, through_sccache, env, settings["server"], settings_path, build)

    # dist_bound.py: the cluster gets the unit's bound, and sccache's own silent fallbacks count.
    since = log_size(settings["build_dir"])
    # dist_output.py: the cluster writes into a private temporary, moved into place below only
    # while this unit still waits for it; an answer after the bound lands there, not on the object.
    private = private_output(unit)
    before = dist_counts(settings["sccache"], env)  # which build servers build it (dist_trust.servers_of)
    seen_purges = purges(settings["build_dir"])  # a failed check meanwhile discards this unit's object (take_object)

    def waiting(waited: float) -> tuple[str, str] | None:
        """Every minute a unit waits on the cluster: a line, and is the scheduler still answering?"""
        from vfa_build.compiler_cache.sccache_config import scheduler_hang  # not at the top: this module runs once per unit
        hang = scheduler_hang(settings["scheduler"], STATUS_TIMEOUT_S)
        hung = f"the scheduler does not answer ({hang})" if hang else None
        say_now(settings["build_dir"], f"{unit} has waited {waited:.0f} s on the sccache-dist cluster "
                                       f"{settings['scheduler']} (its bound: {bound:.0f} s)"
                                       + (f"; {hung}: compiling it here" if hung else ""))
        return ("no-scheduler", hung) if hung else None

    rc, out, err, interrupted, stopped = run_bounded(
        [*settings.get("client", [settings["sccache"]]), *with_output(command, private)], env, bound,
        lambda: silent_fallback(settings["build_dir"], unit, since), waiting)
    if stopped or interrupted:
        abandon(settings["build_dir"], unit, private)
    if stopped and stopped[0] == "timeout":
        failure = ("timeout", f"no answer within {bound:.0f} s; the unit takes about {expected:.0f} s")
    elif stopped:
        failure = stopped
    else:
        failure = None if rc == 0 or interrupted else cluster_failure((err + out).decode("utf-8", "replace"))
    if failure is None:
        if where == "try" and not interrupted and turn_on(settings["build_dir"], unit):
            say_now(settings["build_dir"], f"the sccache-dist cluster {settings['scheduler']} answered again "
                                           f"({unit}): compiles go to it again")
        show(out, err)
        if rc == 0 and not interrupted:
            fell_back = silent_fallback(settings["build_dir"], unit, since)
            if fell_back:
                record_fallback(settings, unit, "fell-back", fell_back)
            servers = servers_of(before, dist_counts(settings["sccache"], env))
            # dist_trust.py: VFA_DIST_VERIFY's sample; the object's origin recorded in the build dir.
            rc, checked = verify_unit(settings, unit, command, private, servers, build)
            if rc == 0 and take_object(settings["build_dir"], unit, private, seen_purges, servers,
                                       checked) == "purged":
                # Another unit's check failed while this one compiled: its objects were removed, and
                # this one, which came after, is not moved into place either.
                say_now(settings["build_dir"], f"discarded the sccache-dist cluster's object for {unit}: a failed "
                                               "check removed the cluster's objects of this build dir while it "
                                               "compiled; compiling it here")
                return compile_here_instead(settings, command, unit, build)
        if not (stopped or interrupted):
            drop(private)
        return rc if rc >= 0 else 128 - rc
    if not stopped:
        drop(private)
    kind, reason = failure
    local, local_env = local_command(settings, command)
    if settings.get("local"):
        local_env = server_env(settings, settings["local"], build)
    rc, out, err, _ = run_captured(local, local_env)
    if rc == 0:
        record_origin(settings["build_dir"], unit, "here")
    # A unit that fails here too had an error of its own (unless nothing was compiled there).
    if rc == 0 or kind in ("refused", "timeout", "fell-back", "no-scheduler"):
        record_fallback(settings, output_of(command), kind, reason)
    else:
        record(settings, output_of(command), SOURCE_ERROR, reason)
    show(out, err)
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--keep":
        return keep_servers(argv[1], argv[2])
    if len(argv) < 3 or argv[1] != "--":
        print("usage: sccache_launcher.py SETTINGS.json -- COMPILER ARGS...", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError) as error:
        print(f"sccache_launcher.py: cannot read {argv[0]} ({error}); reconfigure the build", file=sys.stderr)
        return 2
    return launch(settings, argv[2:], argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
