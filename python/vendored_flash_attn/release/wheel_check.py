"""Release checks for a built wheel (or an installed package): their command line.

    python -m vendored_flash_attn.release.wheel_check all WHEEL [--max-mb N] [--pin PIN] [--cuda-major N] ...
    python -m vendored_flash_attn.release.wheel_check size WHEEL --max-mb N
    python -m vendored_flash_attn.release.wheel_check symbols WHEEL
    python -m vendored_flash_attn.release.wheel_check abi3 WHEEL
    python -m vendored_flash_attn.release.wheel_check cxx-runtime WHEEL
    python -m vendored_flash_attn.release.wheel_check build-info WHEEL [--pin PIN] [--cuda-major N] [--arch-list L]
                                                               [--preset P] [--require declared|fa2,fa3,fa4]
    python -m vendored_flash_attn.release.wheel_check installed [--pin PIN] ...   (cibuildwheel's test-command)
    python -m vendored_flash_attn.release.wheel_check fa4-kernels [--report FILE]  (on a GPU: fa4_kernels)

* size, symbols, abi3, cxx-runtime: the wheel file and its compiled modules
  (release/modules.py says what each checks).
* build-info: the build info against what was asked for and what the wheel holds
  (release/build_info_check.py).
* installed: the same for the installed package (its distribution's version and files),
  and every module the build info says was built imports (here).
* fa4-kernels (a GPU, torch and the fa4 extra): every FA4 kernel the installed wheel
  precompiled for this Python and GPU runs with no compile (release/fa4_kernels.py).

Each check prints one PASS/FAIL line (details below a failure); the exit status
is 1 when any failed. Nothing here but fa4-kernels needs a GPU. Standard library + packaging only,
plus abi3audit for the abi3 check and pyelftools for the cxx-runtime check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Optional

from .build_info_check import (DECLARED, Expectations, build_info_result, built_modules,
                                     check_build_info, package_problems)
from .common import PACKAGE, CheckResult, components
from .modules import (DEFAULT_MAX_MB, ENV_MAX_MB, check_abi3, check_cxx_runtime, check_size,
                                  check_symbols, symbols_result)


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

    from ..declaration.build_info import BuildInfoMissing, load_build_info

    try:
        info = load_build_info().raw
    except BuildInfoMissing as exc:
        return [CheckResult("build-info", False, str(exc))]
    version = metadata.version("vendored-flash-attn")
    names, read = installed_files()
    missing, packaged = package_problems(names, read, info, expect, "the installed package")
    results = [build_info_result(info, expect, version, missing, packaged)]
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
    results.append(symbols_result(members, loaded))
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
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.release.wheel_check", description=__doc__.split("\n\n")[0])
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
    if args.command == "fa4-kernels":  # needs torch, the fa4 extra and a GPU (fa4_kernels)
        from .fa4_kernels import check_installed as check_fa4_kernels

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
