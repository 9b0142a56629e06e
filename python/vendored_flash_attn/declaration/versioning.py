"""The package version: the project version plus a PEP 440 local label.

    <base>+fa<upstream commit, 7 hex>.cu<CUDA major>     e.g. 0.1.0+fa617264c.cu13

* ``base`` is the project's own version (``base-version`` in pyproject.toml's
  ``[[tool.dynamic-metadata]]`` entry for this provider).
* the upstream commit comes from ``vendor/flash-attention/pin.json`` (or the pin
  named by ``VFA_PIN_FILE``, as the CMake build reads it);
* the CUDA major from ``torch.version.cuda`` (read without importing torch),
  else from ``nvcc --version`` (``CUDA_HOME``/``CUDA_PATH`` first, then PATH).

The label lets one index hold a wheel per CUDA major and says which upstream
it carries. Indexes that refuse local versions (PyPI) get the plain base
version: ``VFA_VERSION_LOCAL=0``. Values of ``VFA_VERSION_LOCAL``:

* unset / ``auto``: the label in a checkout, none when building from an sdist
  (so a wheel built from an index-hosted sdist has the sdist's version, which
  pip checks);
* ``1``: always the label; ``0``: never.

``VFA_CUDA_MAJOR`` overrides the detected CUDA major (for cross builds).

This module is both scikit-build-core's dynamic-metadata provider (class
``VersionProvider``, loaded from the source tree at build time, so it uses only
the standard library and ``packaging``) and a small CLI::

    python -m vendored_flash_attn.declaration.versioning [--project DIR] [--json]
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from packaging.version import InvalidVersion, Version

from .knob_values import BOOL_OFF, BOOL_ON, BOOL_WORDS_TEXT

ENV_LOCAL = "VFA_VERSION_LOCAL"
ENV_CUDA_MAJOR = "VFA_CUDA_MAJOR"
PIN_FILE = Path("vendor/flash-attention/pin.json")
COMMIT_CHARS = 7


class VersionSchemeError(ValueError):
    """A version that cannot be made (bad base version, no pin, unknown CUDA)."""


@dataclass(frozen=True)
class VersionParts:
    base: str
    upstream_commit: str
    cuda_major: Optional[int]
    local: bool
    version: str
    cuda_source: str = ""


def pin_path(project_dir: Path, env: Optional[Mapping[str, str]] = None) -> Path:
    """The pin the build reads: $VFA_PIN_FILE (as CMake reads it), else the project's."""
    env = os.environ if env is None else env
    override = env.get("VFA_PIN_FILE", "").strip()
    return Path(project_dir) / (override or PIN_FILE)


def upstream_commit(project_dir: Path, env: Optional[Mapping[str, str]] = None) -> str:
    pin_path_ = pin_path(project_dir, env)
    return _pin_commit(pin_path_)


def _pin_commit(pin_path: Path) -> str:
    try:
        pin = json.loads(pin_path.read_text(encoding="utf-8"))
        commit = pin["flash_attention"]["commit"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VersionSchemeError(f"cannot read the upstream commit from {pin_path}: {exc}") from exc
    if not re.fullmatch(r"[0-9a-f]{40}", str(commit)):
        raise VersionSchemeError(f"{pin_path}: flash_attention.commit is not a 40-hex commit: {commit!r}")
    return commit


def _torch_cuda_version() -> Optional[str]:
    """torch.version.cuda, read from torch/version.py without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = None
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                target, value = node.target.id, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            if target == "cuda" and isinstance(value, ast.Constant):
                return value.value if isinstance(value.value, str) else None
    return None


def _nvcc_cuda_version(env: Mapping[str, str]) -> Optional[str]:
    candidates = [Path(env[k]) / "bin" / "nvcc" for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        candidates.append(Path(found))
    for nvcc in candidates:
        if not nvcc.is_file():
            continue
        try:
            out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"release (\d+)\.(\d+)", out)
        if match:
            return f"{match.group(1)}.{match.group(2)}"
    return None


def cuda_major(env: Mapping[str, str]) -> tuple[Optional[int], str]:
    """(CUDA major, where it came from); (None, reason) when nothing says."""
    override = env.get(ENV_CUDA_MAJOR, "").strip()
    if override:
        if not override.isdigit():
            raise VersionSchemeError(f"{ENV_CUDA_MAJOR}={override!r} is not a number")
        return int(override), f"env:{ENV_CUDA_MAJOR}"
    torch_cuda = _torch_cuda_version()
    if torch_cuda:
        return int(torch_cuda.split(".")[0]), f"torch.version.cuda={torch_cuda}"
    nvcc = _nvcc_cuda_version(env)
    if nvcc:
        return int(nvcc.split(".")[0]), f"nvcc {nvcc}"
    return None, "neither a CUDA build of torch nor nvcc was found"


def want_local(env: Mapping[str, str], from_sdist: bool) -> bool:
    value = env.get(ENV_LOCAL, "").strip().lower()
    if value in ("", "auto"):
        return not from_sdist
    if value in BOOL_ON:
        return True
    if value in BOOL_OFF:
        return False
    raise VersionSchemeError(f"{ENV_LOCAL}={value!r}: use 1, 0 or auto (or any of {BOOL_WORDS_TEXT})")


def with_local(base: Version, label: Optional[str]) -> Version:
    """``base`` with its local label replaced (packaging does the validation)."""
    if hasattr(base, "__replace__"):  # packaging >= 26
        try:
            return base.__replace__(local=label)
        except (InvalidVersion, ValueError, TypeError) as exc:
            raise VersionSchemeError(f"invalid local version label {label!r}: {exc}") from exc
    try:
        return Version(base.public if label is None else f"{base.public}+{label}")
    except InvalidVersion as exc:
        raise VersionSchemeError(f"invalid local version label {label!r}: {exc}") from exc


def local_label(commit: str, major: int) -> str:
    return f"fa{commit[:COMMIT_CHARS]}.cu{major}"


def compute(base: str, project_dir: Path, env: Optional[Mapping[str, str]] = None,
            from_sdist: Optional[bool] = None) -> VersionParts:
    env = os.environ if env is None else env
    project_dir = Path(project_dir)
    if from_sdist is None:
        from_sdist = (project_dir / "PKG-INFO").is_file()
    try:
        parsed = Version(base)
    except InvalidVersion as exc:
        raise VersionSchemeError(f"base-version {base!r} is not a PEP 440 version: {exc}") from exc
    if parsed.local is not None:
        raise VersionSchemeError(f"base-version {base!r} must not carry a local label; the build adds it")
    commit = upstream_commit(project_dir, env)
    local = want_local(env, from_sdist)
    major, source = (None, "")
    label = None
    if local:
        major, source = cuda_major(env)
        if major is None:
            raise VersionSchemeError(
                f"cannot name the CUDA major for the version's local label: {source}. Install a CUDA "
                f"build of torch or the CUDA toolkit, set {ENV_CUDA_MAJOR}, or set {ENV_LOCAL}=0.")
        label = local_label(commit, major)
    version = with_local(parsed, label)
    return VersionParts(base=str(parsed), upstream_commit=commit, cuda_major=major, local=local,
                        version=str(version), cuda_source=source)


def parse_local(version: str) -> dict[str, Any]:
    """What a version's local label says: {"upstream": "617264c", "cuda_major": 13} or {}."""
    local = Version(version).local
    if not local:
        return {}
    match = re.fullmatch(r"fa([0-9a-f]+)\.cu(\d+)", local)
    if not match:
        raise VersionSchemeError(f"{version}: the local label {local!r} is not fa<commit>.cu<major>")
    return {"upstream": match.group(1), "cuda_major": int(match.group(2))}


# --- scikit-build-core dynamic-metadata provider ---------------------------------

class VersionProvider:
    """``[[tool.dynamic-metadata]]`` provider for ``project.version``."""

    def __init__(self) -> None:
        self._state = "wheel"

    def build_state(self, build_state: str) -> None:
        self._state = build_state

    def get_requires_for_dynamic_metadata(self, settings: Mapping[str, Any]) -> list[str]:
        return ["packaging>=24"]

    def dynamic_metadata(self, settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, str]:
        base = settings.get("base-version")
        if not isinstance(base, str):
            raise VersionSchemeError("the version provider needs base-version = \"X.Y.Z\" in its settings")
        env = dict(os.environ)
        if self._state == "sdist" and env.get(ENV_LOCAL, "").strip().lower() in ("", "auto"):
            # A source distribution is not CUDA-specific: it carries the plain version,
            # and wheels built from it keep that version unless asked otherwise.
            env[ENV_LOCAL] = "0"
        parts = compute(base, Path.cwd(), env)
        return {"version": parts.version}


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = None  # type: ignore[assignment]

    parser = argparse.ArgumentParser(prog="python -m vendored_flash_attn.declaration.versioning",
                                     description="Print the version a build of this checkout gets.")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="project directory (default: .)")
    parser.add_argument("--base", help="base version (default: read from pyproject.toml)")
    parser.add_argument("--json", action="store_true", help="print all parts as JSON")
    args = parser.parse_args(argv)
    base = args.base
    if base is None:
        if tomllib is None:
            parser.error("--base is needed on Python 3.10 (no tomllib)")
        pyproject = tomllib.loads((args.project / "pyproject.toml").read_text(encoding="utf-8"))
        base = next(e["base-version"] for e in pyproject["tool"]["dynamic-metadata"] if "base-version" in e)
    try:
        parts = compute(base, args.project)
    except VersionSchemeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(parts)) if args.json else parts.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
