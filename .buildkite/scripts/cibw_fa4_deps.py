#!/usr/bin/env python3
"""cibuildwheel before-build: give the build's Python FA4's pinned dependencies, so that
`VFA_FA4_PRECOMPILE=auto` precompiles FA4's kernels into the wheel (cmake/fa4_precompile.py
probe asks exactly this). The list is the `fa4` extra of pyproject.toml, read by
fa4_deps (one declaration); nothing is installed when the knobs turn FA4 or its
precompile off. Kernels for other Pythons: VFA_FA4_PRECOMPILE_PYTHONS (docs/fa4.md).

    python .buildkite/scripts/cibw_fa4_deps.py            # what cibw-before-build.sh runs
    python .buildkite/scripts/cibw_fa4_deps.py --dry-run  # print the pip command only
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT / "python"))

from vendored_flash_attn import fa4_deps  # noqa: E402
from vendored_flash_attn.declaration import BOOL_OFF  # noqa: E402


def command(environ=os.environ) -> list[str] | None:
    """The pip command, or None when VFA_BUILD_FA4 or VFA_FA4_PRECOMPILE is off."""
    for knob in ("VFA_BUILD_FA4", "VFA_FA4_PRECOMPILE"):
        if environ.get(knob, "auto").strip().lower() in BOOL_OFF:
            print(f"FA4's dependencies not installed: {knob}={environ[knob]}")
            return None
    requirements = fa4_deps.extra_from_pyproject(PROJECT / "pyproject.toml")
    return [sys.executable, "-m", "pip", "install", *requirements]


def main(argv: list[str]) -> int:
    pip = command()
    if pip is None:
        return 0
    print(" ".join(pip), flush=True)
    if "--dry-run" in argv:
        return 0
    return subprocess.run(pip).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
