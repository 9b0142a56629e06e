"""The compiler launcher of every translation unit: records when it starts and ends, keeps
its whole output in a log, and passes on to ninja what a user needs to see.

    compile_unit.py BUILD_DIR [--quiet-under TREE]... -- LAUNCHER... COMPILER ARGS...

wired in by cmake/BuildProgress.cmake in front of whatever launcher the build already has
(sccache, or none), run as `python -E -s -S` (the standard library only). It

  * appends "start" and "end" events to BUILD_DIR/vfa-progress.tsv, which
    build_monitor.py follows (one tab-separated line per event, one write each, so lines of
    parallel units never interleave):
        start<TAB>TIME<TAB>UNIT
        end<TAB>TIME<TAB>UNIT<TAB>EXIT<TAB>SECONDS<TAB>HIDDEN
    TIME is time.time(), UNIT the object file as ninja names it (the command's -o);
  * runs the command and writes its whole output to BUILD_DIR/vfa-compile.log;
  * passes on the output minus the warnings located under the --quiet-under trees
    (compiler_output.py), with a note of how many it left out when the unit failed;
  * exits with the command's status.

It never fails or hides anything of its own accord: when its log cannot be written it
passes the output on unfiltered; events that cannot be written are skipped. It runs once
per unit, so it imports little (what it costs: docs/PERFORMANCE.md, "Build").
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compiler_output import filter_output  # noqa: E402

EVENTS = "vfa-progress.tsv"
COMPILE_LOG = "vfa-compile.log"


def append_line(path: str, line: str) -> bool:
    """One write on an O_APPEND descriptor."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def append_log(path: str, text: str) -> bool:
    try:
        with open(path, "a", encoding="utf-8", errors="surrogateescape") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(text)
        return True
    except OSError:
        return False


def output_of(command: list[str]) -> str:
    """The object file a compile command writes (its last -o)."""
    for i in range(len(command) - 2, -1, -1):
        if command[i] == "-o":
            return command[i + 1]
    return command[-1] if command else "?"


def compile_unit(build_dir: str, quiet_roots: list[str], command: list[str]) -> int:
    unit = output_of(command).replace("\t", " ").replace("\n", " ")
    events = os.path.join(build_dir, EVENTS)
    start = time.time()
    append_line(events, f"start\t{start:.3f}\t{unit}\n")

    proc = None

    def forward(signum, _frame):
        # ninja signals the whole process group, the compiler included; a signal sent to
        # this launcher alone must reach the compiler too. Either way wait for it to end.
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        raw, _ = proc.communicate()
        rc = proc.returncode
    except OSError as error:
        raw, rc = f"{command[0] if command else '(no command)'}: {error}\n".encode(), 127
    seconds = time.time() - start
    text = raw.decode("utf-8", "surrogateescape")

    shown, hidden = text, 0
    log = os.path.join(build_dir, COMPILE_LOG)
    if append_log(log, f"==> {unit}: exit {rc}, {seconds:.1f} s\n{text}"):
        try:
            shown, hidden = filter_output(text, quiet_roots)
        except Exception:  # noqa: BLE001 - a filter bug must not cost the user the output
            shown, hidden = text, 0
    if rc != 0 and hidden:
        shown += (f"({hidden} warnings located in upstream code are not shown here; the whole "
                  f"output of this compile is in {log})\n")
    if shown:
        sys.stdout.buffer.write(shown.encode("utf-8", "surrogateescape"))
        sys.stdout.flush()
    append_line(events, f"end\t{time.time():.3f}\t{unit}\t{rc}\t{seconds:.3f}\t{hidden}\n")
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str]) -> int:
    if "--" not in argv or not argv or argv[0].startswith("-"):
        print("usage: compile_unit.py BUILD_DIR [--quiet-under TREE]... -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    options, command = argv[1:split], argv[split + 1:]
    if len(options) % 2 or any(flag != "--quiet-under" for flag in options[::2]):
        print(f"compile_unit.py: unknown options {options}", file=sys.stderr)
        return 2
    return compile_unit(argv[0], options[1::2], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
