"""The CUDA architectures the build knows, as ``cmake/knobs.json``'s ``cuda_archs`` section
declares them once: compute capability -> the code a GPU of that capability loads (its SASS
target, its arch-specific ``a`` target, its PTX target) and the first nvcc that makes it,
plus the names ``TORCH_CUDA_ARCH_LIST`` may use instead of capabilities (PyTorch's named
archs). cmake/CudaArchs.cmake reads the same table for every -gencode flag and every DSL
target; the families' validator (families.problems) checks it and each family's ``archs``
against it; the selector asks ``runs_on`` whether a wheel's compiled code runs on the GPU.

Which code runs where (CUDA C++ Programming Guide, "Compute Capabilities", Feature
Availability; the nvcc manual, "GPU Feature List"):

* ``sm_XY`` SASS runs on compute capability X.Z for every Z >= Y (same major);
* ``sm_XYa``, arch-specific, runs on X.Y only: not on a later minor of the same major
  (``sm_100a`` does not load on a 10.3 GPU) and not on another major;
* ``compute_XY`` PTX runs on X.Y and every newer GPU, compiled by the driver at load time.

Standard library only: the configure runs the validator with ``python -E -s -S``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

#: a compute capability as the declaration writes it: "9.0", "10.3" (major, one-digit minor)
CAPABILITY = re.compile(r"([1-9][0-9]*)\.([0-9])")
_NVCC = re.compile(r"[1-9][0-9]*\.[0-9]+")
ROW_FIELDS = {"sass", "a", "ptx", "nvcc", "a_nvcc"}


def capability(text: str) -> tuple[int, int]:
    """"10.3" -> (10, 3)."""
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True)
class Row:
    """One compute capability's targets."""

    capability: tuple[int, int]
    sass: str
    ptx: str
    nvcc: str
    a: str = ""
    a_nvcc: str = ""

    @property
    def text(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


@dataclass(frozen=True)
class Table:
    """The declared rows by capability text ("9.0"), and the named archs."""

    rows: dict[str, Row]
    names: dict[str, tuple[str, ...]]

    def capabilities(self, arch_list: str) -> list[tuple[int, int]]:
        """The GPUs a recorded ``TORCH_CUDA_ARCH_LIST`` names, as cmake/CudaArchs.cmake reads
        it (entries split by ';', ',' or spaces; a name of the table for its capabilities; a
        "+PTX" or an "a"/"f" suffix does not change the capability):
          "8.0;9.0a Blackwell+PTX" -> [(8, 0), (9, 0), (10, 0), (10, 3)] (with the declared names)"""
        found: list[tuple[int, int]] = []
        for entry in re.split(r"[;,\s]+", arch_list.strip()):
            entry = entry.strip()
            if entry.upper().endswith("+PTX"):
                entry = entry[:-4]
            if not entry:
                continue
            texts = self.names.get(entry.lower(), (entry.rstrip("af"),))
            for text in texts:
                try:
                    cap = capability(str(text))
                except ValueError:
                    continue
                if cap not in found:
                    found.append(cap)
        return found

    def code(self, target: str) -> Optional[tuple[Row, str]]:
        """(row, kind) of a target name ("sm_90a" -> (9.0's row, "a")); None when no row has it."""
        for row in self.rows.values():
            for kind in ("sass", "a", "ptx"):
                if getattr(row, kind) == target:
                    return row, kind
        return None

    def runs_on(self, targets: Iterable[str], major: int, minor: int) -> Optional[bool]:
        """Whether code compiled for ``targets`` runs on a GPU of compute capability
        major.minor; None when no target is a row's (the table cannot say)."""
        known = [found for found in map(self.code, targets) if found is not None]
        if not known:
            return None
        for row, kind in known:
            cap_major, cap_minor = row.capability
            if kind == "a" and (major, minor) == row.capability:
                return True
            if kind == "sass" and major == cap_major and minor >= cap_minor:
                return True
            if kind == "ptx" and (major, minor) >= row.capability:
                return True
        return False


def problems(data: Any) -> list[str]:
    """Every mistake of the ``cuda_archs`` section, each naming the field and the fix."""
    section = data.get("cuda_archs") if isinstance(data, dict) else None
    where = "cuda_archs"
    if not isinstance(section, dict) or not isinstance(section.get("table"), dict):
        return [f'cmake/knobs.json has no "{where}" section with a "table" of compute capabilities: restore it '
                'from the repository']
    found = []
    for key, row in section["table"].items():
        at = f"{where}.table.{key}"
        match = CAPABILITY.fullmatch(str(key))
        if not match:
            found.append(f"{at}: the key must be a compute capability such as \"9.0\"")
            continue
        digits = match.group(1) + match.group(2)
        if not isinstance(row, dict) or row.keys() - ROW_FIELDS or not {"sass", "ptx", "nvcc"} <= row.keys():
            found.append(f"{at} must be an object of sass, ptx, nvcc and optionally a, a_nvcc, got {row!r}")
            continue
        # The names follow the capability: a row whose target names another capability (10.3 ->
        # sm_100a) would compile code a GPU of that capability never loads.
        for field, name in (("sass", f"sm_{digits}"), ("ptx", f"compute_{digits}"), ("a", f"sm_{digits}a")):
            if field in row and row[field] != name:
                found.append(f"{at}.{field} is {row[field]!r}, but compute capability {key}'s {field} target is "
                             f"{name!r} (nvcc's names hold the capability): fix the name, or the key")
        for field in ("nvcc", "a_nvcc"):
            if field in row and not (isinstance(row[field], str) and _NVCC.fullmatch(row[field])):
                found.append(f"{at}.{field} must be an nvcc version such as \"12.8\", got {row[field]!r}")
        if "a_nvcc" in row and "a" not in row:
            found.append(f"{at}.a_nvcc is given without an a target: remove it, or add a")
    keys = [cap for cap in section["table"] if CAPABILITY.fullmatch(str(cap))]
    if keys != sorted(keys, key=capability):
        found.append(f"{where}.table: list the rows in ascending order (a reader sees the table as the "
                     f"build uses it), got {', '.join(keys)}")
    names = section.get("names", {})
    if not isinstance(names, dict) or not all(isinstance(v, list) and v and all(c in section["table"] for c in v)
                                              for v in names.values()):
        found.append(f"{where}.names must map each name to a list of capabilities of the table "
                     f"({', '.join(section['table'])}), got {names!r}")
    return found


def parse(data: dict) -> Table:
    """The table of a declaration ``problems`` found no fault in."""
    section = data["cuda_archs"]
    rows = {key: Row(capability=capability(key), sass=row["sass"], ptx=row["ptx"], nvcc=row["nvcc"],
                     a=row.get("a", ""), a_nvcc=row.get("a_nvcc", row.get("nvcc", "")) if "a" in row else "")
            for key, row in section["table"].items()}
    names = {name.lower(): tuple(caps) for name, caps in section.get("names", {}).items()}
    return Table(rows, names)
