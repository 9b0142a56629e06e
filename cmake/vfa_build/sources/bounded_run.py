"""Runs one command in a process group of its own, and ends the whole group, every process it
started included, when the command ends, when ``--timeout`` seconds pass, or when this process is
interrupted. Used for every git call of a fetch (cmake/UpstreamGit.cmake): CMake's
execute_process TIMEOUT ends only the process it started, and a git whose helpers (a remote
helper, a partial clone's lazy fetch) start git again would leave them running.

    python -E -s -S cmake/vfa_build sources.bounded_run --timeout 600 -- git fetch ...

Exit status: the command's; 124 when the timeout ended it (a line on stderr says so); on
SIGINT/SIGTERM the group is ended and this process dies of the same signal, so the caller sees
an interrupt, not a failure. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

TIMED_OUT = 124
# How long the group gets to end after SIGTERM before SIGKILL.
GRACE = 2.0


def end_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    child = subprocess.Popen(command, start_new_session=True)

    def interrupted(signum, _frame):
        end_group(child.pid)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        rc = child.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        end_group(child.pid)
        child.wait()
        print(f"timed out: did not finish within {args.timeout:g} s", file=sys.stderr)
        return TIMED_OUT
    end_group(child.pid)  # what the command left running in its group
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
