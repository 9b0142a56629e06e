"""Release checks for a built wheel (or an installed package).

    python -m vendored_flash_attn.wheel_check all WHEEL [--max-mb N] [--pin PIN] [--cuda-major N] ...
    python -m vendored_flash_attn.wheel_check size WHEEL --max-mb N
    python -m vendored_flash_attn.wheel_check symbols WHEEL
    python -m vendored_flash_attn.wheel_check abi3 WHEEL
    python -m vendored_flash_attn.wheel_check cxx-runtime WHEEL
    python -m vendored_flash_attn.wheel_check build-info WHEEL [--pin PIN] [--cuda-major N] [--arch-list L]
                                                               [--preset P] [--require declared|fa2,fa3,fa4]
    python -m vendored_flash_attn.wheel_check installed [--pin PIN] ...   (cibuildwheel's test-command)
    python -m vendored_flash_attn.wheel_check fa4-kernels [--report FILE]  (on a GPU: wheel_check_fa4)

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
* build-info: ``vendored_flash_attn/build_info.json`` says what was asked for: the
  pinned upstream and CUTLASS commits, the CUDA major, arch list, preset, the
  components; at least one family was built and the wheel holds each built one's
  module (a family of staged Python kernels, FA4: its subpackage, its build record and,
  for each arch and Python its precompile named, the kernel files or index its record
  counts); and it agrees with the wheel's version (the same version, and its local label
  names the built upstream and CUDA). ``--require declared`` (the release gate): every
  family the build was asked for must be there: each family the declaration
  (cmake/knobs.json ``families``) lists whose build knob the build info does not record
  as off and which runs on an arch of the build info's arch list.
* installed: the same for the installed package (its distribution's version and files),
  and every module the build info says was built imports.
* fa4-kernels (a GPU, torch and the fa4 extra): every FA4 kernel the installed wheel
  precompiled for this Python and GPU runs with no compile (wheel_check_fa4.py).

Each check prints one PASS/FAIL line (details below a failure); the exit status
is 1 when any failed. Nothing here but fa4-kernels needs a GPU. Standard library + packaging only,
plus abi3audit for the abi3 check and pyelftools for the cxx-runtime check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from .families import registry


def components() -> tuple[str, ...]:
    """The declared families (cmake/knobs.json "families"): fa2, fa3, fa4, ..."""
    return registry().names()


def compiled_components() -> tuple[str, ...]:
    """The families whose record is a key of build_info.json (compiled modules)."""
    return tuple(f.name for f in registry() if f.record_key is not None)

PACKAGE = "vendored_flash_attn"
BUILD_INFO = f"{PACKAGE}/build_info.json"
DEFAULT_MAX_MB = 400.0
ENV_MAX_MB = "VFA_WHEEL_MAX_MB"
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


# --- helpers -------------------------------------------------------------------

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


def _human(size: float) -> str:
    return f"{size / MB:.1f} MB"


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
    largest = [f"{_human(i.compress_size):>10} compressed {_human(i.file_size):>10} unpacked  {i.filename}"
               for i in infos[:top]]
    # The digest of a reproducible wheel (README, "What a build records"): a rebuild of the
    # same inputs anywhere gives the same one, so a published wheel can be checked against it.
    summary = f"{wheel.name} is {_human(size)} (limit {max_mb:g} MB), sha256 {file_sha256(wheel)}"
    if size <= limit:
        return CheckResult("size", True, summary)
    return CheckResult("size", False, summary + f"; over by {_human(size - limit)}. Largest members:", largest)


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
    return _symbols_result(members, results)


def _symbols_result(members: Sequence[str], results: dict[str, Optional[str]]) -> CheckResult:
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


# --- build info ----------------------------------------------------------------

@dataclass
class Expectations:
    pin: Optional[Path] = None           # pin.json: upstream and CUTLASS commits
    cuda_major: Optional[int] = None
    arch_list: Optional[str] = None      # TORCH_CUDA_ARCH_LIST as given to the build
    preset: Optional[str] = None
    # families that must be built: fa2, fa3, fa4, or DECLARED (what the build info asked for)
    require: tuple[str, ...] = ()


DECLARED = "declared"


def _arch_capabilities(arch_list: str) -> list[tuple[int, int]]:
    """``"8.0;9.0a 10.0+PTX"`` -> [(8, 0), (9, 0), (10, 0)]."""
    return [(int(m.group(1)), int(m.group(2))) for m in re.finditer(r"(\d+)\.(\d+)", arch_list)]


def declared_families(info: dict[str, Any]) -> tuple[str, ...]:
    """The families the build was asked for (``--require declared``): each declared family
    (cmake/knobs.json ``families``) whose build knob the build info's record of knobs does
    not hold as off, and which runs on an arch of the build info's ``cuda_arch_list``. A
    release wheel must hold each: a family that ``auto`` left out (no arch? a build Python
    that could not stage it?) fails the gate as a removed one does."""
    from .declaration import BOOL_OFF

    capabilities = _arch_capabilities(str(info.get("cuda_arch_list") or ""))
    options = info.get("options") if isinstance(info.get("options"), dict) else {}
    wanted = []
    for family in registry():
        knob = options.get(family.build_knob) if isinstance(options.get(family.build_knob), dict) else {}
        if str(knob.get("value", "auto")).strip().lower() in BOOL_OFF:
            continue
        if any(family.capability_problem(major, minor, 0) is None for major, minor in capabilities):
            wanted.append(family.name)
    return tuple(wanted)


def required_families(info: dict[str, Any], require: Sequence[str]) -> tuple[str, ...]:
    """``require`` with ``declared`` resolved against ``info``."""
    names: list[str] = []
    for name in require:
        for family in (declared_families(info) if name == DECLARED else (name,)):
            if family not in names:
                names.append(family)
    return tuple(names)


def built_modules(info: dict[str, Any]) -> dict[str, str]:
    """Component -> compiled module name, for each component the build info says was built."""
    return {comp: str(info[comp].get("module") or "") for comp in compiled_components()
            if isinstance(info.get(comp), dict) and info[comp].get("built")}


def packaged_families(names: Iterable[str]) -> dict[str, list[str]]:
    """Family -> the declared artefacts a wheel lacks, for each family of staged Python
    kernels (FA4) whose build record the wheel holds: such a wheel must hold all of them."""
    present = set(names)
    found = {}
    for family in registry():
        if family.record_key is not None or f"{PACKAGE}/{family.record}" not in present:
            continue
        found[family.name] = [f"{PACKAGE}/{a}" for a in family.artefacts if f"{PACKAGE}/{a}" not in present]
    return found


def shipped_kernel_problems(names: Iterable[str], read: Callable[[str], bytes]) -> list[str]:
    """What a wheel's precompiled kernels (families of staged Python kernels: FA4) lack
    against the runs their build record lists: the kernel files of each Python that compiled
    (``<kernels>/<flavour>/<fingerprint>/<kind>/<hash>.o``), and for a Python that shares
    another's (``same_as``), an index listing as many entries, each a file the wheel holds.
    ``read(member)`` gives a member's bytes."""
    from . import fa4_cache

    present = set(names)
    problems = []
    for family in registry():
        record_name = f"{PACKAGE}/{family.record}"
        if family.record_key is not None or record_name not in present:
            continue
        root = f"{PACKAGE}/{family.record.rsplit('/', 1)[0]}/{fa4_cache.SHIPPED_DIR}"
        try:
            precompile = json.loads(read(record_name)).get("precompile") or {}
            runs = precompile.get("runs") or []
        except (ValueError, AttributeError) as exc:
            problems.append(f"{record_name} is not a build record: {exc}")
            continue
        problems += _precompile_coverage(family.title, precompile)
        expected: dict[tuple[str, str, bool], int] = {}
        targets: dict[tuple[str, str], str] = {}
        for run in runs:
            if isinstance(run, dict) and run.get("kernels"):
                shared = isinstance(run.get("same_as"), dict)
                place = (str(run.get("flavour")), str(run.get("fingerprint")), shared)
                expected[place] = expected.get(place, 0) + int(run["kernels"])
                if shared:
                    targets[place[:2]] = str(run["same_as"].get("fingerprint"))
        for (flavour, fingerprint, shared), count in sorted(expected.items()):
            folder = f"{root}/{flavour}/{fingerprint}"
            if not shared:
                found = [n for n in present if n.startswith(folder + "/") and n.endswith(".o")]
                if len(found) != count:
                    problems.append(f"{family.title}: {folder} holds {len(found)} kernel files, its build record {count}")
                continue
            index = f"{folder}/{fa4_cache.ALIASES_FILE}"
            if index not in present:
                problems.append(f"{family.title}: {index} is missing (its build record lists {count} shared kernels)")
                continue
            try:
                same_as, kinds = fa4_cache.parse_aliases(read(index))
            except ValueError as exc:
                problems.append(f"{family.title}: {index}: {exc}")
                continue
            entries = [(kind, theirs) for kind, table in kinds.items() for theirs in table.values()]
            if same_as != targets[(flavour, fingerprint)] or len(entries) != count:
                problems.append(f"{family.title}: {index} lists {len(entries)} kernels of {same_as}, "
                                f"its build record {count} of {targets[(flavour, fingerprint)]}")
            absent = [f"{kind}/{theirs}.o" for kind, theirs in entries
                      if f"{root}/{flavour}/{same_as}/{kind}/{theirs}.o" not in present]
            if absent:
                problems.append(f"{family.title}: {index} names {len(absent)} kernel files the wheel lacks ({absent[0]}, ...)")
    return problems


def _precompile_coverage(title: str, precompile: dict[str, Any]) -> list[str]:
    """Each arch and each Python the precompile was run for (the record's ``archs`` and
    ``pythons``, what configure named) has a run that shipped kernels: a kernel set that
    failed under VFA_FA4_PRECOMPILE=auto, or a Python left out, is a wheel that compiles at
    first use where the build said it would not."""
    state, mode = precompile.get("state"), precompile.get("mode")
    if mode == "on" and state != "on":
        return [f"{title}: VFA_FA4_PRECOMPILE=on, but its record says the precompile was {state!r}: "
                f"{precompile.get('reason') or 'no reason given'}"]
    if state != "on":
        return []
    runs = [r for r in precompile.get("runs") or () if isinstance(r, dict)]
    problems = []
    for arch in precompile.get("archs") or ():
        for python in precompile.get("pythons") or sorted({str(r.get("python")) for r in runs}):
            mine = [r for r in runs if r.get("arch") == arch and str(r.get("python")) == python]
            if not any(r.get("kernels") for r in mine):
                why = "; ".join(str(r.get("error")) for r in mine if r.get("error")) or "no run recorded"
                problems.append(f"{title}: no kernels shipped for {arch} and Python {python} ({why[:300]})")
    return problems


def _module_name(member: str) -> str:
    """``vendored_flash_attn/_vendored_fa2_C.abi3.so`` -> ``_vendored_fa2_C``."""
    return Path(member).name.split(".")[0]


def _normalise_archs(text: str) -> list[str]:
    return sorted(t for t in re.split(r"[ ,;]+", text.strip()) if t)


def compare_build_info(info: dict[str, Any], expect: Expectations, version: Optional[str] = None,
                       packaged: Sequence[str] = ()) -> list[str]:
    """Every way ``info`` differs from what was asked for (empty: it matches). ``packaged``:
    the families of staged Python kernels whose record the package holds (FA4)."""
    problems: list[str] = []
    if info.get("schema") != 1:
        problems.append(f"build info schema {info.get('schema')!r}, expected 1")
    if expect.pin is not None:
        pin = json.loads(Path(expect.pin).read_text())
        for key, name in (("upstream", "flash_attention"), ("cutlass", "cutlass")):
            got = info.get(key, {})
            want = pin[name]["commit"]
            if got.get("commit") != want:
                problems.append(f"{key} commit {got.get('commit')!r}, the pin names {want}")
            if got.get("matches_pin") is not True:
                problems.append(f"{key}.matches_pin is {got.get('matches_pin')!r}: not built from the pinned commit")
    torch_cuda = str(info.get("torch", {}).get("cuda") or "")
    nvcc_cuda = str(info.get("cuda", {}).get("version") or "")
    if expect.cuda_major is not None:
        for what, value in (("torch CUDA", torch_cuda), ("nvcc", nvcc_cuda)):
            if value.split(".")[0] != str(expect.cuda_major):
                problems.append(f"{what} version {value!r}, expected CUDA {expect.cuda_major}.x")
    if expect.arch_list is not None and _normalise_archs(str(info.get("cuda_arch_list", ""))) != _normalise_archs(expect.arch_list):
        problems.append(f"cuda_arch_list {info.get('cuda_arch_list')!r}, expected {expect.arch_list!r}")
    if expect.preset is not None and info.get("preset") != expect.preset:
        problems.append(f"preset {info.get('preset')!r}, expected {expect.preset!r}")
    for comp in required_families(info, expect.require):
        if comp not in compiled_components():
            continue  # a packaged family: check_build_info looks for its record and artefacts
        if not info.get(comp, {}).get("built"):
            problems.append(f"{comp} was not built: {info.get(comp, {}).get('reason') or 'no reason given'}")
    if not built_modules(info) and not packaged:
        # A wheel without kernels installs and imports, and every call refuses: never a release.
        reasons = "; ".join(f"{comp}: {info.get(comp, {}).get('reason') or 'no reason given'}"
                            for comp in compiled_components())
        names = [f.name for f in registry()]
        problems.append(f"none of {', '.join(names)} was built ({reasons}; no packaged family's record)")
    if version is not None:
        problems += _compare_version(info, version)
    return problems


def _compare_version(info: dict[str, Any], version: str) -> list[str]:
    from .versioning import VersionSchemeError, parse_local

    problems = []
    recorded = info.get("package_version")
    # CMake records the version scikit-build-core builds (SKBUILD_PROJECT_VERSION_FULL): a
    # difference means the build info came from another build than this package's.
    if recorded != version:
        problems.append(f"build info package_version {recorded!r} differs from the package's version "
                        f"{version!r}: the build info is another build's")
    try:
        label = parse_local(version)
    except VersionSchemeError as exc:
        return problems + [str(exc)]
    if label:
        commit = str(info.get("upstream", {}).get("commit", ""))
        if not commit.startswith(label["upstream"]):
            problems.append(f"version {version} names upstream {label['upstream']}, the build used {commit}")
        torch_cuda = str(info.get("torch", {}).get("cuda") or "")
        if torch_cuda.split(".")[0] != str(label["cuda_major"]):
            problems.append(f"version {version} says CUDA {label['cuda_major']}, the build used torch CUDA {torch_cuda!r}")
    return problems


def package_problems(names: Iterable[str], read: Callable[[str], bytes], info: dict[str, Any],
                     expect: Expectations, where: str) -> tuple[list[str], list[str]]:
    """What a package's files (``names``, ``read``: a wheel's members or an installed
    package's files, as ``vendored_flash_attn/...``) lack against its build info and the
    required families: ``(problems, packaged families found)``."""
    names = list(names)
    present = {_module_name(m) for m in compiled_members(names)}
    missing = [f"{comp} was built (build info) but {where} has no {module or '(unnamed)'} module"
               for comp, module in built_modules(info).items() if module not in present]
    packaged = packaged_families(names)
    for comp, lacking in packaged.items():
        missing += [f"{comp} is in the package (its build record) but {where} has no {member}"
                    for member in lacking]
    missing += shipped_kernel_problems(names, read)
    for comp in required_families(info, expect.require):
        family = registry().by_name(comp)
        if family.record_key is None and comp not in packaged:
            missing.append(f"{comp} was required but {where} has no {PACKAGE}/{family.record} "
                           f"({family.build_knob}=off, or the build could not stage it)")
    return missing, list(packaged)


def check_build_info(wheel: Path, expect: Expectations) -> CheckResult:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        if BUILD_INFO not in names:
            return CheckResult("build-info", False, f"{wheel.name} has no {BUILD_INFO}")
        try:
            info = json.loads(zf.read(BUILD_INFO))
        except ValueError as exc:
            return CheckResult("build-info", False, f"{wheel.name}: {BUILD_INFO} is not valid JSON: {exc}")
        missing, packaged = package_problems(names, zf.read, info, expect, wheel.name)
    version = wheel_metadata(wheel)["version"]
    return _build_info_result(info, expect, version, missing, packaged)


def _build_info_result(info: dict[str, Any], expect: Expectations, version: Optional[str],
                       more_problems: Sequence[str] = (), packaged: Sequence[str] = ()) -> CheckResult:
    problems = compare_build_info(info, expect, version, packaged) + list(more_problems)
    built = list(built_modules(info)) + list(packaged)
    required = required_families(info, expect.require)
    summary = (f"version {version}, upstream {str(info.get('upstream', {}).get('commit', ''))[:12]}, "
               f"torch CUDA {info.get('torch', {}).get('cuda')}, archs {info.get('cuda_arch_list')!r}, "
               f"preset {info.get('preset')!r}, built {'+'.join(built) or 'nothing'}"
               + (f", required {'+'.join(required)}" if required else ""))
    if problems:
        return CheckResult("build-info", False, summary + " - differs from what was asked for:", problems)
    return CheckResult("build-info", True, summary)


def modules_expected(names: Iterable[str], read: Callable[[str], bytes]) -> bool:
    """Whether a package must hold compiled modules: not when its build info says no compiled
    family was built (a wheel of FA4 alone); yes when there is no readable build info."""
    try:
        info = json.loads(read(BUILD_INFO))
    except (KeyError, OSError, ValueError):
        return True
    return bool(built_modules(info)) or not packaged_families(names)


# --- installed package (cibuildwheel's test-command) ------------------------------

def installed_files() -> tuple[list[str], Callable[[str], bytes]]:
    """The installed package's files as ``vendored_flash_attn/<path>`` (what a wheel's members
    would be) and a reader for them."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    root = Path(spec.origin).parent if spec and spec.origin else None
    if root is None:
        return [], lambda name: b""
    names = [f"{PACKAGE}/{p.relative_to(root).as_posix()}" for p in root.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    return names, lambda name: (root.parent / name).read_bytes()


def check_installed(expect: Expectations) -> list[CheckResult]:
    import importlib
    from importlib import metadata

    from .build_info import BuildInfoMissing, load_build_info

    try:
        info = load_build_info().raw
    except BuildInfoMissing as exc:
        return [CheckResult("build-info", False, str(exc))]
    version = metadata.version("vendored-flash-attn")
    names, read = installed_files()
    missing, packaged = package_problems(names, read, info, expect, "the installed package")
    results = [_build_info_result(info, expect, version, missing, packaged)]
    members = list(built_modules(info).values())
    if not members:
        if packaged:
            results.append(CheckResult("symbols", True, "no compiled module, as the build info says "
                                       f"(packaged: {', '.join(packaged)})"))
        else:
            results.append(CheckResult("symbols", False, "the build info names no built module: the "
                                       "installed package has no kernels to load"))
        return results
    import torch  # noqa: F401  (the modules need torch's libraries loaded)

    loaded: dict[str, Optional[str]] = {}
    for module in members:
        try:
            importlib.import_module(f"{PACKAGE}.{module}")
            loaded[module] = None
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            loaded[module] = f"{type(exc).__name__}: {exc}"
    results.append(_symbols_result(members, loaded))
    return results


# --- CLI -------------------------------------------------------------------------

def _expectations(args: argparse.Namespace) -> Expectations:
    require = tuple(c for c in re.split(r"[ ,]+", args.require or "") if c)
    for comp in require:
        if comp not in components() and comp != DECLARED:
            raise SystemExit(f"--require: {comp!r} is not one of {', '.join(components())}, {DECLARED}")
    return Expectations(pin=args.pin, cuda_major=args.cuda_major, arch_list=args.arch_list,
                        preset=args.preset, require=require)


def _add_expectations(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin", type=Path, help="pin.json whose commits the build must carry")
    p.add_argument("--cuda-major", type=int, help="CUDA major the build must have used (torch and nvcc)")
    p.add_argument("--arch-list", help="TORCH_CUDA_ARCH_LIST the build must have used")
    p.add_argument("--preset", help="kernel preset the build must have used (full, minimal)")
    p.add_argument("--require", help=f"families that must be built, e.g. fa2,fa3,fa4; {DECLARED}: every family "
                   "the build info asked for (its build knob not off, an arch of its arch list it runs on)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.wheel_check", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    checks: dict[str, Callable[[argparse.Namespace, Path], list[CheckResult]]] = {
        "size": lambda a, w: [check_size(w, a.max_mb)],
        "symbols": lambda a, w: [check_symbols(w)],
        "abi3": lambda a, w: [check_abi3(w)],
        "cxx-runtime": lambda a, w: [check_cxx_runtime(w)],
        "build-info": lambda a, w: [check_build_info(w, _expectations(a))],
        "all": lambda a, w: [check_size(w, a.max_mb), check_abi3(w), check_cxx_runtime(w),
                             check_build_info(w, _expectations(a)), check_symbols(w)],
    }
    for name in checks:
        p = sub.add_parser(name)
        p.add_argument("wheels", nargs="+", type=Path, help="wheel files (or folders of them)")
        if name in ("size", "all"):
            p.add_argument("--max-mb", type=float, default=None,
                           help=f"size limit in MB (default: ${ENV_MAX_MB}, else {DEFAULT_MAX_MB:g})")
        if name in ("build-info", "all"):
            _add_expectations(p)
    installed = sub.add_parser("installed", help="check the installed package (build info, modules load)")
    _add_expectations(installed)
    fa4_kernels = sub.add_parser("fa4-kernels", help="on a GPU: the installed wheel's precompiled FA4 kernels "
                                 "run with no compile (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR: an empty folder)")
    fa4_kernels.add_argument("--report", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.command == "fa4-kernels":  # needs torch, the fa4 extra and a GPU (wheel_check_fa4)
        from .wheel_check_fa4 import check_installed as check_fa4_kernels

        return check_fa4_kernels(args.report)

    results: list[CheckResult] = []
    if args.command == "installed":
        results = check_installed(_expectations(args))
    else:
        wheels: list[Path] = []
        for path in args.wheels:
            wheels += sorted(path.glob("*.whl")) if path.is_dir() else [path]
        if not wheels:
            print("FAIL no wheel found in " + " ".join(map(str, args.wheels)))
            return 1
        for wheel in wheels:
            print(f"== {wheel}")
            for result in checks[args.command](args, wheel):
                print(result.render(), flush=True)
                results.append(result)
        return 0 if all(r.ok for r in results) else 1
    for result in results:
        print(result.render())
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
