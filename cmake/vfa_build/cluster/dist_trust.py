"""What a build trusts of the objects an sccache-dist cluster returns (dist-compile/README.md,
"Trust model").

A build server holding a valid token can return any object for a compile it is sent. Three
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
2. A sample checked here. With VFA_DIST_VERIFY=N (release builds: docs/release.md), units the
   cluster built are compiled again on this machine, through an sccache server of its own with
   an empty cache and no cluster (sccache splits an nvcc call into steps, and the cluster runs
   some of them: the same split here), and must give the same object; a difference fails the
   build (verify_unit). Which units (why_verify): one in N, drawn with a secret of this build
   (sample_key: a 0600 file of the build dir, on no command line and in no compile's
   environment, so a server cannot tell which of its answers are checked; the unit's name,
   which the server receives, once chose them), and at least the first unit of each build the
   cluster built and one unit of each build server (known by the build's sccache server's
   compiles per server, counted before and after the unit: servers_of). sccache's compiles are
   deterministic (nvcc alone is not: its per-process temporary names, tmpxft_<pid>_<n>, are set
   equal before the bytes are compared, should one appear). Each check is recorded (VERIFIED);
   the end of the build says how many and records them (sccache_build_report.py).
     sccache_launcher.py calls verify_unit after a compile through the cluster succeeded, on
     the object in its private temporary (dist_output.py), before it is moved into place.
3. Objects carry their origin. The launcher records where each unit's object in the build dir
   came from (ORIGIN: the cluster and which servers, checked or not; here); a failed check
   removes every object the cluster built in the build dir (remove_cluster_objects), and the
   configure of a build that does not take the cluster's objects on the same terms removes them
   too (compiler_cache_probe.py), so that ninja compiles them again here.

Standard library only (the launcher runs once per unit, as `python -E -s -S`).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vfa_build.cluster.compile_env import sccache_server_answers  # (whether the build's sccache server listens)
from vfa_build.cluster.dist_output import claim, drop  # (where the cluster writes: take_object)

# Every cache backend's read-only switch in sccache 0.16 (its config.rs); the one of the
# backend in use applies, the others are ignored.
RW_MODE_VARS = ("SCCACHE_LOCAL_RW_MODE", "SCCACHE_S3_RW_MODE", "SCCACHE_REDIS_RW_MODE", "SCCACHE_MEMCACHED_RW_MODE",
                "SCCACHE_GCS_RW_MODE", "SCCACHE_GHA_RW_MODE", "SCCACHE_AZURE_RW_MODE", "SCCACHE_WEBDAV_RW_MODE",
                "SCCACHE_OSS_RW_MODE", "SCCACHE_COS_RW_MODE")
READ_ONLY = "READ_ONLY"
# Written at configure (cmake/DistTrust.cmake) into the build dir.
VERIFY_FILE = "vfa-dist-verify.json"
SAMPLE_KEY = "vfa-dist-sample.key"  # this build's secret the sample is drawn with (sample_key)
VERIFIED = "vfa-dist-verified.tsv"  # the checked units, each line naming its build (record_verified); the end reads it
# One line per purge (remove_cluster_objects): a unit whose cluster compile was under way when one
# came discards its object (take_object).
PURGES = "vfa-dist-purges.tsv"
ORIGIN_LOCK = "vfa-dist-origin.lock"  # held while objects are purged, and while one is moved into place
# Every unit the launcher compiled while the cluster was on, where (record_origin): the last line of a unit says
# where its object in the build dir came from.
ORIGIN = "vfa-dist-origin.tsv"
TERMS = "vfa-dist-terms.json"  # the terms the build dir's cluster objects were taken on (reconcile)
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


def sample_key(build_dir: str, build: str | None) -> bytes:
    """This build's secret (SAMPLE_KEY, 0600 in the build dir): 32 random bytes, new for each
    build (the build tool's pid and start, compile_unit.this_build). It is on no command line
    and in no compile's environment, so a build server cannot tell which units are checked."""
    path = Path(build_dir) / SAMPLE_KEY
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+", encoding="ascii") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        owner, _, key = f.read().strip().partition("\t")
        if len(key) != 64 or (build is not None and owner != build):
            key = os.urandom(32).hex()
            f.seek(0)
            f.truncate()
            f.write(f"{build or ''}\t{key}\n")
            # A new build starts a new record of checks (its lines are its own: verified_lines;
            # an earlier build's, failed or interrupted before its end cleared them, go).
            _remove(str(Path(build_dir) / VERIFIED))
        return bytes.fromhex(key)


def in_sample(key: bytes, unit: str, every: int) -> bool:
    """Whether <unit> is among the one in <every> checked, drawn with this build's secret <key>."""
    if every <= 0:
        return False
    return int.from_bytes(hmac.new(key, unit.encode("utf-8", "surrogateescape"), hashlib.sha256).digest(),
                          "big") % every == 0


def dist_counts(sccache: str, env: dict[str, str]) -> dict[str, int]:
    """Compiles per build server, as the build's sccache server counts them ({} unreadable, and
    for a server not started yet, which has counted nothing)."""
    if not sccache_server_answers(env):  # compile_env.py's check: asking sccache would start one
        return {}
    try:
        out = subprocess.run([sccache, "--show-stats", "--stats-format=json"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=60).stdout
        return {k: int(v) for k, v in json.loads(out)["stats"]["dist_compiles"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, subprocess.SubprocessError):
        return {}


def servers_of(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The build servers whose count grew while a unit compiled: those that built it (and, when
    other units finished meanwhile, theirs)."""
    return sorted(server for server, n in after.items() if n > before.get(server, 0))


def verified_lines(build_dir: str, build: str | None, latest: bool = False) -> list[list[str]]:
    """The VERIFIED lines of one build (each ninja run: compile_unit.this_build; "" for units
    compiled outside any build tool): [time, unit, servers (comma-separated), result, seconds,
    why, build]. A failed or interrupted build never reached the end that clears the record: its
    checks are not this build's ("first" and "server" are drawn again, the end line counts only
    this build's). `latest` with no build (the end step run by hand): the last build recorded."""
    try:
        text = (Path(build_dir) / VERIFIED).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    lines = [line.split("\t") for line in text.splitlines() if line.count("\t") == 6]
    want = lines[-1][6] if (latest and build is None and lines) else (build or "")
    return [line for line in lines if line[6] == want]


def why_verify(build_dir: str, key: bytes, unit: str, every: int, servers: list[str],
               build: str | None = None) -> str | None:
    """Why <unit> is checked ("sample", "first", "server"), or None. With verification on, every
    build checks at least one unit the cluster built ("first") and one unit of each build server it learns of
    ("server": a unit that only it served; a unit whose compile overlapped others' credits no
    server, and the next one of that server is checked)."""
    if every <= 0:
        return None
    if in_sample(key, unit, every):
        return "sample"
    if not servers:
        return None  # no build server counted a compile of it: from the (trusted) cache, or compiled here
    lines = verified_lines(build_dir, build)  # this build's checks only
    if not lines:
        return "first"
    covered = {line[2] for line in lines if line[3] == "same" and "," not in line[2]}
    if len(servers) == 1 and servers[0] not in covered:
        return "server"
    return None


def _append_line(path: Path, line: str) -> None:
    """<line> appended to one of the build dir's records (VERIFIED, ORIGIN) in one write, so lines of
    parallel units never interleave; a record that cannot be written is left as it is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError:
        pass


def record_verified(build_dir: str, unit: str, servers: list[str], result: str, seconds: float, why: str,
                    build: str | None = None) -> None:
    _append_line(Path(build_dir) / VERIFIED,
                 f"{time.time():.3f}\t{unit}\t{','.join(servers)}\t{result}\t{seconds:.2f}\t{why}\t"
                 f"{build or ''}\n")


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


def verify_unit(settings: dict, unit: str, command: list[str], obj: str | None = None,
                servers: list[str] | None = None, build: str | None = None) -> tuple[int, bool]:
    """After <command> (a compiler and its arguments) succeeded through the cluster's sccache
    server, its object in <obj> (dist_output.py's private temporary; default: the command's
    -o), built by <servers> (servers_of): when why_verify says so, compile it here
    (compile_here) and compare, recorded in VERIFIED. Returns (0, checked) when it matches or
    is not checked, else (1, True), having said why and removed every object the cluster built in this build
    dir (remove_cluster_objects: nothing of the cluster's links, and a rebuild compiles them
    again)."""
    every = verify_every(settings["build_dir"])
    obj = obj or _object_of(command)
    if obj is None or every <= 0:
        return 0, False
    servers = servers or []
    why = why_verify(settings["build_dir"], sample_key(settings["build_dir"], build), unit, every, servers, build)
    if why is None:
        return 0, False
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="vfa-verify-", dir=settings["build_dir"]))
    here = str(scratch / "here.o")
    try:
        local = compile_here(settings["sccache"], _with_output(command, here, f"{here}.d"), scratch)
        if local.returncode != 0:
            record_verified(settings["build_dir"], unit, servers, "failed-here", time.monotonic() - started, why,
                            build)
            print(f"vendored-flash-attn: VFA_DIST_VERIFY: {unit} compiled through the sccache-dist cluster, but "
                  f"its compile here failed ({local.returncode}):\n{local.stderr.decode(errors='replace')[-2000:]}",
                  file=sys.stderr)
            _remove(obj)
            return 1, True
        got, want = comparable(Path(obj).read_bytes()), comparable(Path(here).read_bytes())
        if got == want:
            record_verified(settings["build_dir"], unit, servers, "same", time.monotonic() - started, why, build)
            return 0, True
        record_verified(settings["build_dir"], unit, servers, "differs", time.monotonic() - started, why, build)
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        _remove(obj)
        removed = remove_cluster_objects(settings["build_dir"])
        print(f"vendored-flash-attn: VFA_DIST_VERIFY: the object of {unit} that came through the sccache-dist "
              f"cluster {settings.get('scheduler', '')} differs from a compile of the same command here ({len(got)} "
              f"bytes against {len(want)}, first difference at byte {first}): a build server "
              f"({', '.join(servers) or 'unknown'}) returned something other than the compiler makes. The build "
              f"stops: nothing it built from the cluster can be trusted, and the {removed} other objects the "
              f"cluster built in this build dir are removed. Find the server (`sccache --show-stats` with this "
              f"build's server counts compiles per server; its log), take it out of the cluster and rotate the key "
              f"(dist-compile/README.md, \"Trust model\").", file=sys.stderr)
        return 1, True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- 3. where each object came from ------------------------------------------------------

def record_origin(build_dir: str, unit: str, where: str, servers: list[str] = (), verified: bool = False) -> None:
    """One ORIGIN line: <unit>'s object in the build dir now comes from <where> ("cluster",
    built by <servers>, checked here or not; "here"; "removed")."""
    _append_line(Path(build_dir) / ORIGIN,
                 f"{time.time():.3f}\t{unit}\t{where}\t{','.join(servers)}\t{int(verified)}\n")


def cluster_objects(build_dir: str) -> dict[str, tuple[str, bool]]:
    """The units whose object in the build dir the cluster built: {unit: (servers, verified)}."""
    last: dict[str, list[str]] = {}
    try:
        text = (Path(build_dir) / ORIGIN).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 5:
            last[parts[1]] = parts
    return {unit: (p[3], p[4] == "1") for unit, p in last.items() if p[2] == "cluster"}


class _OriginLock:
    """flock on ORIGIN_LOCK: a purge and a unit's object moved into place never interleave (a
    unit is either in place before the purge, and removed by it, or sees the purge and discards
    its object). Without the lock file (a build dir that cannot be written) it locks nothing."""

    def __init__(self, build_dir: str):
        self.path = Path(build_dir) / ORIGIN_LOCK
        self.fd: int | None = None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return self
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def purges(build_dir: str) -> int:
    """How many purges (remove_cluster_objects) this build dir has had: the launcher reads it
    before a unit goes to the cluster, and take_object again before its object is moved in."""
    try:
        with open(Path(build_dir) / PURGES, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def remove_cluster_objects(build_dir: str) -> int:
    """Removes every object the cluster built in this build dir (the next build compiles them
    again, as ninja finds them missing), and records the purge, so that an object still on its
    way from the cluster is discarded (take_object); returns how many there were."""
    with _OriginLock(build_dir):
        _append_line(Path(build_dir) / PURGES, f"{time.time():.3f}\n")
        units = cluster_objects(build_dir)
        for unit in units:
            _remove(str(Path(build_dir) / unit))
            record_origin(build_dir, unit, "removed")
    return len(units)


def take_object(build_dir: str, unit: str, private: str, seen_purges: int, servers: list[str],
                checked: bool) -> str:
    """The cluster's object of <unit> (in dist_output.py's <private> temporary) into place and its
    origin recorded ("taken"), unless the build dir had a purge since the unit went to the
    cluster (<seen_purges>, read then): a check failed meanwhile and nothing of the cluster's is
    trusted, so the object is discarded ("purged"). "none": the compile wrote no object."""
    with _OriginLock(build_dir):
        if purges(build_dir) != seen_purges:
            drop(private)
            return "purged"
        if not claim(private, unit):
            return "none"
        # No server counted a compile: a hit of the (read-only, trusted) cache, or sccache's own
        # fallback here. Compiles of other units that ended meanwhile count too: an object is
        # credited to the cluster rather than not.
        record_origin(build_dir, unit, "cluster" if servers else "here", servers, checked)
        return "taken"


def terms_now(build_dir: str, cache_enabled: bool) -> dict:
    """The terms this configure takes the cluster's objects on: whether compiles go to a cluster
    (the launcher's settings, compiler_cache_probe.py), which scheduler, and VFA_DIST_VERIFY."""
    settings = {}
    if cache_enabled:
        try:
            settings = json.loads((Path(build_dir) / "vfa-sccache.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            settings = {}
    on = settings.get("dist") == "on"
    return {"cluster": on, "scheduler": settings.get("scheduler", "") if on else "",
            "verify": verify_every(build_dir) if on else 0}


def reconcile(build_dir: str, cache_enabled: bool) -> str:
    """At configure: the objects the cluster built in this build dir stay only for a build that
    takes them on the same terms (TERMS: the cluster on, the same scheduler, the same
    VFA_DIST_VERIFY); otherwise they are removed, so that this build compiles them here (a
    `pip wheel` without the cluster, from a build dir a cluster build left, linked them and
    recorded a local build). Returns the line to say ("" when nothing was removed)."""
    now = terms_now(build_dir, cache_enabled)
    path = Path(build_dir) / TERMS
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    said = ""
    objects = cluster_objects(build_dir)
    if objects and before != now:
        removed = remove_cluster_objects(build_dir)
        was = (f"the sccache-dist cluster {before['scheduler']} with VFA_DIST_VERIFY={before['verify']}"
               if before and before.get("cluster") else "an sccache-dist cluster")
        this = (f"the cluster {now['scheduler']} with VFA_DIST_VERIFY={now['verify']}" if now["cluster"]
                else "no cluster")
        said = (f"{removed} objects of this build dir were built by {was}; this build, with {this}, compiles them "
                f"again here before it links anything (dist-compile/README.md, \"Trust model\")")
    path.write_text(json.dumps(now) + "\n", encoding="utf-8")
    return said


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    # cmake/DistTrust.cmake at configure: dist_trust.py reconcile BUILD_DIR CACHE_ENABLED(0|1)
    if len(sys.argv) == 4 and sys.argv[1] == "reconcile":
        print(reconcile(sys.argv[2], sys.argv[3] not in ("", "0", "FALSE", "OFF")), end="")
    else:
        sys.exit("usage: dist_trust.py reconcile BUILD_DIR CACHE_ENABLED")
