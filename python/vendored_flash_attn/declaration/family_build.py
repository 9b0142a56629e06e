"""How a kernel family is made, as its declaration (cmake/knobs.json ``families``) says it and
the build reads it: what its code is compiled for (``archs``, capabilities of the arch table,
cuda_archs.py) and what a compiled family's module is built from (``build``: sources, include
dirs, defines, the kernel rule, memory class, unit kinds; its selection knobs' ``presets``).
cmake/CudaArchs.cmake, cmake/FamilyTarget.cmake and cmake/KernelSelection.cmake read these
fields; the checks here are part of the declaration's one validator (families.problems, run at
configure and when the package first reads it), so a mistake stops the configure naming the
field and the fix. Standard library only.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from . import cuda_archs

EXTENSION, CUTE_DSL = "extension", "cute_dsl"
MADE = (EXTENSION, CUTE_DSL)


def closest(word: Any, choices: Iterable[str]) -> str:
    """" (did you mean 'VFA_FA2_PTX'?)", or "" when nothing is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class Archs:
    """What a family's code is compiled for (the declaration's ``archs``), as compute
    capabilities of the arch table (``cuda_archs``): cmake/CudaArchs.cmake turns them into
    -gencode flags for the GPUs of TORCH_CUDA_ARCH_LIST, cmake/FA4Package.cmake into DSL targets."""

    sass: tuple[str, ...] = ()          # SASS at each, when a listed GPU runs it
    sass_knobs: dict[str, str] = field(default_factory=dict)  # more SASS, each when its bool knob is ON
    a: tuple[str, ...] = ()             # arch-specific (sm_XYa) code at each, when that GPU is listed
    ptx: str = ""                       # PTX at this capability, when ptx_knob is ON (or there is none)
    ptx_knob: str = ""
    nvcc: str = ""                      # the lowest nvcc the family's sources need, above the table's
    dsl: str = ""                       # cute_dsl: "a": its kernels compile for each listed GPU's a target

    def capabilities(self) -> tuple[str, ...]:
        """Every capability its code names."""
        return (*self.sass, *self.sass_knobs, *self.a, *((self.ptx,) if self.ptx else ()))


_ARCHS_FIELDS = {"sass", "sass_knobs", "a", "ptx", "ptx_knob", "nvcc", "dsl"}


def _runs_on_text(archs: Archs, table: cuda_archs.Table) -> str:
    """"9.0", "8.x, and 8.0 and newer through PTX": where code of these archs runs (messages)."""
    words = list(archs.a)
    words += [f"{c.split('.')[0]}.x" if c.endswith(".0") else f"{c.split('.')[0]}.x from {c}" for c in archs.sass]
    if archs.ptx:
        words.append(f"{archs.ptx} and newer (PTX)")
    return ", ".join(words)


def archs_problems(where: str, entry: dict, knobs: dict, table: Optional[cuda_archs.Table]) -> list[str]:
    """families.<name>.archs: capabilities of the arch table, knobs that are bool build knobs,
    and code that runs on every GPU of the table the family is declared for (its knobs at their
    defaults), from its capabilities.min on: else the selector would send a GPU to a module
    with no code for it."""
    archs, made, at = entry["archs"], entry.get("made"), f"{where}.archs"
    if not isinstance(archs, dict) or archs.keys() - _ARCHS_FIELDS:
        return [f"{at} must be an object of {sorted(_ARCHS_FIELDS)}, got {archs!r}"]
    found = []
    kinds = ("sass", "sass_knobs", "a", "ptx")
    if made == EXTENSION and ("dsl" in archs or not any(archs.get(k) for k in kinds)):
        found.append(f"{at}: a compiled family names the capabilities its code is compiled for (sass, a, ptx), "
                     f"not dsl")
    if made == CUTE_DSL and (archs.keys() - {"dsl"} or archs.get("dsl") != "a"):
        found.append(f"{at}: a cute_dsl family's kernels compile for each GPU of the list as its arch table row's "
                     f"a target: write {{\"dsl\": \"a\"}}")
    lists_ok = (isinstance(archs.get("sass", []), list) and isinstance(archs.get("a", []), list)
                and isinstance(archs.get("sass_knobs", {}), dict) and isinstance(archs.get("ptx", ""), str))
    if not lists_ok:
        return found + [f"{at}: sass and a are lists of capabilities, sass_knobs an object of "
                        f"{{capability: knob}}, ptx one capability, got {archs!r}"]
    for field in ("ptx_knob", *archs.get("sass_knobs", {}).values()):
        knob = archs.get(field) if field == "ptx_knob" else field
        if knob is None:
            continue
        decl = knobs.get(knob) if isinstance(knob, str) else None
        if not isinstance(decl, dict) or decl.get("type") != "bool" or decl.get("scope") != "build":
            found.append(f"{at}: {knob!r} is not a bool build knob of cmake/knobs.json{closest(knob, knobs)}: "
                         f"name one (the code it adds is built when it is ON)")
    if "nvcc" in archs and not (isinstance(archs["nvcc"], str) and re.fullmatch(r"[1-9][0-9]*\.[0-9]+", archs["nvcc"])):
        found.append(f"{at}.nvcc must be an nvcc version such as \"12.3\", got {archs['nvcc']!r}")
    if found or table is None or made not in MADE:
        return found
    family = Archs(sass=tuple(archs.get("sass", ())), sass_knobs=dict(archs.get("sass_knobs", {})),
                   a=tuple(archs.get("a", ())), ptx=archs.get("ptx", ""), ptx_knob=archs.get("ptx_knob", ""))
    unknown = [c for c in family.capabilities() if c not in table.rows]
    no_a = [c for c in family.a if c in table.rows and not table.rows[c].a]
    if unknown or no_a:
        return [f"{at} names {', '.join(map(str, unknown + no_a))}, which the arch table (cuda_archs.table) has "
                f"{'no row' if unknown else 'no a target'} for: add it there, or name a capability it has"]
    caps = entry.get("capabilities")
    if (not isinstance(caps, dict) or not isinstance(caps.get("min"), str)
            or not cuda_archs.CAPABILITY.fullmatch(caps["min"])):
        return found  # _capability_problems names it
    declared = [row for key, row in table.rows.items() if _declared_for(caps, row.capability)]
    if made == CUTE_DSL:
        missing = [row.text for row in declared if not row.a]
        if missing:
            found.append(f"{at}: its kernels compile for each GPU's a target, but the arch table has none for "
                         f"{', '.join(missing)}, where {where}.capabilities says it runs: add them, or exclude")
        return found
    if not family.capabilities():
        return found
    # The code the default knobs build, and where it runs.
    default_on = lambda knob: str(knobs.get(knob, {}).get("default", "")).upper() == "ON"  # noqa: E731
    built = Archs(sass=family.sass + tuple(c for c, k in family.sass_knobs.items() if default_on(k)), a=family.a,
                  ptx=family.ptx if not family.ptx_knob or default_on(family.ptx_knob) else "")
    targets = ([table.rows[c].sass for c in built.sass] + [table.rows[c].a for c in built.a]
               + ([table.rows[built.ptx].ptx] if built.ptx else []))
    lowest = min(family.capabilities(), key=cuda_archs.capability)
    bare = [row.text for row in declared if not table.runs_on(targets, *row.capability)]
    title = where.rsplit(".", 1)[1].upper()
    if bare:
        generations = caps.get("generations", {})
        on = f"generations [{', '.join(map(str, generations))}]" if generations else "every generation from it"
        found.append(f"{where}.capabilities declares {title} from {caps['min']} on {on}, but its code ({at}: "
                     f"{' + '.join(targets)}) runs on {_runs_on_text(built, table)}, not on {', '.join(bare)}: the "
                     f"selector would send those GPUs to a module with no code for them. Set {where}.capabilities.min "
                     f"to \"{lowest}\" and its generations to those its code runs on, or change {at}")
    elif cuda_archs.capability(caps["min"]) != cuda_archs.capability(lowest):
        found.append(f"{where}.capabilities.min is {caps['min']}, but its code starts at {lowest} ({at}): they must "
                     f"agree (the selector sends GPUs from min on to its module; the build compiles from the code's "
                     f"lowest capability): set min to \"{lowest}\", or change {at}")
    return found


_BUILD_FIELDS = {"sources", "include_dirs", "defines", "kernels", "memory_sixteenths", "unit_kinds", "why"}
_KERNELS_FIELDS = {"file", "left_out", "variants", "extra_kernels", "stubs", "required_dtypes", "disable",
                   "knob_defines"}
_COMPONENTS = ("flash_attention", "cutlass")  # the pinned upstreams (vendor/flash-attention/pin.json)
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _words(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and not _path_problem(path)


def _path_problem(path: str) -> str:
    """Why ``path`` (a string) is no plain relative path inside the upstream tree; "" when it is.
    The build compiles and includes only files of the verified sources (the pin's paths, checked
    against its anchor): a path that leaves them is a mistake of where, not of format."""
    if path.startswith("/"):
        return "it is an absolute path, outside the verified sources"
    parts = path.split("/")
    if ".." in parts:
        return ("its '..' part leaves the folder before it, so it could reach files outside the verified sources "
                "(a header there would shadow one of the same name)")
    if "." in parts or "" in parts:
        return "it has a '.' or empty part; write the plain path"
    return ""


def _paths_outside(at: str, paths: list, component: str = "flash_attention", what: str = "") -> list[str]:
    """One line per path of ``paths`` (strings) that leaves the upstream tree, naming it and the fix."""
    return [f"{at} names {what}'{path}' of {component}, but {why}. Fix {at} in cmake/knobs.json: name the "
            f"folder or file itself, a path under {component}.paths of the pin (vendor/flash-attention/pin.json), "
            f"or add its folder there and write the anchor again (vendor/flash-attention/README.md)"
            for path in paths if isinstance(path, str) and path and (why := _path_problem(path))]


def build_problems(where: str, entry: dict, knobs: dict) -> list[str]:
    """families.<name>.build of a compiled family: what the one target function
    (cmake/FamilyTarget.cmake) and the kernel rule (cmake/KernelSelection.cmake) read."""
    build, at = entry["build"], f"{where}.build"
    if not isinstance(build, dict) or build.keys() - _BUILD_FIELDS:
        got = sorted(build) if isinstance(build, dict) else build
        return [f"{at} must be an object of {sorted(_BUILD_FIELDS)}, got {got!r}"]
    found = []
    for field in ("head_dims_knob", "dtypes_knob"):
        if not entry.get(field):
            found.append(f"{where}.{field}: a compiled family names the knob that selects its kernels' {field[:-5]}")
    sources = build.get("sources")
    if not (_words(sources) and all(sources)):
        found.append(f"{at}.sources must be a list of paths inside the upstream tree (compiled in every build of "
                     f"the module), got {sources!r}")
    else:
        found += _paths_outside(f"{at}.sources", sources)
    groups = build.get("include_dirs")
    if not (isinstance(groups, list) and all(_words(g) and len(g) > 1 and g[0] in _COMPONENTS and all(g[1:])
                                             for g in groups)):
        found.append(f"{at}.include_dirs must be a list of [component, folders...], the component one of "
                     f"{', '.join(_COMPONENTS)}, got {groups!r}")
    else:
        for group in groups:
            found += _paths_outside(f"{at}.include_dirs", group[1:], group[0], "the include directory ")
    if not _words(build.get("defines", [])):
        found.append(f"{at}.defines must be a list of words, got {build.get('defines')!r}")
    sixteenths = build.get("memory_sixteenths", 16)
    if isinstance(sixteenths, bool) or not isinstance(sixteenths, int) or not 1 <= sixteenths <= 16:
        found.append(f"{at}.memory_sixteenths must be a whole number from 1 to 16 (its CUDA units' share of "
                     f"VFA_JOB_MEMORY_MB), got {sixteenths!r}")
    number = re.compile(r"[0-9]+(\.[0-9]+)?")
    kinds = build.get("unit_kinds", [])
    if not (isinstance(kinds, list) and all(
            _words(k) and len(k) == 4 and number.fullmatch(k[1]) and (not k[3] or number.fullmatch(k[3]))
            and not re.search(r"[|;]", k[0] + k[2]) for k in kinds)):
        found.append(f"{at}.unit_kinds must be a list of [kind, seconds, path text, cached seconds] (strings; no "
                     f"'|' or ';'), got {kinds!r}")
    kernels = build.get("kernels")
    if not isinstance(kernels, dict) or kernels.keys() - _KERNELS_FIELDS:
        return found + [f"{at}.kernels must be an object of {sorted(_KERNELS_FIELDS)}"]
    return found + _kernels_problems(f"{at}.kernels", kernels, entry, knobs)


def _choices(knobs: dict, knob: Any) -> list[str]:
    decl = knobs.get(knob) if isinstance(knob, str) else None
    return list(decl.get("choices", [])) if isinstance(decl, dict) else []


def _kernels_problems(at: str, kernels: dict, entry: dict, knobs: dict) -> list[str]:
    """The kernel rule: its names are choices of the family's selection knobs, its placeholders
    are filled, its stubs and knobs exist."""
    found = []
    head_dims, dtypes = _choices(knobs, entry.get("head_dims_knob")), _choices(knobs, entry.get("dtypes_knob"))
    features = _choices(knobs, entry.get("features_knob"))
    left_out = kernels.get("left_out", "disable")
    if left_out not in ("stub", "disable"):
        found.append(f"{at}.left_out must be stub or disable, got {left_out!r}")
    variants = kernels.get("variants")
    if not (isinstance(variants, list) and variants and all(isinstance(v, dict) for v in variants)):
        return found + [f"{at}.variants must be a non-empty list of objects, got {variants!r}"]
    template = kernels.get("file")
    if not _relative(template):
        found.append(f"{at}.file must be a path inside the upstream tree, got {template!r}")
        template = ""
    stubs = kernels.get("stubs") if isinstance(kernels.get("stubs"), dict) else {}
    stub_kinds = stubs.get("kinds") if isinstance(stubs.get("kinds"), dict) else {}
    for i, variant in enumerate(variants):
        here = f"{at}.variants[{i}]"
        strings = {k for k, v in variant.items() if isinstance(v, str)}
        unfilled = sorted(set(_PLACEHOLDER.findall(template)) - strings - {"kernel", "head_dim", "dtype"})
        if unfilled:
            found.append(f"{here} leaves {', '.join('{' + u + '}' for u in unfilled)} of {at}.file unfilled: give it "
                         f"those fields")
        for field, allowed in (("features", features), ("head_dims", head_dims)):
            if field in variant and not (_words(variant[field]) and set(variant[field]) <= set(allowed)):
                found.append(f"{here}.{field} must be a list of the choices of its knob ({', '.join(allowed)}), got "
                             f"{variant[field]!r}")
        if not isinstance(variant.get("extra_only", False), bool):
            found.append(f"{here}.extra_only must be true or false")
        if "stub" in variant and (left_out != "stub" or variant["stub"] not in stub_kinds):
            found.append(f"{here}.stub {variant['stub']!r} names no kind of {at}.stubs.kinds (and left_out must be "
                         f"stub): declare it there, or remove it")
    if left_out == "stub":
        types = stubs.get("types") if isinstance(stubs.get("types"), dict) else {}
        if not (_words(stubs.get("includes")) and isinstance(stubs.get("namespace"), str) and set(dtypes) <= set(types)
                and all(isinstance(k, dict) and isinstance(k.get("definition"), str) and isinstance(k.get("what"), str)
                        for k in stub_kinds.values())):
            found.append(f"{at}.stubs must hold includes, namespace, a C++ type for each of {', '.join(dtypes)} "
                         f"(types), and per kind its definition and what its error calls it (kinds)")
    for extra in kernels.get("extra_kernels", []):
        if not (isinstance(extra, dict) and isinstance(extra.get("kernel"), str) and extra.get("head_dim") in head_dims
                and set(extra.get("features", [])) <= set(features) and set(extra.get("dtypes", [])) <= set(dtypes)):
            found.append(f"{at}.extra_kernels: {extra!r} must name its kernel, one head dim of {head_dims}, and "
                         f"features and dtypes of its family's choices")
    for pair in kernels.get("required_dtypes", []):
        if not (_words(pair) and len(pair) == 2 and pair[0] in dtypes):
            found.append(f"{at}.required_dtypes: {pair!r} must be [a dtype of {dtypes}, why]")
    disable = kernels.get("disable", {})
    if not isinstance(disable, dict) or disable.keys() - {"head_dim", "dtypes", "features"}:
        found.append(f"{at}.disable must be an object of head_dim, dtypes, features")
    else:
        if not _words(disable.get("head_dim", [])):
            found.append(f"{at}.disable.head_dim must be a list of define templates ({{head_dim}})")
        for axis, allowed in (("dtypes", dtypes), ("features", features)):
            if not all(_words(p) and len(p) > 1 and p[0] in allowed for p in disable.get(axis, [])):
                found.append(f"{at}.disable.{axis} must be a list of [one of {allowed}, defines...]")
    for rule in kernels.get("knob_defines", []):
        decl = knobs.get(rule[0]) if _words(rule) and rule else None
        if not (isinstance(decl, dict) and decl.get("type") == "bool" and decl.get("scope") == "build"
                and len(rule) > 2 and rule[1] in ("ON", "OFF")):
            found.append(f"{at}.knob_defines: {rule!r} must be [a bool build knob, ON or OFF, defines...]")
    return found


def presets_problems(where: str, entry: dict, knobs: dict) -> list[str]:
    """The presets of a family's selection knobs: presets VFA_PRESET has, values among the choices."""
    found = []
    presets = _choices(knobs, "VFA_PRESET")
    for field in ("head_dims_knob", "dtypes_knob", "features_knob"):
        knob = entry.get(field)
        decl = knobs.get(knob) if isinstance(knob, str) else None
        if not isinstance(decl, dict) or "presets" not in decl:
            continue
        table = decl["presets"]
        if not isinstance(table, dict) or not all(name in presets and _words(values)
                                                   and set(values) <= set(decl.get("choices", []))
                                                   for name, values in table.items()):
            found.append(f"{knob}.presets (the {field[:-5]} {where} selects in a preset) must map presets of "
                         f"VFA_PRESET ({', '.join(presets)}) to lists of its choices, got {table!r}")
    return found


def _declared_for(caps: dict, cap: tuple[int, int]) -> bool:
    """Whether capabilities (min, generations, excluded) declare a GPU of ``cap``."""
    generations = {str(k) for k in caps.get("generations", {})}
    return (cap >= cuda_archs.capability(caps["min"]) and str(cap[0]) not in {str(k) for k in caps.get("excluded", {})}
            and (not generations or str(cap[0]) in generations))


def archs_of(archs: dict) -> Archs:
    """The archs of a declaration problems() found no fault in."""
    return Archs(sass=tuple(archs.get("sass", ())), sass_knobs=dict(archs.get("sass_knobs", {})),
                 a=tuple(archs.get("a", ())), ptx=archs.get("ptx", ""), ptx_knob=archs.get("ptx_knob", ""),
                 nvcc=archs.get("nvcc", ""), dsl=archs.get("dsl", ""))
