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
        """The GPUs a recorded ``TORCH_CUDA_ARCH_LIST`` names, by the one parser the build also
        uses (parse_arch_list; ArchListError when it does not parse):
          "8.0;9.0a Blackwell" -> [(8, 0), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]"""
        return [capability(arch) for arch in parse_arch_list(arch_list, self.names).archs]

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


class ArchListError(ValueError):
    """A TORCH_CUDA_ARCH_LIST that names something other than GPUs, said with the fix."""


@dataclass(frozen=True)
class ArchList:
    """A parsed TORCH_CUDA_ARCH_LIST: its capabilities ("8.0", in order, each once), those asked
    for with +PTX, and each name it used with its meaning ("Hopper = 9.0+PTX", for messages)."""

    archs: tuple[str, ...]
    ptx: tuple[str, ...]
    named: tuple[str, ...] = ()


#: one entry of the list: a capability, an optional a/f suffix, an optional +PTX (any case)
_ENTRY = re.compile(r"([0-9]+)\.([0-9]+)([af]?)(\+ptx)?", re.IGNORECASE)
_SEPARATORS = re.compile(r"[;,\s]+")


def _names_text(names: dict[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{name.capitalize()} = {';'.join(entries)}" for name, entries in names.items())


def parse_arch_list(text: str, names: dict[str, tuple[str, ...]]) -> ArchList:
    """The one reader of TORCH_CUDA_ARCH_LIST: the build's (cmake/CudaArchTable.cmake runs
    ``python -m vendored_flash_attn.declaration.cuda_archs parse``) and the package's (Table.capabilities).

    Entries are separated by ';', ',' or white space. An entry is a compute capability as torch
    writes it (major.minor, one digit of minor, no leading zero: "9.0"; "09.0" and "9.00" are
    refused, naming "9.0": torch's own reader would make another target of them), with an
    optional "a"/"f" suffix (same capability) and "+PTX" (PTX of it asked for); or a name of
    ``names`` (any case), which means what it means to PyTorch, its "+PTX" included ("Hopper"
    is "9.0+PTX"): the build then honours or refuses that PTX as if it were written out. A name
    with "+PTX" ("Blackwell+PTX") is refused, as torch refuses it: the name carries its own.
    ``names``: {lower-case name: entries}, entries such as "9.0" or "9.0+PTX"."""
    archs: list[str] = []
    ptx: list[str] = []
    named: list[str] = []
    known = _names_text(names)
    for token in (t for t in _SEPARATORS.split(str(text).strip()) if t):
        lower = token.lower()
        if lower in names:
            named.append(f"{token} = {';'.join(names[lower])}")
            entries = names[lower]
        elif lower.endswith("+ptx") and lower[:-4] in names:
            base = lower[:-4]
            raise ArchListError(
                f"TORCH_CUDA_ARCH_LIST: '{token}' adds +PTX to a name, which already says its PTX: "
                f"{token[:-4]} is PyTorch's {';'.join(names[base])} (torch refuses '{token}' too). Write the "
                f"capabilities instead, with +PTX where you want PTX (such as "
                f"{';'.join(e.split('+')[0] for e in names[base])})")
        else:
            entries = (token,)
        for entry in entries:
            match = _ENTRY.fullmatch(entry)
            if not match:
                raise ArchListError(
                    f"TORCH_CUDA_ARCH_LIST: '{token}' is not an architecture. Use compute capabilities such as "
                    f"\"8.0;9.0\" (also 9.0a, 8.0+PTX) or a name with PyTorch's meaning: {known}.")
            major, minor = match.group(1), match.group(2)
            if not CAPABILITY.fullmatch(f"{major}.{minor}"):
                fix = f"{int(major)}.{int(minor)}" if int(major) and int(minor) < 10 else "major.minor"
                raise ArchListError(
                    f"TORCH_CUDA_ARCH_LIST: '{token}' is not a compute capability as torch writes one: write "
                    f"{fix}{match.group(3)}{match.group(4) or ''} (major.minor, one digit of minor, no leading zero; "
                    f"torch's own reader would make another target of '{token}')")
            cap = f"{major}.{minor}"
            if cap not in archs:
                archs.append(cap)
            if match.group(4) and cap not in ptx:
                ptx.append(cap)
    if not archs:
        raise ArchListError(
            f"TORCH_CUDA_ARCH_LIST='{text}' names no architecture. Give the GPUs to build for as compute "
            f"capabilities separated by ';' (such as \"8.0;9.0\", the default when it is not set), or a name "
            f"with PyTorch's meaning: {known}.")
    return ArchList(tuple(archs), tuple(ptx), tuple(named))


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
    entry_ok = lambda e: (isinstance(e, str) and _ENTRY.fullmatch(e) and not _ENTRY.fullmatch(e).group(3)  # noqa: E731
                          and e.split("+")[0] in section["table"] and e in (e.split("+")[0], e.split("+")[0] + "+PTX"))
    if not isinstance(names, dict) or not all(isinstance(v, list) and v and all(map(entry_ok, v))
                                              for v in names.values()):
        found.append(f"{where}.names must map each name to PyTorch's list for it: capabilities of the table "
                     f"({', '.join(section['table'])}), each optionally with +PTX, got {names!r}")
    elif not all(re.fullmatch(r"[A-Za-z]+", n) for n in names):
        found.append(f"{where}.names: a name is letters only (it is a word of TORCH_CUDA_ARCH_LIST), got "
                     f"{', '.join(names)}")
    return found


def parse(data: dict) -> Table:
    """The table of a declaration ``problems`` found no fault in."""
    section = data["cuda_archs"]
    rows = {key: Row(capability=capability(key), sass=row["sass"], ptx=row["ptx"], nvcc=row["nvcc"],
                     a=row.get("a", ""), a_nvcc=row.get("a_nvcc", row.get("nvcc", "")) if "a" in row else "")
            for key, row in section["table"].items()}
    names = {name.lower(): tuple(caps) for name, caps in section.get("names", {}).items()}
    return Table(rows, names)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m vendored_flash_attn.declaration.cuda_archs parse DECLARATION.json TEXT``: the build's
    reading of TORCH_CUDA_ARCH_LIST (cmake/CudaArchTable.cmake), as three lines "archs <caps>",
    "ptx <caps>" (';'-separated) and "named <name = entries>, ..."; exit 1 with the message when
    the list does not parse (or the declaration's arch table has a mistake)."""
    import sys

    from .json_types import declaration_command

    read = declaration_command(sys.argv[1:] if argv is None else argv, "vendored_flash_attn.declaration.cuda_archs",
                               "parse", ("TEXT",), errors=sys.stdout)
    if isinstance(read, int):
        return read
    args, data = read
    found = problems(data)
    if found:
        print("; ".join(found))
        return 1
    try:
        parsed = parse_arch_list(args[2], parse(data).names)
    except ArchListError as error:
        print(error)
        return 1
    print("archs " + ";".join(parsed.archs))
    print("ptx " + ";".join(parsed.ptx))
    print("named " + ", ".join(parsed.named))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
