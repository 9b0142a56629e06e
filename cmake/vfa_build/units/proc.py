"""A process as Linux's /proc shows it: its stat fields and its command name, read the same way
by the compile launcher (compile_unit.py) and by what reads ninja's processes (ninja_processes.py).
Standard library only: the launcher runs once per unit."""

from __future__ import annotations


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, ...]."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
        return text[text.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""
