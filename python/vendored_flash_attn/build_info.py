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
from typing import Any

BUILD_INFO_FILE = "build_info.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ComponentInfo:
    """One compiled module (FA2 or FA3) as the build selected it."""

    built: bool
    module: str
    gencode: tuple[str, ...] = ()
    head_dims: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    sources: int = 0
    reason: str = ""  # why it was not built, when built is False

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
    """The whole build record. ``raw`` keeps every field for ``info`` output."""

    preset: str
    fa2: ComponentInfo
    fa3: ComponentInfo
    upstream_commit: str
    upstream_matches_pin: bool
    cutlass_commit: str
    cutlass_matches_pin: bool
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BuildInfo":
        upstream = data.get("upstream", {})
        cutlass = data.get("cutlass", {})
        return cls(
            preset=str(data.get("preset", "")),
            fa2=ComponentInfo.from_dict(data.get("fa2", {"built": False, "module": "_vendored_fa2_C"})),
            fa3=ComponentInfo.from_dict(data.get("fa3", {"built": False, "module": "_vendored_fa3_C"})),
            upstream_commit=str(upstream.get("commit", "")),
            upstream_matches_pin=bool(upstream.get("matches_pin", False)),
            cutlass_commit=str(cutlass.get("commit", "")),
            cutlass_matches_pin=bool(cutlass.get("matches_pin", False)),
            raw=data,
        )

    def component(self, version: int) -> ComponentInfo:
        if version == 2:
            return self.fa2
        if version == 3:
            return self.fa3
        raise ValueError(f"FlashAttention version must be 2 or 3, got {version!r}")


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
        text = resources.files(__package__).joinpath(BUILD_INFO_FILE).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise BuildInfoMissing(
            f"{BUILD_INFO_FILE} is missing from the vendored_flash_attn package; it is written by "
            "the CMake build. Install the package with `pip install .` (or a built wheel) "
            "instead of importing it from the source tree."
        ) from exc
    return parse_build_info(text)


_REINSTALL = ("reinstall the package (pip install --force-reinstall <the wheel>) or rebuild it "
              "(pip install .)")


def parse_build_info(text: "str | bytes") -> BuildInfo:
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
        return BuildInfo.from_dict(data)
    except (AttributeError, TypeError, ValueError) as exc:  # a field of the wrong type
        raise BuildInfoUnreadable(
            f"{BUILD_INFO_FILE} has a field this package cannot read ({type(exc).__name__}: {exc}): "
            f"the file is damaged or was edited; {_REINSTALL}.") from exc
