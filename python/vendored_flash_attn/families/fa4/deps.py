"""FA4's Python dependencies: declared once, checked before cutlass is ever imported.

FA4 is upstream's ``flash_attn/cute`` (FlashAttention-4 in NVIDIA's CuTe DSL). Its
dependencies are the ``fa4`` extra of this package (``pip install "vendored-flash-attn[fa4]"``),
and that extra is the one declaration: this module reads it (from ``pyproject.toml`` when
running from a source checkout, from the installed package's metadata otherwise) and never
keeps a copy. The extra holds, verbatim, the requirements upstream's
``flash_attn/cute/pyproject.toml`` declares at the pin, less those in ``NOT_IN_EXTRA`` and
plus those in ``ADDED_TO_PIN``; ``pin_drift`` compares the two and the FA4 staging step
(``cmake/vfa_build/fa4/precompile.py stage``) refuses a pin that disagrees.

Why check at all: with a drifted ``nvidia-cutlass-dsl`` the FA4 sources die deep inside
cutlass (``module 'cutlass.cute.core' has no attribute 'ThrMma'``). ``check()`` refuses
first, naming the installed and the required version and the install command. It reads
installed versions with ``importlib.metadata`` only: importing this module, or calling
``check()``, never imports cutlass (the import takes seconds and may itself fail).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from ...errors import FlashAttnUnavailableError

DISTRIBUTION = "vendored-flash-attn"
EXTRA = "fa4"  # pyproject.toml's [project.optional-dependencies] name: a packaging name, not a family decision
INSTALL_COMMAND = f'pip install "{DISTRIBUTION}[{EXTRA}]"'

# How the extra differs from the dependencies upstream's flash_attn/cute/pyproject.toml
# declares, and why. Everything else must be the pin's requirement, verbatim.
NOT_IN_EXTRA = {"torch": "a requirement of vendored-flash-attn itself"}
ADDED_TO_PIN = {"packaging": "check() evaluates the pin's version specifiers with it"}

# The distribution name at the start of a PEP 508 requirement (the rest is packaging's job).
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA_MARKER = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


class FA4DependencyError(FlashAttnUnavailableError):
    """FA4's dependencies are missing or in versions other than the pin's."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return _canonical(match.group(1))


def _source_pyproject() -> Path | None:
    """This package's pyproject.toml when running from a source checkout, else None."""
    candidate = Path(__file__).resolve().parents[4] / "pyproject.toml"
    if not candidate.is_file():
        return None
    text = candidate.read_text(encoding="utf-8")
    return candidate if re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', text, re.M) else None


def extra_from_pyproject(path: Path) -> tuple[str, ...]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    return tuple(project.get("optional-dependencies", {}).get(EXTRA, ()))


def extra_from_metadata(distribution: str = DISTRIBUTION) -> tuple[str, ...]:
    """The extra's requirements from the installed package's ``Requires-Dist`` lines."""
    found = []
    for line in metadata.requires(distribution) or ():
        requirement, _, marker = line.partition(";")
        if EXTRA in _EXTRA_MARKER.findall(marker):
            found.append(requirement.strip())
    return tuple(found)


def required() -> tuple[str, ...]:
    """The requirement strings of the ``fa4`` extra: the one declaration."""
    pyproject = _source_pyproject()
    if pyproject is not None:
        return extra_from_pyproject(pyproject)
    try:
        return extra_from_metadata()
    except metadata.PackageNotFoundError:
        raise FA4DependencyError(
            f"cannot tell what FA4 needs: {DISTRIBUTION} is neither installed (no metadata) nor run "
            f"from its source checkout. Install it with: {INSTALL_COMMAND}") from None


def not_installed(requirements: tuple[str, ...] | None = None) -> list[str]:
    """The requirements whose distribution is not installed at all."""
    requirements = required() if requirements is None else requirements
    absent = []
    for requirement in requirements:
        try:
            metadata.version(requirement_name(requirement))
        except metadata.PackageNotFoundError:
            absent.append(requirement)
    return absent


def problems(requirements: tuple[str, ...] | None = None) -> list[str]:
    """One line per requirement that the environment does not meet (empty: all met)."""
    requirements = required() if requirements is None else requirements
    absent = not_installed(requirements)
    missing = [f"{requirement_name(r)} is not installed ({r} is required)" for r in absent]
    installed = {r: metadata.version(requirement_name(r)) for r in requirements if r not in absent}
    try:
        from packaging.requirements import Requirement
    except ModuleNotFoundError:  # the extra brings it; without it no version can be compared
        return missing or [f"packaging is not installed (it compares the versions of {EXTRA})"]

    wrong = []
    for requirement, version in installed.items():
        spec = Requirement(requirement).specifier
        if not spec.contains(version, prereleases=True):
            wrong.append(f"{requirement_name(requirement)} {version} is installed, {spec} is required")
    return missing + wrong


def check(requirements: tuple[str, ...] | None = None) -> None:
    """Raise ``FA4DependencyError`` unless every FA4 dependency is installed in its pinned version."""
    found = problems(requirements)
    if found:
        raise FA4DependencyError(
            "FA4 (the CuTe DSL kernels) cannot be used: its dependencies are not installed in the versions "
            "the pinned upstream declares: " + "; ".join(found) + f". Install them with: {INSTALL_COMMAND}")


def pin_drift(pin_pyproject_text: str, requirements: tuple[str, ...] | None = None) -> list[str]:
    """Differences between the extra and upstream's ``flash_attn/cute/pyproject.toml`` (text).

    Empty when the extra is the pin's dependencies, verbatim, less ``NOT_IN_EXTRA`` and plus
    ``ADDED_TO_PIN``. Needs ``packaging`` and ``tomllib`` (build and test time only).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10 (the wheel builds run there): scikit-build-core's tomli
        import tomli as tomllib  # type: ignore[no-redef]

    from packaging.requirements import Requirement

    requirements = required() if requirements is None else requirements
    pinned = tomllib.loads(pin_pyproject_text)["project"]["dependencies"]
    expected = {requirement_name(r): Requirement(r) for r in pinned if requirement_name(r) not in NOT_IN_EXTRA}
    ours = {requirement_name(r): Requirement(r) for r in requirements if requirement_name(r) not in ADDED_TO_PIN}
    drift = []
    for name in sorted(expected.keys() | ours.keys()):
        want, have = expected.get(name), ours.get(name)
        if have is None:
            drift.append(f"{name}: the pin requires {want}, the {EXTRA} extra lacks it")
        elif want is None:
            drift.append(f"{name}: the {EXTRA} extra requires {have}, the pin does not")
        elif (want.specifier, want.extras, want.marker) != (have.specifier, have.extras, have.marker):
            drift.append(f"{name}: the pin requires {want}, the {EXTRA} extra {have}")
    for name in ADDED_TO_PIN:
        if not any(requirement_name(r) == name for r in requirements):
            drift.append(f"{name}: listed in ADDED_TO_PIN but not in the {EXTRA} extra")
    return drift
