"""A build server's health, watched while it runs (`cluster.py server --run`).

sccache-dist's scheduler knows a build server by its heartbeats only: a server whose disk is
full goes on heartbeating, is sent compiles and fails each one (clients then compile here,
without a word), and a server whose token the scheduler no longer accepts (its key was
rotated) logs "Failed to send heartbeat" every 10 s and nothing else. So cluster.py runs
sccache-dist under this supervisor, which

  * checks the free space of the server's folder (toolchains, sandboxes) every CHECK_S
    seconds: below --min-free-mb it stops sccache-dist, saying so, and the scheduler drops
    the server once its heartbeats stop (sccache-dist's HEARTBEAT_TIMEOUT, 90 s); once
    there is room again it starts it, and the server registers anew;
  * reads the server's log for a heartbeat the scheduler refused (HTTP 401) and says once
    what that is and what to do (mint this server a new token on the scheduler host);
  * passes SIGTERM/SIGINT on and exits with sccache-dist's status when it ends by itself.

Its lines go into the server's log (the 0600 --log file) beside sccache-dist's, each
starting with "vfa-dist:". Standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

CHECK_S = 10.0
HEARTBEAT_TIMEOUT_S = 90  # sccache-dist's: the scheduler drops a server after it
REFUSED = "Failed to send heartbeat"


def die_with_parent() -> None:
    """In the child, before exec: the kernel kills it when this supervisor dies, however it dies
    (a SIGKILL cannot be passed on): no sccache-dist is left serving without its supervisor."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def say(text: str) -> None:
    print(f"vfa-dist: {text}", flush=True)


def start_log(log: str | None, cmd: list[str]) -> None:
    """This supervisor's output (and so the child's, which inherits it) into the 0600 <log> when one
    is given, then the command it runs, as its first line."""
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    print("+ " + " ".join(cmd), flush=True)


def free_mb(folder: Path) -> int:
    return shutil.disk_usage(folder).free // 2**20


def refused_heartbeat(log: Path, offset: int) -> tuple[str | None, int]:
    """A heartbeat the scheduler refused (401) logged after <offset>, and the new offset."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
            offset = f.tell()
    except OSError:
        return None, offset
    for line in text.splitlines():
        if REFUSED in line and "401" in line:
            return line.strip(), offset
    return None, offset


def supervise(cmd: list[str], env: dict[str, str], log: str | None, folder: Path, min_free: int,
              public_addr: str, check_s: float = CHECK_S) -> int:
    """Runs <cmd> (sccache-dist server) with <env>, output to the 0600 <log>, while <folder>
    has at least <min_free> MB free; see the module's doc. Returns its exit status."""
    start_log(log, cmd)
    stop = threading.Event()
    child: subprocess.Popen | None = None

    def ending(signum, _frame):
        stop.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, ending)
    offset = os.path.getsize(log) if log else 0
    told_refused = False
    paused = False
    while not stop.is_set():
        room = free_mb(folder)
        if room < min_free:
            if child is not None:
                say(f"{folder} has {room} MB free, below --min-free-mb={min_free}: stopping sccache-dist, so "
                    f"that the scheduler sends this server no more compiles (it drops it {HEARTBEAT_TIMEOUT_S} s "
                    f"after its last heartbeat). Free space there (its toolchains and sandboxes: old toolchains "
                    f"can go); it starts again once there is room")
                child.terminate()
                child.wait()
                child = None
            paused = True
        elif child is None:
            if paused:
                say(f"{folder} has {room} MB free again: starting sccache-dist")
            child = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
            paused = False
        if child is not None and child.poll() is not None:
            return child.returncode
        if log and not told_refused:
            line, offset = refused_heartbeat(Path(log), offset)
            if line:
                told_refused = True
                say(f"the scheduler refuses this server's token (HTTP 401: {line[-160:]}): its key was rotated, or "
                    f"the token was minted for another address or from another key. On the scheduler host, mint "
                    f"this server a new token (cluster.py server-token --public-addr {public_addr} --out FILE), "
                    f"copy it here (mode 0600) and restart this server with --token-file FILE")
        stop.wait(check_s)
    if child is not None:
        child.wait()
        return child.returncode
    return 0


def main(argv: list[str]) -> int:
    """server_health.py --folder DIR --min-free-mb N --public-addr IP:PORT [--log FILE] -- SCCACHE-DIST ARGS...

    exec'd by `cluster.py server --run` with the environment sccache-dist gets, so that this
    long-lived process holds nothing of the operator's environment either."""
    import argparse

    if "--" not in argv:
        sys.exit("usage: server_health.py --folder DIR --min-free-mb N --public-addr ADDR [--log FILE] -- COMMAND...")
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", required=True)
    parser.add_argument("--min-free-mb", type=int, required=True)
    parser.add_argument("--public-addr", required=True)
    parser.add_argument("--log")
    args = parser.parse_args(argv[:split])
    return supervise(argv[split + 1:], dict(os.environ), args.log, Path(args.folder), args.min_free_mb,
                     args.public_addr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
