"""The wheel check of the build info: what the package says it holds against what was asked for.

build-info: ``vendored_flash_attn/build_info.json`` says what was asked for: the pinned
upstream and CUTLASS commits, the CUDA major, arch list, preset, the components; at least
one family was built and the package holds each built one's module (a family of staged
Python kernels, FA4: its subpackage, its build record and, for each arch and Python its
precompile named, the kernel files or index its record counts); and it agrees with the
package's version (the same version, and its local label names the built upstream and
CUDA). ``--require declared`` (the release gate): every family the build was asked for must
be there: each family the declaration (cmake/knobs.json ``families``) lists whose build knob
the build info does not record as off and which runs on an arch of the build info's arch
list. A wheel's members or an installed package's files are read the same way (``names``
and ``read``). Standard library + packaging.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ..declaration.families import registry
from .common import (BUILD_INFO, PACKAGE, CheckResult, compiled_components, compiled_members,
                                 wheel_metadata)


@dataclass
class Expectations:
    pin: Optional[Path] = None           # pin.json: upstream and CUTLASS commits
    cuda_major: Optional[int] = None
    arch_list: Optional[str] = None      # TORCH_CUDA_ARCH_LIST as given to the build
    preset: Optional[str] = None
    # families that must be built: fa2, fa3, fa4, or DECLARED (what the build info asked for)
    require: tuple[str, ...] = ()


DECLARED = "declared"


def declared_families(info: dict[str, Any]) -> tuple[str, ...]:
    """The families the build was asked for (``--require declared``): each declared family
    (cmake/knobs.json ``families``) whose build knob the build info's record of knobs does
    not hold as off, and which runs on an arch of the build info's ``cuda_arch_list``. A
    release wheel must hold each: a family that ``auto`` left out (no arch? a build Python
    that could not stage it?) fails the gate as a removed one does."""
    from ..declaration.knob_values import BOOL_OFF

    capabilities = registry().cuda_archs.capabilities(str(info.get("cuda_arch_list") or ""))
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
    from ..families.fa4 import cache as fa4_cache

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
        digests: dict[tuple[str, str], str] = {}
        for run in runs:
            if isinstance(run, dict) and run.get("kernels"):
                shared = isinstance(run.get("same_as"), dict)
                place = (str(run.get("flavour")), str(run.get("fingerprint")), shared)
                expected[place] = expected.get(place, 0) + int(run["kernels"])
                if shared:
                    targets[place[:2]] = str(run["same_as"].get("fingerprint"))
                    digests[place[:2]] = str(run["same_as"].get("index_sha256") or "")  # the last run's: the index grows
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
            digest = digests[(flavour, fingerprint)]
            if digest and hashlib.sha256(read(index)).hexdigest() != digest:
                # the run time ignores such an index (fa4_cache.read_aliases): its kernels would compile
                problems.append(f"{family.title}: {index} is not the index its build record names (sha256 "
                                f"{digest[:12]}...)")
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
        pin = json.loads(Path(expect.pin).read_text(encoding="utf-8"))
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
    from ..declaration.versioning import VersionSchemeError, parse_local

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
    return build_info_result(info, expect, version, missing, packaged)


def build_info_result(info: dict[str, Any], expect: Expectations, version: Optional[str],
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
