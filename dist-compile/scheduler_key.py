"""The scheduler stops serving when its key expires (`cluster.py scheduler --run`).

sccache-dist's scheduler checks a server token's signature only, and a token is good for as
long as the key that signed it (cluster.py key_expiry_problem). cluster.py refuses an expired
key when the scheduler starts; a scheduler that runs on past the key's age would keep every
token of it working. So cluster.py runs sccache-dist's scheduler under this supervisor, which
sleeps until the key's age is reached (waking at least every CHECK_S seconds, should the
clock jump), then says so in the scheduler's log and stops it: its servers' heartbeats then
fail, and clients compile here until the scheduler is restarted with a new key.

    scheduler_key.py --created EPOCH --max-age-days N [--log FILE] -- SCCACHE-DIST scheduler --config CONF

Its lines go into the scheduler's log (the 0600 --log file), each starting with "vfa-dist:".
Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from server_health import die_with_parent, say, start_log  # the build servers' supervisor: the same child, log and lines

CHECK_S = 60.0


def supervise(cmd: list[str], env: dict[str, str], log: str | None, expires: float) -> int:
    """Runs <cmd> with <env>, output to the 0600 <log>, until time.time() reaches <expires>."""
    start_log(log, cmd)
    stop = threading.Event()
    child = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)

    def ending(signum, _frame):
        stop.set()
        if child.poll() is None:
            child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, ending)
    while not stop.is_set() and child.poll() is None:
        left = expires - time.time()
        if left <= 0:
            say("the server key has reached --key-max-age-days: stopping the scheduler, so that no token it signed "
                "is accepted any more (build servers' heartbeats fail; clients compile here). Make a new key "
                "(cluster.py secrets --out FILE), restart the scheduler with it and mint every build server's token "
                "anew (cluster.py server-token)")
            child.terminate()
            child.wait()
            return 3
        stop.wait(min(CHECK_S, left))
    child.wait()
    return child.returncode


def main(argv: list[str]) -> int:
    import argparse

    if "--" not in argv:
        sys.exit("usage: scheduler_key.py --created EPOCH --max-age-days N [--log FILE] -- COMMAND...")
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--created", type=int, required=True)
    parser.add_argument("--max-age-days", type=int, required=True)
    parser.add_argument("--log")
    args = parser.parse_args(argv[:split])
    return supervise(argv[split + 1:], dict(os.environ), args.log, args.created + args.max_age_days * 86400)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
