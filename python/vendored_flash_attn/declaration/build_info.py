"""What this wheel was built with: read from ``build_info.json``, written by CMake.

The file is produced by ``cmake/BuildInfo.cmake`` at configure time and installed
next to this module. Everything the runtime selector needs to know about the
build (which modules, head dims, dtypes and features) comes from here, so the
selector never has to guess from the environment.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Optional

from .families import registry

BUILD_INFO_FILE = "build_info.json"
# The package root (vendored_flash_attn), where the build records are installed.
_PACKAGE = __name__.partition(".")[0]
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ComponentInfo:
    """One family's part of the build (its module or subpackage) as the build selected it."""

    built: bool
    module: str
    gencode: tuple[str, ...] = ()
    head_dims: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    sources: int = 0
    reason: str = ""  # why it was not built, when built is False
    # Kernels compiled at build time and shipped (FA4): one entry per run that shipped any,
    # {"arch", "python", "flavour", "kernels"}; every other shape or Python compiles at first use.
    precompiled: tuple[dict, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ComponentInfo":
        return cls(
            built=bool(data.get("built", False)),
            module=str(data.get("module", "")),
            gencode=tuple(data.get("gencode", ())),
            head_dims=tuple(int(h) for h in data.get("head_dims", ())),
            dtypes=tuple(data.get("dtypes", ())),
            features=tuple(data.get("features", ())),
            defines=tuple(data.get("defines", ())),
            sources=int(data.get("sources", 0)),
            reason=str(data.get("reason", "")),
        )


@dataclass(frozen=True)
class BuildInfo:
    """The whole build record. ``raw`` keeps every field for ``info`` output; ``components``
    holds one ComponentInfo per declared family (families.py), read from the record the
    family declares (a key of build_info.json, or a file of its own such as FA4's
    ``_fa4/build_info.json``, given as ``records``)."""

    preset: str
    components: dict[str, ComponentInfo]
    upstream_commit: str
    upstream_matches_pin: bool
    cutlass_commit: str
    cutlass_matches_pin: bool
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    records: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], records: Optional[dict[str, Any]] = None) -> "BuildInfo":
        """``records``: family name -> the content of its own record file (None: absent)."""
        upstream = data.get("upstream", {})
        cutlass = data.get("cutlass", {})
        records = dict(records or {})
        components = {}
        for family in registry():
            if family.record_key is not None:
                components[family.name] = ComponentInfo.from_dict(
                    data.get(family.record_key, {"built": False, "module": family.module}))
            else:
                components[family.name] = _packaged_component(family, records.get(family.name))
        return cls(
            preset=str(data.get("preset", "")),
            components=components,
            upstream_commit=str(upstream.get("commit", "")),
            upstream_matches_pin=bool(upstream.get("matches_pin", False)),
            cutlass_commit=str(cutlass.get("commit", "")),
            cutlass_matches_pin=bool(cutlass.get("matches_pin", False)),
            raw=data,
            records=records,
        )

    # Named accessors for the tests and GPU scripts (tests/gpu, tests/upstream) that mean a
    # family by name; the package reads a family's record by its declaration instead
    # (component(version), components[family.name]).
    @property
    def fa2(self) -> ComponentInfo:
        return self.components["fa2"]

    @property
    def fa3(self) -> ComponentInfo:
        return self.components["fa3"]

    def component(self, version: int) -> ComponentInfo:
        return self.components[registry()[version].name]


def _packaged_component(family, record: Optional[dict[str, Any]]) -> ComponentInfo:
    """A family shipped as staged sources (FA4): built when its record is in the package.
    Its kernels are chosen per call by its adapter, so the declaration's dtypes and
    features stand for what it holds; its archs are those precompiled."""
    if not isinstance(record, dict):
        return ComponentInfo(built=False, module=family.subpackage,
                             reason=f"not in this wheel ({family.build_knob}=off, or the build could not "
                                    f"stage it; its record {family.record} is absent)")
    precompile = record.get("precompile") or {}
    # A run that shares another Python's files (cmake/vfa_build/fa4/precompile.py --share) says whose.
    shipped = tuple({**{key: run.get(key) for key in ("arch", "python", "flavour", "kernels")},
                     **({"files_of": run["same_as"].get("python")} if isinstance(run.get("same_as"), dict) else {})}
                    for run in precompile.get("runs") or () if isinstance(run, dict) and run.get("kernels"))
    return ComponentInfo(built=True, module=str(record.get("package") or family.probe),
                         gencode=tuple(str(a) for a in precompile.get("archs") or ()),
                         dtypes=family.dtypes, features=family.features,
                         sources=int((record.get("staged") or {}).get("files") or 0), precompiled=shipped)


class BuildInfoMissing(RuntimeError):
    """The package has no usable build_info.json: it was not installed through its CMake
    build, or the file cannot be read (``BuildInfoUnreadable``). Every caller that must not
    raise (the selector, ``info``) catches this one class."""


class BuildInfoUnreadable(BuildInfoMissing):
    """build_info.json is there but is not a build record this package can read: truncated,
    damaged or edited (not JSON, not an object, a field of the wrong type)."""


@functools.lru_cache(maxsize=1)
def load_build_info() -> BuildInfo:
    """Read the installed build record once per process."""
    try:
        text = resources.files(_PACKAGE).joinpath(BUILD_INFO_FILE).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise BuildInfoMissing(
            f"{BUILD_INFO_FILE} is missing from the vendored_flash_attn package; it is written by "
            "the CMake build. Install the package with `pip install .` (or a built wheel) "
            "instead of importing it from the source tree."
        ) from exc
    return parse_build_info(text, _family_records())


def _family_records() -> dict[str, Any]:
    """The build records families keep in files of their own (FA4's ``_fa4/build_info.json``,
    written by cmake/FA4Package.cmake); absent or unreadable: None (the family is not there)."""
    records: dict[str, Any] = {}
    root = resources.files(_PACKAGE)
    for family in registry():
        if family.record_key is not None:
            continue
        try:
            records[family.name] = json.loads(root.joinpath(*family.record.split("/")).read_bytes())
        except (OSError, ValueError):
            records[family.name] = None
    return records


_REINSTALL = ("reinstall the package (pip install --force-reinstall <the wheel>) or rebuild it "
              "(pip install .)")


def parse_build_info(text: "str | bytes", records: Optional[dict[str, Any]] = None) -> BuildInfo:
    """The build record in ``text``; BuildInfoUnreadable (a BuildInfoMissing) when it is not
    one, so a damaged file reads like a missing one to every caller."""
    try:
        data = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError, and a UnicodeDecodeError on bytes
        raise BuildInfoUnreadable(
            f"{BUILD_INFO_FILE} is not valid JSON ({exc}): the file is truncated or damaged; "
            f"{_REINSTALL}.") from exc
    if not isinstance(data, dict):
        raise BuildInfoUnreadable(
            f"{BUILD_INFO_FILE} holds a JSON {type(data).__name__}, not an object: the file is "
            f"damaged; {_REINSTALL}.")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise BuildInfoUnreadable(
            f"{BUILD_INFO_FILE} has schema {schema!r}, this package reads schema {SCHEMA_VERSION}; "
            "rebuild the package."
        )
    try:
        return BuildInfo.from_dict(data, records)
    except (AttributeError, TypeError, ValueError) as exc:  # a field of the wrong type
        raise BuildInfoUnreadable(
            f"{BUILD_INFO_FILE} has a field this package cannot read ({type(exc).__name__}: {exc}): "
            f"the file is damaged or was edited; {_REINSTALL}.") from exc
