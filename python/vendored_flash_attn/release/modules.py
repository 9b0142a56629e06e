"""Wheel checks of the wheel file and its compiled modules: size, symbols, abi3, cxx-runtime.

* size: the wheel file is at most the limit (``--max-mb``, else ``VFA_WHEEL_MAX_MB``,
  else 400 MB), and its sha256 (wheels are reproducible); on failure it lists the
  largest members.
* symbols: every compiled module of the wheel loads (``dlopen`` with ``RTLD_NOW``,
  after ``import torch``) with no undefined symbol, and imports as a Python module.
* abi3: the wheel is tagged ``cp3X-abi3``, every module is named ``*.abi3.so``, and
  ``abi3audit --strict`` finds no violation.
* cxx-runtime: no module defines the C++ exception runtime itself (``__cxa_throw``,
  ``__cxa_allocate_exception``): a module with a private static libstdc++ kills the
  process on any C++ exception inside an op instead of raising (measured on the H200
  machine). Reads the modules' dynamic symbols with pyelftools (abi3audit's dependency).

A wheel whose build info says no compiled family was built (a wheel of FA4 alone) may hold
no module (build_info_check.modules_expected). No GPU needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional, Sequence

from .build_info_check import modules_expected
from .common import MB, CheckResult, compiled_members, human, wheel_metadata

DEFAULT_MAX_MB = 400.0
ENV_MAX_MB = "VFA_WHEEL_MAX_MB"


# --- size ----------------------------------------------------------------------

def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_size(wheel: Path, max_mb: Optional[float] = None, top: int = 10) -> CheckResult:
    if max_mb is None:
        max_mb = float(os.environ.get(ENV_MAX_MB) or DEFAULT_MAX_MB)
    size = wheel.stat().st_size
    limit = int(max_mb * MB)
    with zipfile.ZipFile(wheel) as zf:
        infos = sorted(zf.infolist(), key=lambda i: i.compress_size, reverse=True)
    largest = [f"{human(i.compress_size):>10} compressed {human(i.file_size):>10} unpacked  {i.filename}"
               for i in infos[:top]]
    # The digest of a reproducible wheel (docs/build.md, "What a build records"): a rebuild of the
    # same inputs anywhere gives the same one, so a published wheel can be checked against it.
    summary = f"{wheel.name} is {human(size)} (limit {max_mb:g} MB), sha256 {file_sha256(wheel)}"
    if size <= limit:
        return CheckResult("size", True, summary)
    return CheckResult("size", False, summary + f"; over by {human(size - limit)}. Largest members:", largest)


# --- symbols -------------------------------------------------------------------

_LOAD_SCRIPT = r"""
import ctypes, importlib, json, os, sys
root, modules = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, root)
results = {}
try:
    import torch  # the modules resolve libtorch/libc10 symbols through torch's libraries
except Exception as exc:
    print(json.dumps({"__torch__": f"import torch failed: {exc!r}"}))
    sys.exit(0)
for rel in modules:
    path = os.path.join(root, rel)
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        name = rel[:-len(".so")].split(".")[0].replace("/", ".")
        importlib.import_module(name)
        results[rel] = None
    except Exception as exc:
        results[rel] = f"{type(exc).__name__}: {exc}"
print(json.dumps(results))
"""


def _load_modules(root: Path, members: Sequence[str], python: str) -> dict[str, Optional[str]]:
    proc = subprocess.run([python, "-c", _LOAD_SCRIPT, str(root), json.dumps(list(members))],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONNOUSERSITE": "1"})
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"__python__": f"the loader exited with {proc.returncode}: {proc.stderr[-2000:]}"}


def check_symbols(wheel: Path, python: str = sys.executable) -> CheckResult:
    with tempfile.TemporaryDirectory(prefix="vfa-wheel-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            members = compiled_members(zf.namelist())
            zf.extractall(tmp)
            expected = modules_expected(zf.namelist(), zf.read)
        if not members:
            if not expected:
                return CheckResult("symbols", True, f"{wheel.name} holds no compiled module, as its build info "
                                   "says (no compiled family built; a family of Python kernels is packaged)")
            return CheckResult("symbols", False, f"{wheel.name} holds no compiled module")
        results = _load_modules(Path(tmp), members, python)
    return symbols_result(members, results)


def symbols_result(members: Sequence[str], results: dict[str, Optional[str]]) -> CheckResult:
    failed = {k: v for k, v in results.items() if v}
    missing = [m for m in members if m not in results]
    if failed or missing:
        details = [f"{k}: {v}" for k, v in failed.items()] + [f"{m}: not checked" for m in missing]
        return CheckResult("symbols", False, "modules that do not load (undefined symbols?):", details)
    return CheckResult("symbols", True, f"{len(members)} modules load with every symbol resolved: "
                       + ", ".join(Path(m).name for m in members))


# --- cxx-runtime -----------------------------------------------------------------

# Defined only by a C++ runtime itself; a module that defines them carries its own.
_CXX_RUNTIME_SYMBOLS = ("__cxa_throw", "__cxa_allocate_exception")


def private_cxx_runtime(module: Path) -> list[str]:
    """The C++ exception-runtime symbols ``module`` defines (empty: it uses the shared one)."""
    from elftools.elf.elffile import ELFFile

    with open(module, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        if dynsym is None:
            return []
        return sorted({sym.name for sym in dynsym.iter_symbols()
                       if sym.name in _CXX_RUNTIME_SYMBOLS and sym["st_shndx"] != "SHN_UNDEF"})


def check_cxx_runtime(wheel: Path) -> CheckResult:
    try:
        import elftools  # noqa: F401
    except ImportError:
        return CheckResult("cxx-runtime", False, "pyelftools is not installed (pip install pyelftools)")
    with tempfile.TemporaryDirectory(prefix="vfa-wheel-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            members = compiled_members(zf.namelist())
            zf.extractall(tmp)
        private = {m: private_cxx_runtime(Path(tmp) / m) for m in members}
    bad = {m: syms for m, syms in private.items() if syms}
    if bad:
        return CheckResult(
            "cxx-runtime", False,
            "modules with their own static libstdc++ (a C++ exception inside an op kills the "
            "process); rebuild with a compiler that has the shared libstdc++:",
            [f"{m}: defines {', '.join(syms)}" for m, syms in bad.items()])
    return CheckResult("cxx-runtime", True, f"{len(members)} modules use the shared C++ runtime")


# --- abi3 ----------------------------------------------------------------------

def _abi3audit_command() -> list[str]:
    exe = Path(sys.executable).parent / "abi3audit"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("abi3audit")
    return [found] if found else [sys.executable, "-m", "abi3audit"]


def check_abi3(wheel: Path, min_python: str = "3.10") -> CheckResult:
    details: list[str] = []
    tags = wheel_metadata(wheel)["tags"]
    want_py = "cp" + min_python.replace(".", "")
    bad_tags = [t for t in tags if not re.fullmatch(rf"{want_py}-abi3-(manylinux|linux)_\w+", t)]
    if not tags or bad_tags:
        details.append(f"wheel tags {tags}: expected {want_py}-abi3-<platform> only")
    with zipfile.ZipFile(wheel) as zf:
        members = compiled_members(zf.namelist())
        expected = modules_expected(zf.namelist(), zf.read)
    not_abi3 = [m for m in members if not m.endswith(".abi3.so")]
    if not_abi3:
        details.append(f"modules not named *.abi3.so: {not_abi3}")
    if not members and expected:
        details.append("no compiled module in the wheel")
    proc = subprocess.run([*_abi3audit_command(), "--strict", "--report", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    report: dict[str, Any] = {}
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pass
    if proc.returncode != 0:
        details.append(f"abi3audit --strict failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    else:
        for spec in report.get("specs", {}).values():
            for so in spec.get("wheel", []) if isinstance(spec.get("wheel"), list) else []:
                result = so.get("result", {})
                if result.get("non_abi3_symbols") or not result.get("is_abi3", True) \
                        or not result.get("is_abi3_baseline_compatible", True):
                    details.append(f"abi3audit: {so.get('name')}: {result}")
    if details:
        return CheckResult("abi3", False, f"{wheel.name} is not a clean abi3 wheel:", details)
    return CheckResult("abi3", True, f"tags {', '.join(tags)}; {len(members)} *.abi3.so modules; abi3audit --strict clean")
