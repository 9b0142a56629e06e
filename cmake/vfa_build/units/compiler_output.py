"""Split a compiler's output into diagnostics and pick out upstream noise.

Used by compile_unit.py (the compile launcher) at build time; stdlib only.

A build of the pinned upstream prints ~100 warnings per build that no user can act on,
most of them gcc's `'long4' is deprecated` for CUTLASS's use of the CUDA 13 vector
types. They bury the lines that matter (progress, our own warnings, errors). This
module groups gcc/clang and nvcc/cudafe++ output into diagnostics (a warning with its
"In file included from" / "In instantiation of" context before it and its source
excerpt and "note:" lines after it) and marks as noise exactly one kind: a *warning*
whose location is inside one of the given source trees (the pinned upstream and
CUTLASS). Errors are never noise, wherever they are; warnings elsewhere (our generated
sources, torch, the CUDA toolkit, the command line, ptxas) are never noise. Anything
the grouping does not recognise stays shown. One more kind is noise when the unit compiled
is itself upstream code: ptxas's "(C7514) Potential Performance Loss: wgmma.mma_async
instructions are serialized" note, which the FP8 kernels with two-level accumulation get
(upstream's own trade of speed for accuracy, expected): 38 such lines ended every build,
cached or not. ptxas names a function, not a file, so the unit's source decides.

Example (gcc, the upstream CUTLASS tree at /src/cutlass):

    In file included from /src/cutlass/include/cutlass/numeric_types.h:40,
                     from /src/fa/hopper/flash_api.cpp:32:
    /src/cutlass/include/cutlass/platform/platform.h:599:21: warning: 'long4' is deprecated [...]
      599 | struct alignment_of<long4> {
    /usr/local/cuda/include/vector_types.h:532:98: note: declared here
    /src/fa/hopper/flash_api.cpp:10:3: error: 'x' was not declared in this scope

is two diagnostics: the warning (5 lines, noise) and the error (shown).
"""

from __future__ import annotations

import os
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# gcc/clang: "path:line[:col]: severity: ..."; nvcc/cudafe++: "path(line): severity ...".
_HEADER = re.compile(
    r"^(?P<path>[^\s:(][^:(]*?)(?::\d+(?::\d+)?:|\(\d+\):)\s+"
    r"(?P<severity>fatal error|error|warning|note|remark)\b")
# Lines that say where the next diagnostic comes from; they belong to what follows.
_CONTEXT = (
    re.compile(r"^In file included from "),
    re.compile(r"^\s+from \S.*[:,]$"),
    re.compile(r"^\S[^:]*: (In |At global scope)"),
    re.compile(r"^\S.*:\d+(:\d+)?:\s+(recursively )?required (from|by) "),
)
# ptxas's note on upstream's FP8 kernels (see the top of this file).
_UPSTREAM_PTXAS_NOTE = re.compile(
    r"^ptxas info\s*:\s*\(C7514\) Potential Performance Loss: wgmma\.mma_async instructions are serialized")
# Lines that continue the diagnostic above: source excerpts, carets, cudafe++'s
# "detected during" (all indented), blank lines, and cudafe++'s closing remark.
# Any other line at the left margin (a tool's own message such as "cc1plus: warning:
# ..." or "ptxas error : ...") starts a group of its own, which is always shown.
_CONTINUATION = re.compile(r"^(\s|$|Remark: The warnings can be suppressed)")


class Diagnostic:
    """Consecutive output lines that belong together; `severity` is None for lines
    outside any recognised diagnostic (tool banners, linker messages, ...). A plain
    class: this runs once per compile, and importing dataclasses costs more than it."""
    __slots__ = ("lines", "severity", "path")

    def __init__(self, lines=None, severity: str | None = None, path: str | None = None):
        self.lines: list[str] = lines if lines is not None else []
        self.severity, self.path = severity, path

    def is_noise(self, quiet_roots: list[str]) -> bool:
        if self.severity != "warning" or not self.path:
            return False
        return _under(self.path, quiet_roots)

    def is_upstream_ptxas_note(self) -> bool:
        lines = [_ANSI.sub("", line).strip() for line in self.lines]
        lines = [line for line in lines if line]
        return self.severity is None and bool(lines) and all(map(_UPSTREAM_PTXAS_NOTE.match, lines))


def _under(path: str, roots: list[str]) -> bool:
    path = os.path.normpath(os.path.join(os.getcwd(), path))  # relative: to the compile's folder
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def normalise_roots(roots) -> list[str]:
    """The trees as given and as resolved (a source cache reached through a symlink)."""
    out = []
    for root in roots:
        for candidate in (os.path.normpath(root), os.path.realpath(root)):
            if candidate not in out and candidate != os.sep:
                out.append(candidate)
    return out


def split_diagnostics(text: str) -> list[Diagnostic]:
    """Group output lines (newlines kept) into diagnostics, in order."""
    groups: list[Diagnostic] = []
    context: list[str] = []  # context lines waiting for the diagnostic they introduce
    current = Diagnostic()
    for line in text.splitlines(keepends=True):
        plain = _ANSI.sub("", line).rstrip("\r\n")
        if any(p.match(plain) for p in _CONTEXT):
            context.append(line)
            continue
        header = _HEADER.match(plain)
        if header and header.group("severity") == "note" and current.severity is not None:
            # A note (and the include chain printed for it) explains the diagnostic before it.
            current.lines += context + [line]
            context = []
            continue
        if header:
            groups.append(current)
            current = Diagnostic(context + [line], header.group("severity"), header.group("path"))
            context = []
            continue
        if context or not _CONTINUATION.match(plain):
            # Context that introduced no diagnostic, or a line of unknown kind: a group
            # of its own (shown).
            groups.append(current)
            current = Diagnostic(context)
            context = []
        current.lines.append(line)
    groups.append(current)
    if context:
        groups.append(Diagnostic(context))
    return [g for g in groups if g.lines]


def sort_output(text: str, quiet_roots, source: str | None = None) -> tuple[str, int, int]:
    """(the output without the warnings located under `quiet_roots` and their context,
    and, when the compiled `source` is under them, without ptxas's C7514 notes; how many
    compiler warnings that left out; how many ptxas notes)."""
    roots = normalise_roots(quiet_roots)
    upstream_unit = bool(source) and _under(source, roots)
    shown, warnings, notes = [], 0, 0
    for diagnostic in split_diagnostics(text):
        if diagnostic.is_noise(roots):
            warnings += 1
        elif upstream_unit and diagnostic.is_upstream_ptxas_note():
            notes += 1
        else:
            shown += diagnostic.lines
    return "".join(shown), warnings, notes

