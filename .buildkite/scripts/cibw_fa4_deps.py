#!/usr/bin/env python3
"""FA4's kernels in release wheels: which Pythons precompile them, and their dependencies.

Upstream keys FA4's kernels on the Python minor, so a wheel serves a Python with no compile
only where that Python took part in the build (cmake/vfa_build/fa4/precompile.py: the build's Python
compiles, each other one ships an index of the same files). The Pythons are the fa4
family's ``pythons`` (cmake/knobs.json); the dependency list is the ``fa4`` extra of
pyproject.toml, read by fa4_deps. Nothing is installed when the knobs turn FA4 or its
precompile off.

    # on the agent (build-wheels.sh): the container's interpreters of the declared Pythons,
    # less the one cibuildwheel builds with, as VFA_FA4_PRECOMPILE_PYTHONS takes them
    python .buildkite/scripts/cibw_fa4_deps.py --release-pythons
    # in the container (cibw-before-build.sh): the [fa4] extra into the build's Python, and
    # torch + the extra into each interpreter of VFA_FA4_PRECOMPILE_PYTHONS
    python .buildkite/scripts/cibw_fa4_deps.py
    python .buildkite/scripts/cibw_fa4_deps.py --dry-run  # print the pip commands only
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT / "python"))

from vendored_flash_attn.families.fa4 import deps as fa4_deps  # noqa: E402
from vendored_flash_attn.declaration.knob_values import BOOL_OFF, load  # noqa: E402
from vendored_flash_attn.declaration.families import CUTE_DSL, registry  # noqa: E402

# Where the manylinux images keep each CPython (cibuildwheel builds with these too).
MANYLINUX_PYTHON = "/opt/python/cp{tag}-cp{tag}/bin/python"


def fa4_off(environ) -> str | None:
    """Why no FA4 kernel is precompiled (a knob set off), or None."""
    for knob in ("VFA_BUILD_FA4", "VFA_FA4_PRECOMPILE"):
        if environ.get(knob, "auto").strip().lower() in BOOL_OFF:
            return f"{knob}={environ[knob]}"
    return None


def build_minor(pyproject: Path = PROJECT / "pyproject.toml") -> str:
    """The Python minor cibuildwheel builds with (``[tool.cibuildwheel] build = "cp310-..."``)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # an agent's Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with open(pyproject, "rb") as f:
        build = tomllib.load(f)["tool"]["cibuildwheel"]["build"]
    found = re.match(r"cp3(\d+)-", build)
    if not found:
        raise SystemExit(f"{pyproject}: [tool.cibuildwheel] build {build!r} names no cp3XX identifier")
    return f"3.{found.group(1)}"


def release_pythons(environ=os.environ) -> list[str]:
    """The interpreters that precompile FA4's kernels besides the build's: the declared
    Pythons of the cute_dsl families, less the build's minor, as manylinux paths."""
    if fa4_off(environ):
        return []
    minors = sorted({m for f in registry() if f.made == CUTE_DSL for m in f.pythons},
                    key=lambda m: tuple(map(int, m.split("."))))
    return [MANYLINUX_PYTHON.format(tag=m.replace(".", "")) for m in minors if m != build_minor()]


def commands(environ=os.environ) -> list[tuple[list[str], dict[str, str]]]:
    """The pip commands, each with what it adds to the environment: the extra into this (the
    build's) Python, then torch and the extra into each interpreter of
    VFA_FA4_PRECOMPILE_PYTHONS. [] when FA4 or its precompile is off. torch's index
    (VFA_TORCH_INDEX_URL, which may hold credentials) goes through pip's environment, never
    onto a command line or into the log."""
    why = fa4_off(environ)
    if why:
        print(f"FA4's dependencies not installed: {why}")
        return []
    extra = list(fa4_deps.extra_from_pyproject(PROJECT / "pyproject.toml"))
    result = [([sys.executable, "-m", "pip", "install", *extra], {})]
    torch = f"torch=={environ.get('VFA_TORCH_VERSION') or load()['knobs']['VFA_TORCH_VERSION']['default']}"
    index = environ.get("VFA_TORCH_INDEX_URL", "")
    for interpreter in filter(None, environ.get("VFA_FA4_PRECOMPILE_PYTHONS", "").split(";")):
        if not os.access(interpreter, os.X_OK):
            raise SystemExit(f"VFA_FA4_PRECOMPILE_PYTHONS names {interpreter}, which this image does not have: "
                             "set VFA_FA4_PRECOMPILE_PYTHONS to the interpreters it has (';'-separated), "
                             "or to an empty value for the build's Python only")
        result.append(([interpreter, "-m", "pip", "install", torch], {"PIP_INDEX_URL": index} if index else {}))
        result.append(([interpreter, "-m", "pip", "install", *extra], {}))
    return result


def main(argv: list[str]) -> int:
    if "--release-pythons" in argv:
        print(";".join(release_pythons()))
        return 0
    for pip, added in commands():
        print(" ".join(pip) + ("  (index: VFA_TORCH_INDEX_URL)" if added else ""), flush=True)
        if "--dry-run" not in argv and subprocess.run(pip, env={**os.environ, **added}).returncode != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
