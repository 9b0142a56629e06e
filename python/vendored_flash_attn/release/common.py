"""What every wheel check shares: the result a check gives, and what a wheel holds.

The package's name and its build info's member, the wheel's metadata (name, version, tags),
its compiled members, and the declared families (cmake/knobs.json ``families``) as the checks
name them. Standard library only (wheel_check.py is the checks' command line).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Iterable

from ..declaration.families import registry


def components() -> tuple[str, ...]:
    """The declared families (cmake/knobs.json "families"): fa2, fa3, fa4, ..."""
    return registry().names()


def compiled_components() -> tuple[str, ...]:
    """The families whose record is a key of build_info.json (compiled modules)."""
    return tuple(f.name for f in registry() if f.record_key is not None)


PACKAGE = "vendored_flash_attn"
BUILD_INFO = f"{PACKAGE}/build_info.json"
MB = 1024 * 1024


@dataclass
class CheckResult:
    name: str
    ok: bool
    summary: str
    details: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.summary}"]
        lines += [f"    {line}" for line in self.details]
        return "\n".join(lines)


def wheel_metadata(wheel: Path) -> dict[str, str]:
    """Name, version and tags of a wheel, from its .dist-info."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        meta = HeaderParser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        wheel_file = HeaderParser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
    return {"name": meta["Name"], "version": meta["Version"], "tags": wheel_file.get_all("Tag") or []}


def compiled_members(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if n.startswith(f"{PACKAGE}/") and re.search(r"\.so(\.|$)", n))


def human(size: float) -> str:
    return f"{size / MB:.1f} MB"
