"""The kernel families (FA2, FA3, FA4, ...), as ``cmake/knobs.json``'s ``families`` section
declares them once.

Every module that needs to know what a family is asks here: the selector (which versions
exist, the GPUs each runs on, the default per GPU generation, where a request falls back
to), ``build_info`` (where each family's build record is), ``environment`` (what loading a
family means: import its compiled module, or find its staged subpackage and check its
dependencies), the interface (the adapter a call goes to), ``info`` and ``wheel_check``
(which families there are and what a wheel that has one must hold). Adding a family is one
entry in the declaration plus its adapter module.

Standard library only, and nothing is imported here but the declaration: ``wheel_check``
runs with no torch, and ``import vendored_flash_attn`` must import no family's code.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

from . import declaration

EXTENSION, CUTE_DSL = "extension", "cute_dsl"
MADE = (EXTENSION, CUTE_DSL)
BUILD_INFO_RECORD = "build_info.json:"  # record in the main build info, under this family's key


KV_LAYOUTS = ("packed", "paged", "batched")


class FamilyDeclarationError(ValueError):
    """The ``families`` section of cmake/knobs.json is malformed."""


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True)
class CallRules:
    """What a family's kernels take, beyond its dtypes and features (the declaration's
    ``call``): the shared checks (validation.py) read these instead of a version number.
    None / the defaults: no limit."""

    kv_layouts: tuple[str, ...] = KV_LAYOUTS
    page_size_multiple: int = 1
    max_num_splits: Optional[int] = None
    sinks_max_q_heads: Optional[int] = None
    sinks_same_head_sizes: bool = False
    # fp8_kv (a 16-bit q with FP8 k/v) only at these head dims; None: at any
    fp8_kv_head_dims: Optional[tuple[int, ...]] = None
    fp8_kv_why: str = ""
    # {generation: ((Q/K min, Q/K max, V min, V max), ...)}: the head sizes its kernels take on
    # each GPU generation (kernels.declared_head_size_problem); None: not declared here
    head_sizes: Optional[dict[str, tuple[tuple[int, int, int, int], ...]]] = None
    head_size_alignment_bytes: int = 1  # head sizes are multiples of this many bytes of K/V
    head_sizes_why: str = ""
    # Its calls may be captured in a CUDA graph (vLLM captures decode); false: the interface
    # refuses a call under capture, saying cuda_graphs_why, instead of a wrong replay.
    cuda_graphs: bool = True
    cuda_graphs_why: str = ""


_CALL_FIELDS = {"kv_layouts", "page_size_multiple", "max_num_splits", "sinks_max_q_heads",
                "sinks_same_head_sizes", "fp8_kv_head_dims", "fp8_kv_why", "head_sizes",
                "head_size_alignment_bytes", "head_sizes_why",
                "cuda_graphs", "cuda_graphs_why"}


def _call_rules(call: dict, where: str) -> CallRules:
    fields = {k: tuple(v) if k in ("kv_layouts", "fp8_kv_head_dims") else v for k, v in call.items()}
    if "head_sizes" in call:
        table = call["head_sizes"]
        try:
            fields["head_sizes"] = {str(gen): tuple(tuple(int(n) for n in entry) for entry in entries)
                                    for gen, entries in table.items()}
        except (AttributeError, TypeError, ValueError):
            fields["head_sizes"] = None
        if not fields["head_sizes"] or not all(len(e) == 4 and e[0] <= e[1] and e[2] <= e[3]
                                               for entries in fields["head_sizes"].values() for e in entries):
            raise FamilyDeclarationError(f"{where}: call.head_sizes must map each generation to a list of "
                                         "[Q/K min, Q/K max, V min, V max]")
    return CallRules(**fields)


@dataclass(frozen=True)
class Family:
    """One kernel family as declared (see the ``about`` of the declaration's section)."""

    name: str
    version: int
    made: str
    build_knob: str
    min_capability: tuple[int, int]
    generations: dict[int, str]
    # GPU generations (major) it is declared not to run on, with why (a fault at the pin)
    excluded: dict[int, str]
    dtypes: tuple[str, ...]
    features: tuple[str, ...]
    default_on: Optional[tuple[int, ...]]  # None: every major it runs on
    not_default: dict[int, str]
    fallback: Optional[str]
    adapter: str
    record: str
    call: CallRules = CallRules()
    head_size_rule: Optional[str] = None
    artefacts: tuple[str, ...] = ()
    head_dims_knob: Optional[str] = None
    dtypes_knob: Optional[str] = None
    features_knob: Optional[str] = None
    module: str = ""
    op_namespace: str = ""
    forward_op: str = ""
    subpackage: str = ""
    probe: str = ""
    deps_check: str = ""
    install: str = ""
    # cute_dsl: the Python minors release wheels precompile its kernels for ("3.12", ...)
    pythons: tuple[str, ...] = ()
    # The features its build selects (the choices of features_knob): present only when built.
    selectable_features: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def title(self) -> str:
        """What messages call it: FA2, FA3, FA4."""
        return self.name.upper()

    @property
    def compiled(self) -> bool:
        """A CUDA extension this build compiles (else staged Python kernels)."""
        return self.made == EXTENSION

    @property
    def record_key(self) -> Optional[str]:
        """Its key in build_info.json, or None when its record is a file of its own."""
        return self.record[len(BUILD_INFO_RECORD):] if self.record.startswith(BUILD_INFO_RECORD) else None

    @property
    def package_name(self) -> str:
        """What ``info`` and messages show for its code: the module or the subpackage."""
        return self.module or self.subpackage

    def capability_problem(self, major: int, minor: int, index: int) -> Optional[str]:
        """Why it cannot run on GPU ``index`` of this compute capability; None when it can."""
        if major in self.excluded:
            return (f"{self.title} does not run on compute capability {major}.x in this package: "
                    f"{self.excluded[major]}; GPU {index} has compute capability {major}.{minor}")
        if self.generations and major not in self.generations:
            names = sorted(set(self.generations.values()), key=lambda n: (len(n), n))
            return (f"{self.title} runs on {', '.join(names)} only (compute capability "
                    f"{', '.join(f'{m}.x' for m in sorted(self.generations))}); GPU {index} has "
                    f"compute capability {major}.{minor}")
        if (major, minor) < self.min_capability:
            lowest = ".".join(map(str, self.min_capability))
            return (f"{self.title} needs compute capability {lowest} or newer; GPU {index} has "
                    f"compute capability {major}.{minor}")
        return None

    def features_missing(self, built_features, needed) -> list[str]:
        """Of the ``needed`` features, those it cannot run: not declared for it, or selected
        by its build and left out (``built_features``: the build info's)."""
        return [f for f in needed if f not in self.features
                or (f in self.selectable_features and f not in built_features)]

    def is_default_on(self, major: int) -> bool:
        return self.default_on is None or major in self.default_on

    def resolve(self, reference: str) -> Callable:
        """``module:function`` of this family's declaration, imported now."""
        module, _, attribute = reference.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def adapter_function(self) -> Callable:
        return self.resolve(self.adapter)

    def head_size_function(self) -> Optional[Callable]:
        """Its head-size rule (kernels.py), None when its adapter checks head sizes itself."""
        return self.resolve(self.head_size_rule) if self.head_size_rule else None


_FIELDS = {"version", "made", "build_knob", "capabilities", "dtypes", "features", "default_on",
           "not_default", "fallback", "adapter", "record", "artefacts", "head_dims_knob", "dtypes_knob",
           "features_knob", "module", "op_namespace", "forward_op", "subpackage", "probe", "deps_check",
           "install", "head_size_rule", "call", "pythons"}
_REQUIRED = {"version", "made", "build_knob", "capabilities", "dtypes", "features", "default_on",
             "fallback", "adapter", "record"}
_REQUIRED_BY_MADE = {EXTENSION: {"module", "op_namespace", "forward_op"},
                     CUTE_DSL: {"subpackage", "probe", "deps_check", "install"}}


def _family(name: str, entry: Any, knobs: dict) -> Family:
    where = f"cmake/knobs.json: families.{name}"
    if not isinstance(entry, dict):
        raise FamilyDeclarationError(f"{where}: must be an object")
    unknown, missing = entry.keys() - _FIELDS, _REQUIRED - entry.keys()
    if entry.get("made") in _REQUIRED_BY_MADE:
        missing |= _REQUIRED_BY_MADE[entry["made"]] - entry.keys()
    elif "made" in entry:
        raise FamilyDeclarationError(f"{where}: made {entry['made']!r} is not one of {', '.join(MADE)}")
    if unknown or missing:
        raise FamilyDeclarationError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
    for knob in (entry["build_knob"], entry.get("head_dims_knob"), entry.get("dtypes_knob"),
                 entry.get("features_knob")):
        if knob is not None and knob not in knobs:
            raise FamilyDeclarationError(f"{where}: {knob} is not a knob of cmake/knobs.json")
    for reference in ("adapter", "head_size_rule"):
        if entry.get(reference) is not None and ":" not in entry[reference]:
            raise FamilyDeclarationError(f"{where}: {reference} must be module:function")
    call = entry.get("call", {})
    if not isinstance(call, dict) or call.keys() - _CALL_FIELDS:
        raise FamilyDeclarationError(f"{where}: call must be an object of {sorted(_CALL_FIELDS)}")
    if set(call.get("kv_layouts", KV_LAYOUTS)) - set(KV_LAYOUTS):
        raise FamilyDeclarationError(f"{where}: call.kv_layouts must be of {', '.join(KV_LAYOUTS)}")
    if not isinstance(call.get("cuda_graphs", True), bool) or (
            call.get("cuda_graphs") is False and not call.get("cuda_graphs_why")):
        raise FamilyDeclarationError(f"{where}: call.cuda_graphs must be true or false, and false needs "
                                     "call.cuda_graphs_why (what the refusal under capture says)")
    pythons = entry.get("pythons", [])
    if not isinstance(pythons, list) or not all(isinstance(v, str) and re.fullmatch(r"3\.\d+", v) for v in pythons):
        raise FamilyDeclarationError(f"{where}: pythons must be a list of Python minors such as \"3.12\"")
    default_on = entry["default_on"]
    caps = entry["capabilities"]
    rules = _call_rules(call, where)
    named = {str(v) for v in caps.get("generations", {}).values()}
    if rules.head_sizes and set(rules.head_sizes) - named:
        raise FamilyDeclarationError(f"{where}: call.head_sizes names generations it does not run on: "
                                     f"{sorted(set(rules.head_sizes) - named)}")
    return Family(
        name=name, version=int(entry["version"]), made=entry["made"], build_knob=entry["build_knob"],
        min_capability=_capability(caps["min"]),
        generations={int(k): str(v) for k, v in caps.get("generations", {}).items()},
        excluded={int(k): str(v) for k, v in caps.get("excluded", {}).items()},
        dtypes=tuple(entry["dtypes"]), features=tuple(entry["features"]),
        default_on=None if default_on == "all" else tuple(int(m) for m in default_on),
        not_default={int(k): str(v) for k, v in entry.get("not_default", {}).items()},
        fallback=entry["fallback"], adapter=entry["adapter"], record=entry["record"],
        call=rules,
        head_size_rule=entry.get("head_size_rule"),
        artefacts=tuple(entry.get("artefacts", ())),
        head_dims_knob=entry.get("head_dims_knob"), dtypes_knob=entry.get("dtypes_knob"),
        features_knob=entry.get("features_knob"),
        module=entry.get("module", ""), op_namespace=entry.get("op_namespace", ""),
        forward_op=entry.get("forward_op", ""), subpackage=entry.get("subpackage", ""),
        probe=entry.get("probe", ""), deps_check=entry.get("deps_check", ""),
        install=entry.get("install", ""), pythons=tuple(pythons),
        selectable_features=tuple(knobs[entry["features_knob"]].get("choices", ()))
        if entry.get("features_knob") else (),
        raw=entry)


@dataclass(frozen=True)
class Registry:
    """The declared families, in declaration order, and the selector's default order."""

    families: tuple[Family, ...]
    default_order: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_version", {f.version: f for f in self.families})
        object.__setattr__(self, "_by_name", {f.name: f for f in self.families})

    def __iter__(self) -> Iterator[Family]:
        return iter(self.families)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(f.version for f in self.families)

    def versions_text(self) -> str:
        """"2, 3 or 4"."""
        return versions_text(self.families)

    def get(self, version) -> Optional[Family]:
        """The family of ``version`` (an int), None when none is declared."""
        if isinstance(version, bool) or not isinstance(version, int):
            return None
        return self._by_version.get(version)  # type: ignore[attr-defined]

    def __getitem__(self, version: int) -> Family:
        family = self.get(version)
        if family is None:
            raise ValueError(f"FlashAttention version must be {self.versions_text()}, got {version!r}")
        return family

    def by_name(self, name: str) -> Family:
        return self._by_name[name]  # type: ignore[attr-defined]

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.families)

    def in_default_order(self) -> tuple[Family, ...]:
        return tuple(self.by_name(n) for n in self.default_order)

    def having(self, feature: str) -> tuple[Family, ...]:
        """The families that declare ``feature``, in declaration order."""
        return tuple(f for f in self.families if feature in f.features)

    def having_dtype(self, dtype: str) -> tuple[Family, ...]:
        return tuple(f for f in self.families if dtype in f.dtypes)


def titles_text(families: Iterable[Family]) -> str:
    """"FA3", "FA3 or FA4": what a message says needs a feature ("no family" when none)."""
    titles = [f.title for f in families]
    if not titles:
        return "no family of this package"
    return titles[0] if len(titles) == 1 else f"{', '.join(titles[:-1])} or {titles[-1]}"


def versions_text(families: Iterable[Family]) -> str:
    """"2", "3 or 4": the fa_version values that pick these families."""
    words = [str(f.version) for f in families]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def parse(data: dict) -> Registry:
    section = data.get("families")
    if not isinstance(section, dict):
        raise FamilyDeclarationError("cmake/knobs.json has no \"families\" section")
    knobs = data.get("knobs", {})
    families = tuple(_family(name, entry, knobs) for name, entry in section.items()
                     if name not in ("about", "default_order"))
    versions = [f.version for f in families]
    if len(set(versions)) != len(versions):
        raise FamilyDeclarationError(f"cmake/knobs.json: families declare a version twice: {versions}")
    names = {f.name for f in families}
    order = tuple(section.get("default_order", ()))
    if sorted(order) != sorted(names):
        raise FamilyDeclarationError(f"cmake/knobs.json: families.default_order {list(order)} must list "
                                     f"every family once ({', '.join(sorted(names))})")
    for f in families:
        if f.fallback is not None and f.fallback not in names:
            raise FamilyDeclarationError(f"cmake/knobs.json: families.{f.name}.fallback names no family")
    return Registry(families, order)


_registry: Optional[Registry] = None


def registry() -> Registry:
    """The families this package declares (read once)."""
    global _registry
    if _registry is None:
        _registry = parse(declaration.load())
    return _registry


def set_registry(new: Optional[Registry]) -> Optional[Registry]:
    """Replace the registry (None: the installed declaration again); returns the previous one.
    Tests use it with a copy of the declaration; the selector's caches are cleared by the
    environment swap that follows (environment.set_environment)."""
    global _registry
    previous, _registry = _registry, new
    return previous
