"""The kinds of CUDA unit the build declares (cmake/BuildProgress.cmake's --unit-kind, and the
cluster's bounds file cmake/vfa_build/cluster/dist_bound.py reads): one spec, one parser. The
progress estimate and the cluster's per-unit bound both read a unit's kind through it."""

from __future__ import annotations

from typing import NamedTuple, Optional


class UnitKindSpec(NamedTuple):
    target: str
    kind: str
    seconds: float
    contains: str
    cached_seconds: Optional[float]


def parse_unit_kind(spec: str) -> UnitKindSpec:
    """A kind of CUDA unit as cmake/BuildProgress.cmake writes it (--unit-kind, and the cluster's
    bounds file dist_bound.py reads): "TARGET|KIND|SECONDS|PATH TEXT[|CACHED SECONDS]", the units
    of TARGET whose path holds PATH TEXT (any, when empty), at SECONDS compiled and CACHED
    SECONDS answered by the compiler cache, for reference.
      parse_unit_kind("_vendored_fa3_C|FA3 CUDA|153|/instantiations/|11.5")"""
    target, kind, seconds, contains, *cached = spec.split("|")
    return UnitKindSpec(target, kind, float(seconds), contains,
                        float(cached[0]) if cached and cached[0] else None)
