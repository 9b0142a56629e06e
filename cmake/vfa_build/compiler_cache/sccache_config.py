"""The compiler-cache probe's step 0: what is configured (SCCACHE_CONF, its [dist] scheduler, a backend).

The config file sccache reads and whether SCCACHE_CONF named it; the file parsed, and its
text without [dist] (the same cache, no scheduler: what the build falls back to); a
scheduler URL that carries credentials (refused); a scheduler that accepts connections but
never answers (asked one bounded HTTP question); and, when a server cannot start, the
settings that picked its backend, for the message. Used by cmake/vfa_build/compiler_cache/compiler_cache_probe.py.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from vfa_build.compiler_cache.sccache_stats import START_NOTE, ProbeFailure, output_of
from vfa_build.url_secrets import secrets_in, without_secrets  # the project's one URL scrubber (cmake/vfa_build/url_secrets.py)

try:
    import tomllib
except ImportError:  # Python < 3.11: no [dist]-less copy of SCCACHE_CONF, no local fallback server
    tomllib = None

SCHEDULER_ANSWER_S = 5  # sccache's own connect timeout to a scheduler is 5 s
# Settings that select a remote cache backend (sccache's docs): named when a server cannot start.
BACKEND_VARS = ("SCCACHE_REDIS", "SCCACHE_REDIS_ENDPOINT", "SCCACHE_REDIS_CLUSTER_ENDPOINTS", "SCCACHE_MEMCACHED",
                "SCCACHE_MEMCACHED_ENDPOINT", "SCCACHE_BUCKET", "SCCACHE_GCS_BUCKET", "SCCACHE_AZURE_BLOB_CONTAINER",
                "SCCACHE_WEBDAV_ENDPOINT", "SCCACHE_GHA_ENABLED", "SCCACHE_OSS_BUCKET", "SCCACHE_COS_BUCKET")


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
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            return json.loads(text)
        return tomllib.loads(text) if tomllib else None
    except (OSError, ValueError):
        return None


def without_dist(path: Path) -> str | None:
    """The config file's text minus its [dist] tables (the same cache settings, no scheduler),
    checked by parsing both; None when that cannot be made safely."""
    text = path.read_text(encoding="utf-8")
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


def refused_fix(conf: str, accepted_before: bool) -> str:
    """What to do when the scheduler refuses this client's token (HTTP 401/403), said by the
    configure's probe and by the launcher alike. Rotating the cluster's secrets
    (dist-compile/README.md, "Rotating") makes a new client token: every client that keeps the
    old one is refused from the scheduler's restart on, so a token accepted before points there."""
    cause = ("The scheduler accepted this token at configure: its secrets were most likely rotated since"
             if accepted_before else "If this token worked before, the cluster's secrets were most likely rotated")
    return (f"the token under [dist.auth] in {conf} must equal the scheduler's client_auth token. {cause} "
            "(`cluster.py secrets`, the scheduler restarted with them): take the new VFA_DIST_CLIENT_TOKEN, write "
            f"this client's config again with it (`python dist-compile/cluster.py client --scheduler-url - --out "
            f"{conf}`, the URL on stdin) and reconfigure (dist-compile/README.md, \"Rotating\")")


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
