"""Does the compiler cache work, not only start? Called by cmake/CompilerCache.cmake.

    python cmake/vfa_build compiler_cache.compiler_cache_probe probe --sccache S --cxx CXX [--cuda NVCC] --work DIR --build-dir B --out RESULT.json
    python cmake/vfa_build compiler_cache.compiler_cache_probe stats --sccache S [--settings B/vfa-sccache.json]
    python cmake/vfa_build compiler_cache.compiler_cache_probe stop --settings B/vfa-sccache.json

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
   succeed and nothing failed to read. With a scheduler configured, the cache is checked
   on a server of SCCACHE_CONF minus [dist], and the cluster on a second private server
   whose caches are read-only, as the build's is (no object a build server made enters
   any cache): a C++ and a tiny CUDA file compiled there (each must run remotely or fall
   back to local; a build server that cannot run the toolchain fails it).
3. Which server will the build's compiles go to? Without an SCCACHE_SERVER_PORT or
   SCCACHE_SERVER_UDS in the environment, one of this build dir's own (an abstract
   unix socket named after the build dir): the default-port server, which another
   build on this machine may be using, is never stopped, restarted or zeroed. With
   one set, that server is the build's: it is restarted when it runs with other
   settings (a server keeps the configuration it started with) and its statistics are
   zeroed. What the build's launcher needs (cmake/vfa_build/compiler_cache/sccache_launcher.py) goes into
   B/vfa-sccache.json.

Step 0 is cmake/vfa_build/compiler_cache/sccache_config.py, steps 1 and 2 cmake/vfa_build/compiler_cache/sccache_private_server.py, step 3
here; what an sccache server says is read through cmake/vfa_build/compiler_cache/sccache_stats.py.

The answer is one JSON object (`--out`): `ok`, `failure` (a class name) and `message`
when not ok, and what was found: `backend`, `location`, `rw_mode`, `checks`,
`restarted`, `dist`, `conf_problem`. Secrets (URL credentials) never get into it.

`stats` (the end of the build; cmake/vfa_build/compiler_cache/sccache_build_report.py) writes sccache's statistics
(the text that `sccache --show-stats` prints) into the build's compile log, and prints one
line saying how many units the cache answered and, with a scheduler, one saying how many compiles ran on
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
import json
import os
import sys
from pathlib import Path

from vfa_build.url_secrets import without_env_secrets, without_secrets  # the project's one URL scrubber (cmake/vfa_build/url_secrets.py)

from vfa_build.cluster.dist_trust import read_only_conf, read_only_server_env  # (cmake/vfa_build/cluster/dist_trust.py)
from vfa_build.cluster.dist_bound import DIST_LOG  # (cmake/vfa_build/cluster/dist_bound.py: the cluster server's log the launcher reads)
from vfa_build.compiler_cache.sccache_build_report import DIST_OFF, FALLBACKS, stats, stop  # (the end of the build)
from vfa_build.compiler_cache.sccache_config import (read_conf, sccache_conf_path, scheduler_credentials, scheduler_hang,
                            start_failure, without_dist)  # step 0
from vfa_build.compiler_cache.sccache_private_server import on_private_server  # (steps 1 and 2)
from vfa_build.compiler_cache.sccache_stats import (COUNTS, ProbeFailure, backend_of, dist_status, public_location, run,
                           show_stats)

# The build package's entry point, and the module it runs in front of sccache with a scheduler.
ENTRY = str(Path(__file__).resolve().parents[1])
COMPILE_ENV_MODULE = "cluster.compile_env"

# Written into the build dir by `probe`, read by cmake/vfa_build/compiler_cache/sccache_launcher.py and `stats`.
SETTINGS = "vfa-sccache.json"
LOCAL_CONF = "vfa-sccache-local.toml"
DIST_CONF = "vfa-sccache-dist.toml"  # SCCACHE_CONF with its caches read-only (cluster_server_settings)
MAX_CLUSTER_FAILURES = 3
# Probe failures that a build without [dist] may not have: it is tried before giving up the cache.
DIST_FAILURES = ("start", "dist-auth", "dist-toolchain")


# --- 3. the build's servers ---------------------------------------------------------------

def own_server(build_dir: Path, role: str) -> str:
    """An abstract unix socket for this user and build dir (no file, no port to collide)."""
    key = hashlib.sha256(f"{os.getuid()}:{build_dir.resolve()}".encode()).hexdigest()[:20]
    return f"\\x00vfa-sccache-{role}-{key}"


def server_view(sccache: str, env: dict[str, str]) -> tuple[str, str | None]:
    return show_stats(sccache, env).get("cache_location", ""), dist_status(sccache, env)["scheduler"]


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
            local_conf.write_text(text, encoding="utf-8")
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
                if scheduler_url and local_conf is not None:
                    # The cache checked without [dist], read-write as the environment asks; the cluster on a
                    # second server whose cache is read-only, as the build's is (dist_trust.py): no object a
                    # build server made for the probe enters any cache.
                    found = on_private_server(args, dict(env, SCCACHE_CONF=str(local_conf)), work, start_failed,
                                              cluster_env=dict(env, **read_only_settings(conf_path, build_dir)))
                elif scheduler_url:
                    # No copy of SCCACHE_CONF without [dist] (no tomllib): one server, read-only, as this build's
                    # compiles will all meet it (there is no server without [dist] to fall back on).
                    found = on_private_server(args, dict(env, **read_only_settings(conf_path, build_dir)), work,
                                              start_failed)
                else:
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
    client = ([sys.executable, "-E", "-s", "-S", ENTRY, COMPILE_ENV_MODULE, args.sccache] if dist_mode == "on"
              else [args.sccache])
    if dist_mode == "on":
        # What this build's compiles meet: a read-only cache (dist_trust.py), whatever the probe's own
        # server, which had the environment's settings, found.
        result["rw_mode"] = "read-only"
        result["checks"].append(f"read-only for this build: its compiles go to the sccache-dist cluster (the cache "
                                f"itself was {found['rw_mode']})")
    settings = {"sccache": args.sccache, "client": client, "build_dir": str(build_dir), "dist": dist_mode,
                "scheduler": public_url,
                "server": server, "own_server": not explicit, "local": local,
                "max_cluster_failures": MAX_CLUSTER_FAILURES}
    (build_dir / SETTINGS).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    return result


def cluster_server_settings(conf_path: Path, build_dir: Path) -> dict[str, str]:
    """What the build's sccache server gets when its compiles go to a cluster: the caches
    read-only (read_only_settings), and its warnings in a log of the build dir."""
    settings = read_only_settings(conf_path, build_dir)
    # Its warnings in a 0600 file of the build dir: sccache's silent fallbacks, which the
    # launcher counts (dist_bound.py); sccache appends to it and keeps its mode.
    log = build_dir / DIST_LOG
    log.touch(mode=0o600)
    log.chmod(0o600)
    settings["SCCACHE_ERROR_LOG"] = str(log)
    level = os.environ.get("SCCACHE_LOG", "")
    settings["SCCACHE_LOG"] = level if level.split(",")[0].lower() in ("warn", "info", "debug", "trace") else "warn"
    return settings


def read_only_settings(conf_path: Path, build_dir: Path) -> dict[str, str]:
    """Every cache backend read-only (dist_trust.py: a build server's object must not reach the
    shared cache), for a server whose compiles go to a cluster (the build's, the probe's):
    through the environment and, for a cache configured in SCCACHE_CONF, a 0600 copy of that
    file with rw_mode = "READ_ONLY" in its [cache.*] tables."""
    settings = read_only_server_env()
    copy = read_only_conf(conf_path) if conf_path.is_file() else None
    if copy is not None:
        path = build_dir / DIST_CONF
        path.touch(mode=0o600)  # it may hold cache credentials, as the original does
        path.chmod(0o600)
        path.write_text(copy, encoding="utf-8")
        settings["SCCACHE_CONF"] = str(path)
    return settings


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
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def scrubbed_crash(text: str, environ: dict[str, str]) -> str:
    """A crash's text (CMake prints it) without the credentials of any URL in the
    environment (SCCACHE_REDIS_ENDPOINT, a scheduler URL ...): an exception message may
    quote one, and the probe's own scrubbing of its answers did not run."""
    return without_env_secrets(text, environ)


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
