"""FA4's staging step: upstream's ``flash_attn/cute`` copied into our package, and FA4's build record.

``stage`` copies the pinned ``flash_attn/cute`` sources into ``<dest>/<package path>`` and
rewrites their absolute ``flash_attn.cute`` imports to our subpackage
(``vendored_flash_attn._fa4.cute``), so the copy never shadows, and is never shadowed by, a
real ``flash_attn`` install; it refuses a pin whose dependencies differ from the ``fa4`` extra.
The build record (``_fa4/build_info.json`` in the stage) holds what CMake knew at configure
time and what the stage made; each ``compile`` run (an arch, a Python) is added to it. Needs
nothing but the standard library (+ packaging, through fa4_deps). Used by cmake/vfa_build/fa4/precompile.py.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

from vendored_flash_attn.families.fa4 import deps as fa4_deps

# Where the staged copy lives inside our package, and how its sources refer to themselves.
UPSTREAM_PACKAGE = "flash_attn.cute"
VENDORED_PACKAGE = "vendored_flash_attn._fa4.cute"

# An absolute reference to upstream's package in code: `flash_attn.cute` followed by the end
# of the dotted name or a submodule. Not preceded by a name character or a dot, so
# `vendored_flash_attn.cute` or `x.flash_attn.cute` are left alone.
_UPSTREAM_REFERENCE = re.compile(r"(?<![\w.])flash_attn\.cute(?![\w])")

# Files of the cute directory that are not part of the importable package but must ship
# (the licence and its authors) or document it; every *.py file ships, because upstream's
# cache fingerprint hashes all of them and the precompiled kernels must match the copy.
_SHIPPED_NON_PYTHON = ("LICENSE", "AUTHORS", "README.md")


def rewrite_imports(source: str, package: str = VENDORED_PACKAGE) -> str:
    """``source`` with every absolute reference to ``flash_attn.cute`` pointed at ``package``."""
    return _UPSTREAM_REFERENCE.sub(package, source)


def remaining_upstream_references(source: str) -> list[str]:
    """Lines of code (not comments) that still name upstream's package after a rewrite."""
    found = []
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _UPSTREAM_REFERENCE.search(code):
            found.append(line.strip())
    return found


def stage(cute_src: Path, dest: Path, package: str = VENDORED_PACKAGE) -> dict:
    """Copy ``cute_src`` (upstream's flash_attn/cute) to ``dest/<package as path>``, rewritten.

    ``dest`` becomes an import root: the parents of the package get an empty ``__init__.py``
    where they have none (the wheel build puts the copy inside our real package instead).
    Returns a summary: files, bytes, and the files whose imports were rewritten.
    """
    if not (cute_src / "__init__.py").is_file() or not (cute_src / "interface.py").is_file():
        raise SystemExit(f"{cute_src} is not upstream's flash_attn/cute (no __init__.py / interface.py)")
    # The fa4 extra must still be what this upstream declares: a pin bump that changes
    # flash_attn/cute's dependencies stops here, naming the difference, not at run time.
    pin_pyproject = cute_src / "pyproject.toml"
    if not pin_pyproject.is_file():
        raise SystemExit(f"{pin_pyproject} is missing: cannot check the fa4 extra against the pin")
    drift = fa4_deps.pin_drift(pin_pyproject.read_text(encoding="utf-8"))
    if drift:
        raise SystemExit(f"the fa4 extra in pyproject.toml differs from {pin_pyproject}: " + "; ".join(drift)
                         + ". Update the extra to the pin's dependencies (see fa4/deps.py).")
    target = dest.joinpath(*package.split("."))
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for parent in itertools.islice(target.parents, len(package.split(".")) - 1):
        init = parent / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")
    rewritten, files, size = [], 0, 0
    for src in sorted(cute_src.rglob("*")):
        rel = src.relative_to(cute_src)
        if src.is_dir() or "__pycache__" in rel.parts:
            continue
        if src.suffix != ".py" and rel.as_posix() not in _SHIPPED_NON_PYTHON:
            continue
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".py":
            text = src.read_text(encoding="utf-8")
            new = rewrite_imports(text, package)
            left = remaining_upstream_references(new)
            if left:
                raise SystemExit(f"{rel}: still refers to {UPSTREAM_PACKAGE} after the rewrite: {left[0]}")
            if new != text:
                rewritten.append(rel.as_posix())
            out.write_text(new, encoding="utf-8")
        else:
            shutil.copyfile(src, out)
        files += 1
        size += out.stat().st_size
    return {"package": package, "path": str(target), "files": files, "bytes": size, "rewritten": rewritten}


RECORD_FILE = "build_info.json"  # inside the staged _fa4 package: FA4's part of the build info
RECORD_SCHEMA = 1


def record_path(dest: Path, package: str = VENDORED_PACKAGE) -> Path:
    """FA4's build record in a stage: beside the staged package (``vendored_flash_attn/_fa4``)."""
    return dest.joinpath(*package.split(".")[:-1]) / RECORD_FILE


def write_record(dest: Path, configure: dict, summary: dict, package: str = VENDORED_PACKAGE) -> Path:
    """FA4's build record: what CMake knew at configure time (the sources' commit and whether
    they were verified against the pin, the precompile mode) and what the stage made."""
    record = {"schema": RECORD_SCHEMA, "package": package, **configure,
              "staged": {"files": summary["files"], "bytes": summary["bytes"],
                         "rewritten": len(summary["rewritten"])}}
    record.setdefault("precompile", {}).setdefault("runs", [])
    path = record_path(dest, package)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def add_precompile_run(record: Path, run: dict) -> None:
    """Append one ``compile`` run (an arch) to a stage's build record."""
    data = json.loads(record.read_text(encoding="utf-8"))
    data.setdefault("precompile", {}).setdefault("runs", []).append(run)
    record.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def portable(text: str) -> str:
    """``text`` (an error message) with every absolute path cut to its last part: FA4's
    build record ships in the wheel, whose bytes must not depend on where this machine keeps
    its Python, its temporary build environment (pip's isolation) or the build dir."""
    return re.sub(r"(?<![\w.~])/(?:[^\s/'\":]+/)+(?=[^\s/'\":])", ".../", text)
