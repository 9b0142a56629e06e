"""Where a compile sent to the sccache-dist cluster writes its object: a private temporary,
moved into place only by the unit that still owns it.

The launcher (sccache_launcher.py) bounds the time a unit may wait on the cluster
(dist_bound.py) and then compiles it here. Stopping sccache's client does not stop the
request: the build's sccache server goes on waiting for the cluster, and when the answer
came after the bound it wrote it over the object compiled here, which was then linked
(with VFA_DIST_VERIFY too: the unit compiled here was never verified). So the cluster's
compile is given an output of its own,

    <object's folder>/.vfa-dist-XXXXXXXX/<object's name>     (a 0700 folder, mkdtemp)

and only the launcher that still waits for it moves it into place (os.replace, after
dist_trust.py's check), whatever sccache does later. A unit that stopped waiting
(its bound, sccache's own fallback, an interrupt) abandons the folder: listed in
ABANDONED, it is where a late answer lands, and the end of the build (discard_late,
from sccache_build_report.py) removes it, with one line for each answer that came.
The object's name is kept (sccache's log names a unit by it: dist_bound.silent_fallback),
and nothing else of the command changes: sccache's cache key and the object's bytes do
not depend on the -o path (the same hit and bytes for two paths, with gcc and nvcc), and
the dependency file keeps naming the object through its -MT.

Standard library only (the launcher runs once per unit, as `python -E -s -S`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

ABANDONED = "vfa-dist-abandoned.tsv"  # <time> TAB <unit> TAB <private folder>, one line per abandoned unit
PREFIX = ".vfa-dist-"


def private_output(obj: str) -> str:
    """A new 0700 folder beside <obj> and the path <obj> takes in it."""
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=os.path.dirname(obj) or ".")
    return os.path.join(folder, os.path.basename(obj))


def with_output(command: list[str], output: str) -> list[str]:
    """<command> writing its object (its last -o) to <output>; everything else as it was."""
    changed = list(command)
    for i in range(len(changed) - 2, -1, -1):
        if changed[i] == "-o":
            changed[i + 1] = output
            return changed
    return changed


def claim(private: str, obj: str) -> bool:
    """The object the cluster returned into place (atomic); its folder removed. False when the
    compile wrote none."""
    try:
        os.replace(private, obj)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(os.path.dirname(private), ignore_errors=True)


def drop(private: str) -> None:
    """The private folder of a compile that answered (a failure): nothing of it lands."""
    shutil.rmtree(os.path.dirname(private), ignore_errors=True)


def abandon(build_dir: str, unit: str, private: str) -> None:
    """The unit stopped waiting for the cluster: its folder stays (a late answer lands there,
    never on the object) until the end of the build discards it."""
    line = f"{time.time():.3f}\t{unit}\t{os.path.abspath(os.path.dirname(private))}\n"
    try:
        fd = os.open(os.path.join(build_dir, ABANDONED), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "surrogateescape"))  # one write: parallel units never interleave
        finally:
            os.close(fd)
    except OSError:
        drop(private)  # unrecorded: removed now (a late answer then finds no folder to write into)


def discard_late(build_dir: str) -> list[str]:
    """Removes every abandoned folder of this build dir; returns the units whose late answer
    had come (a file in their folder). Folders left by a build that crashed are swept too."""
    late: list[str] = []
    path = Path(build_dir) / ABANDONED
    try:
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 3 or not os.path.basename(parts[2]).startswith(PREFIX):
            continue
        folder = Path(parts[2])
        if folder.is_dir() and any(folder.iterdir()):
            late.append(parts[1])
        shutil.rmtree(folder, ignore_errors=True)
    path.unlink(missing_ok=True)
    return late
