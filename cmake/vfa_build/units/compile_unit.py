"""The compiler launcher of every translation unit: records when it starts and ends, keeps
its whole output in a log, and passes on to ninja what a user needs to see.

    compile_unit.py BUILD_DIR [--quiet-under TREE]... -- LAUNCHER... COMPILER ARGS...

wired in by cmake/BuildProgress.cmake in front of whatever launcher the build already has
(sccache, or none), run as `python -E -s -S` (the standard library only). It

  * appends "start" and "end" events to BUILD_DIR/vfa-progress.tsv, which
    build_monitor.py follows (one tab-separated line per event, one write each, so lines of
    parallel units never interleave):
        start<TAB>TIME<TAB>UNIT
        end<TAB>TIME<TAB>UNIT<TAB>EXIT<TAB>SECONDS<TAB>HIDDEN<TAB>NOTES
        stopped<TAB>TIME<TAB>UNIT<TAB>EXIT<TAB>PROCESSES<TAB>IN_SERVER   (an interrupt)
        output<TAB>TIME<TAB>UNIT<TAB>TEXT       (what the monitor prints: relay)
        note<TAB>TIME<TAB><TAB>TEXT             (a line for the console now: say_now)
    TIME is time.time(), UNIT the object file as ninja names it (the command's -o),
    HIDDEN the compiler warnings and NOTES the ptxas notes it kept off the console, TEXT
    a JSON string;
  * runs the command and writes its whole output to BUILD_DIR/vfa-compile.log;
  * passes on the output minus the warnings located under the --quiet-under trees
    (compiler_output.py), with a note of how many it left out when the unit failed: to the
    progress monitor, which prints it at once, in order, when the unit compiled and a
    monitor of this build runs (relay; ninja would print it only once the monitor ends),
    else to ninja;
  * exits with the command's status;
  * on SIGINT, SIGTERM or SIGHUP (ninja's interrupt) stops every process of the compile, in
    a compiler cache's server too, and exits 128 + the signal (run_command);
  * keeps the three logs of the build dir to one build each: the last build's are NAME.1
    (start_build_logs).

It never fails or hides anything of its own accord: when its log cannot be written it
passes the output on unfiltered; events that cannot be written are skipped. It runs once
per unit, so it imports little (what it costs: docs/PERFORMANCE.md, "Build").
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

from vfa_build.units.compiler_output import sort_output
from vfa_build.units.proc import _comm, _stat  # (/proc/<pid>/stat and comm)
# The project's one URL scrubber: what the build writes into its logs and shows (a compiler's or
# sccache's error may quote a cache or scheduler URL with its password) goes through it.
from vfa_build.url_secrets import without_env_secrets

EVENTS = "vfa-progress.tsv"
COMPILE_LOG = "vfa-compile.log"
PROGRESS_LOG = "vfa-progress.log"  # build_monitor.py's lines
# The logs above hold one build each: the first process of a build that writes to them moves
# the last build's to NAME.1 (start_build_logs). This file names the build they hold.
LOGS_BUILD = "vfa-logs.build"
# Exists, naming its build, while build_monitor.py prints what the units hand it (relay).
RELAY = "vfa-monitor.build"

# Every process of one compile carries this variable with the launch's own value: the
# compiler, its children (cicc, ptxas, cc1plus), and, through a compiler cache, the compiler
# its server runs (sccache hands the client's environment to the compiler it starts; it is
# not part of sccache's cache key). An interrupt finds them by it, wherever they run.
COMPILE_ID = "VFA_COMPILE_ID"
# A client of a compile server: its compile runs in the server, which goes on with it when
# the client dies. An interrupt stops the compile first and lets the client end with the
# server's answer, after which the server starts nothing more of it. The client is the
# command's first word, or comes after the launcher this project puts in front of it
# (compiler_cache/sccache_launcher.py,
# `python -E -s -S cmake/vfa_build compiler_cache.sccache_launcher SETTINGS -- COMPILER ...`,
# which execs sccache or waits for it).
SERVER_CLIENTS = ("sccache",)
SERVER_CLIENT_LAUNCHERS = ("compiler_cache.sccache_launcher",)


def is_server_client(command: list[str]) -> bool:
    """Whether ``command`` compiles through a compile server (see SERVER_CLIENTS).

    >>> is_server_client(["/venv/bin/sccache", "nvcc", "-c", "a.cu"])
    True
    >>> is_server_client(["/usr/bin/python3", "-E", "-s", "-S", "/p/cmake/vfa_build",
    ...                   "compiler_cache.sccache_launcher", "s.json", "--", "nvcc"])
    True
    >>> is_server_client(["nvcc", "-c", "sccache.cu"])
    False
    """
    if not command:
        return False
    if os.path.basename(command[0]).startswith(SERVER_CLIENTS):
        return True
    launcher_words = command[:command.index("--")] if "--" in command else []
    return any(os.path.basename(word) in SERVER_CLIENT_LAUNCHERS for word in launcher_words)
STOP_WAIT_S = 20  # for a client to get its server's answer once its compile is stopped


def open_log(path: str) -> int:
    """An O_APPEND descriptor on one of the build's logs: created 0600 (it holds what compiles
    and sccache said, which may quote a cache's or a scheduler's address), and a file an
    older build left with another mode is made 0600 before anything more is written."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def append_line(path: str, line: str) -> bool:
    """One write on an O_APPEND descriptor, URL passwords scrubbed."""
    try:
        fd = open_log(path)
        try:
            os.write(fd, without_env_secrets(line).encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def append_log(path: str, text: str) -> bool:
    """<text> appended under a lock, URL passwords scrubbed."""
    try:
        with os.fdopen(open_log(path), "a", encoding="utf-8", errors="surrogateescape") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(without_env_secrets(text))
        return True
    except OSError:
        return False

def source_of(command: list[str]) -> str | None:
    """The source file a compile command compiles (the argument of its last -c), if any."""
    for i in range(len(command) - 2, -1, -1):
        if command[i] == "-c" and not command[i + 1].startswith("-"):
            return command[i + 1]
    return None


def output_of(command: list[str]) -> str:
    """The object file a compile command writes (its last -o)."""
    for i in range(len(command) - 2, -1, -1):
        if command[i] == "-o":
            return command[i + 1]
    return command[-1] if command else "?"


# --- processes (Linux /proc) -------------------------------------------------------------------


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(32):
        stat = _stat(pid)
        if not stat:
            return False
        pid = int(stat[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def marked_processes(mark: bytes) -> list[int]:
    """The live processes (of this user: others' environments are unreadable) whose
    environment holds `mark`, minus compile servers started by a client that had it (sccache
    starts its server with the client's environment plus SCCACHE_START_SERVER=1): the server
    serves every build, and stopping it is not this compile's business."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if mark in environ and b"SCCACHE_START_SERVER=1" not in environ:
            stat = _stat(int(entry))
            if stat and stat[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def stop_compile(proc: subprocess.Popen, mark: bytes, signum: int, client: bool) -> tuple[int, int]:
    """Stops every process of this compile, here and in a compile server; returns (how many
    processes were stopped, how many of them ran outside this launcher: in a server).

    The command runs in a process group (and session) of its own, so the signal ninja sends
    to this launcher's group reaches only the launcher. A compiler run here gets the signal
    (its group: its children too). A compile server's client is left alone: its server runs
    the compile, so the compile's processes are stopped wherever they are until the client
    ends with the server's answer; once it has, the server starts nothing more of it (a
    compile it was still preparing would otherwise start later). Anything of the compile
    still there 2 s after its SIGTERM gets SIGKILL; a client that has no answer after
    STOP_WAIT_S gets SIGKILL too."""
    if not client:
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            pass
    me = os.getpid()
    signalled: dict[int, float] = {}
    outside = set()
    deadline = time.time() + STOP_WAIT_S
    while True:
        ended = proc.poll() is not None
        now = time.time()
        for pid in marked_processes(mark):
            if pid == proc.pid and client and not ended:
                continue
            if pid not in signalled and not _descends_from(pid, me):
                outside.add(pid)
            try:
                os.kill(pid, signal.SIGTERM if now - signalled.setdefault(pid, now) < 2 else signal.SIGKILL)
            except OSError:
                pass
        if ended and not [pid for pid in signalled if _stat(pid) and _stat(pid)[0] not in ("Z", "X")]:
            break
        if now > deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = now + 5  # then only what SIGKILL leaves to reap
        time.sleep(0.1)
    return len(set(signalled) | ({proc.pid} if not client else set())), len(outside)


class Stopped:
    """What an interrupt stopped: the signal, how many processes, how many of them in a
    compile server."""
    __slots__ = ("signal", "processes", "in_server")

    def __init__(self, signum: int, processes: int = 0, in_server: int = 0):
        self.signal, self.processes, self.in_server = signum, processes, in_server

    def line(self, unit: str) -> str:
        name = signal.Signals(self.signal).name
        if not self.processes:
            return f"vfa: interrupted ({name}) before the compile of {unit} started\n"
        where = f", {self.in_server} of them in the compiler cache's server" if self.in_server else ""
        return (f"vfa: interrupted ({name}): stopped the compile of {unit} ({self.processes} "
                f"process{'es' if self.processes != 1 else ''}{where})\n")


def run_command(command: list[str]) -> tuple[bytes, int, Stopped | None]:
    """Runs the compile; returns (its output, its exit status, what an interrupt stopped or
    None). SIGINT, SIGTERM and SIGHUP stop every process of the compile (stop_compile), a
    signal that comes while the command starts included, and the exit status is then
    128 + the signal's number, as a shell reports a process the signal ended."""
    mark_value = f"{os.getpid()}-{time.time_ns()}"
    mark = f"{COMPILE_ID}={mark_value}".encode()
    client = is_server_client(command)
    received: list[int] = []
    state = {"proc": None, "stopping": False}

    class Interrupted(Exception):
        pass

    def on_signal(signum, _frame):
        received.append(signum)
        if state["proc"] is not None and not state["stopping"]:
            raise Interrupted()  # out of the wait; before Popen returns, checked below

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    output: list[bytes] = []
    reader = None
    try:
        if received:
            raise Interrupted()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, COMPILE_ID: mark_value}, start_new_session=True)
        state["proc"] = proc
        # One reader drains the output (a compile blocked on a full pipe would never end).
        reader = threading.Thread(target=lambda: output.append(proc.stdout.read()), daemon=True)
        reader.start()
        if received:
            raise Interrupted()
        while reader.is_alive():
            reader.join(0.5)
        proc.wait()
        state["stopping"] = True  # the compile is done: a later signal is only noted, its result still written
        return b"".join(output), proc.returncode, None
    except Interrupted:
        state["stopping"] = True
    except OSError as error:
        return f"{command[0] if command else '(no command)'}: {error}\n".encode(), 127, None
    signum = received[0]
    proc = state["proc"]
    if proc is None:
        return b"", 128 + signum, Stopped(signum)
    processes, in_server = stop_compile(proc, mark, signum, client)
    if reader is not None:
        reader.join(5)
    return b"".join(output), 128 + signum, Stopped(signum, processes, in_server)


# --- one build's logs ----------------------------------------------------------------------------

BUILD_TOOLS = ("ninja", "make", "gmake")


def this_build() -> str | None:
    """The build this process belongs to: the pid and start time of the outermost build tool
    (ninja, make) among its ancestors; None when none runs it."""
    found, pid = None, os.getpid()
    for _ in range(16):
        stat = _stat(pid)
        if not stat:
            break
        pid = int(stat[1])
        if pid <= 1:
            break
        if _comm(pid).startswith(BUILD_TOOLS):
            parent_stat = _stat(pid)
            if parent_stat:
                found = f"{pid}:{parent_stat[19]}"
    return found


def start_build_logs(build_dir: str, build: str | None) -> None:
    """Keeps the logs to one build each: the first process of a new build to write to them
    moves the last build's to NAME.1 (replacing the one before), under a lock, so parallel
    compiles of one build rotate once. A process no build tool runs leaves them as they are."""
    if build is None:
        return
    marker = os.path.join(build_dir, LOGS_BUILD)
    try:
        with open(marker, encoding="utf-8") as f:
            if f.read() == build:
                return
    except OSError:
        pass
    try:
        with open(marker + ".lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(marker, encoding="utf-8") as f:
                    if f.read() == build:
                        return
            except OSError:
                pass
            for name in (COMPILE_LOG, EVENTS, PROGRESS_LOG):
                path = os.path.join(build_dir, name)
                if os.path.exists(path):
                    os.replace(path, path + ".1")
            with open(marker + ".tmp", "w", encoding="utf-8") as f:
                f.write(build)
            os.replace(marker + ".tmp", marker)
    except OSError:
        pass  # logs that cannot rotate keep growing; the build goes on


# --- what reaches the console at once -----------------------------------------------------------
# While the progress monitor holds ninja's console, ninja keeps every other command's output
# until the monitor ends: warnings would come at the end, out of order. So what a unit has to
# say goes to the monitor (an event), which prints it at once, in order; when no monitor of this
# build runs (progress off, the monitor ended at a failure), the caller prints it itself. The
# monitor removes RELAY under an exclusive lock once it has printed the last events; a unit
# checks, under a shared lock, that the file is still there and names its build.


def relay(build_dir: str, kind: str, unit: str, text: str) -> bool:
    """Hands `text` to this build's progress monitor as a `kind` event ("output", "note");
    False when no monitor of this build runs."""
    try:
        fd = os.open(os.path.join(build_dir, RELAY), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0 or os.read(fd, 200).decode("ascii", "replace") != this_build():
            return False
        return append_line(os.path.join(build_dir, EVENTS), f"{kind}\t{time.time():.3f}\t{unit}\t{json.dumps(text)}\n")
    except OSError:
        return False
    finally:
        os.close(fd)


# ninja starts the monitor, which holds the console from then on, a moment (seconds on a loaded
# machine: its Python starts) before it opens RELAY: a unit that ended then and printed itself
# had ninja keep its warnings until the monitor ended, after the build's last line. So while a
# monitor of this build runs and has neither opened nor closed RELAY, a unit waits for it
# (at most MONITOR_START_WAIT_S, then it prints itself).
MONITOR_SCRIPT = "progress.build_monitor"  # its module, as the build runs it (vfa_build's entry point)
MONITOR_START_WAIT_S = 120.0


def closed_relay_text(build: str | None) -> str:
    """What RELAY holds once the monitor of `build` has printed its last events."""
    return f"closed {build}"


def _monitor_starting(build_dir: str) -> bool:
    """A progress monitor runs under this unit's ninja and has not closed RELAY for this build."""
    from vfa_build.units.ninja_processes import children, ninja_ancestor  # not at the top: runs once per unit

    try:
        with open(os.path.join(build_dir, RELAY), encoding="ascii", errors="replace") as f:
            if f.read(200) == closed_relay_text(this_build()):
                return False
    except OSError:
        pass
    found = ninja_ancestor(os.getpid())
    if found is None:
        return False
    ninja, own_job = found
    for job in children(ninja):  # ninja runs each command through `sh -c`: its child too
        for pid in (job, *children(job)) if job != own_job else ():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if any(os.path.basename(arg) == MONITOR_SCRIPT.encode() for arg in argv):
                return True
    return False


def hand_over(build_dir: str, kind: str, unit: str, text: str) -> bool:
    """relay(), waiting for a monitor that is starting (above); False: print it yourself."""
    if relay(build_dir, kind, unit, text):
        return True
    deadline = time.monotonic() + MONITOR_START_WAIT_S
    waiting = False
    while time.monotonic() < deadline and _monitor_starting(build_dir):
        if not waiting:  # for the record: how long units wait for the monitor
            append_line(os.path.join(build_dir, EVENTS), f"waiting\t{time.time():.3f}\t{unit}\n")
            waiting = True
        time.sleep(0.05)
        if relay(build_dir, kind, unit, text):
            return True
    return False


def say_now(build_dir: str, text: str) -> None:
    """One line for the console now: through the progress monitor, else on stderr (shown by
    ninja when the command ends)."""
    if not relay(build_dir, "note", "", text):
        sys.stderr.write(f"vendored-flash-attn: {text}\n")
        sys.stderr.flush()


# --- the launcher --------------------------------------------------------------------------------


def compile_unit(build_dir: str, quiet_roots: list[str], command: list[str]) -> int:
    unit = output_of(command).replace("\t", " ").replace("\n", " ")
    events = os.path.join(build_dir, EVENTS)
    start_build_logs(build_dir, this_build())
    start = time.time()
    append_line(events, f"start\t{start:.3f}\t{unit}\n")

    raw, rc, stopped = run_command(command)
    if stopped:
        # ninja drops the output of the commands it interrupts: the line goes to stderr for a
        # launcher run by hand, and as an event to build_monitor.py, which says it on the console.
        line = stopped.line(unit)
        append_log(os.path.join(build_dir, COMPILE_LOG), f"==> {unit}: {line}" + raw.decode("utf-8", "surrogateescape"))
        sys.stderr.write(line)
        sys.stderr.flush()
        append_line(events, f"stopped\t{time.time():.3f}\t{unit}\t{rc}\t{stopped.processes}\t{stopped.in_server}\n")
        return rc
    seconds = time.time() - start
    text = without_env_secrets(raw.decode("utf-8", "surrogateescape"))  # logged and shown without URL passwords

    shown, hidden, notes = text, 0, 0
    log = os.path.join(build_dir, COMPILE_LOG)
    if append_log(log, f"==> {unit}: exit {rc}, {seconds:.1f} s\n{text}"):
        try:
            shown, hidden, notes = sort_output(text, quiet_roots, source_of(command))
        except Exception:  # noqa: BLE001 - a filter bug must not cost the user the output
            shown, hidden, notes = text, 0, 0
    if rc != 0 and hidden + notes:
        shown += (f"({hidden + notes} warnings located in upstream code are not shown here; the whole "
                  f"output of this compile is in {log})\n")
    # A failure's errors go to ninja, which prints them at once: the monitor ends at a failure.
    if shown and (rc != 0 or not hand_over(build_dir, "output", unit, shown)):
        sys.stdout.buffer.write(shown.encode("utf-8", "surrogateescape"))
        sys.stdout.flush()
    append_line(events, f"end\t{time.time():.3f}\t{unit}\t{rc}\t{seconds:.3f}\t{hidden}\t{notes}\n")
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
