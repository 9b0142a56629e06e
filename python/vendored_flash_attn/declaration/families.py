"""The kernel families (FA2, FA3, FA4, ...), as ``cmake/knobs.json``'s ``families`` section
declares them once.

Every module that needs to know what a family is asks here: the selector (which versions
exist, the GPUs each runs on, the default per GPU generation, where a request falls back
to), ``build_info`` (where each family's build record is), ``environment`` (what loading a
family means: import its compiled module, or find its staged subpackage and check its
dependencies), the interface (the adapter a call goes to), ``info`` and ``wheel_check``
(which families there are and what a wheel that has one must hold). Adding a family is one
entry in the declaration (with its knobs) plus its adapter module, and for a compiled family its
sources under the pin's verified paths: tests/build/test_fifth_family.py builds, selects,
validates, records and checks a fifth compiled family added so (its kernels following the
declared kernel rule; a packaged family also needs its cmake/<NAME>Package.cmake).

Standard library only, and nothing is imported here but the declaration: ``wheel_check``
runs with no torch, and ``import vendored_flash_attn`` must import no family's code.

One file over 500 lines, on purpose: the reader (Family, CallRules, Registry) and the
declaration's validator (parse) are about the same fields: the validator takes the call
rules' names off CallRules and checks a family's fields (_FIELDS) beside the Family they
fill; apart, each would hold its own list of what a family declares.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

from . import cuda_archs, family_build, json_types, knob_values

from .family_build import CUTE_DSL, EXTENSION, MADE, Archs  # noqa: F401  (re-exported)
from .family_build import closest as _closest
BUILD_INFO_RECORD = "build_info.json:"  # record in the main build info, under this family's key


KV_LAYOUTS = ("packed", "paged", "batched")


class FamilyDeclarationError(ValueError):
    """The ``families`` section of cmake/knobs.json is malformed."""


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


_CALL_FIELDS = {f.name for f in dataclasses.fields(CallRules)}  # what a family's `call` may hold


def _head_sizes_problems(where: str, call: dict, caps: Any) -> list[str]:
    """call.head_sizes: {generation: [[Q/K min, Q/K max, V min, V max], ...]}, each generation
    one the family runs on (its capabilities' generations)."""
    if "head_sizes" not in call:
        return []
    table = call["head_sizes"]
    try:
        entries = [tuple(int(n) for n in entry) for rows in table.values() for entry in rows]
    except (AttributeError, TypeError, ValueError):
        entries = []
    if not entries or not all(len(e) == 4 and e[0] <= e[1] and e[2] <= e[3] for e in entries):
        return [f"{where}.call.head_sizes must map each generation to a list of [Q/K min, Q/K max, V min, V max], "
                f"got {table!r}"]
    named = {str(v) for v in (caps.get("generations", {}) if isinstance(caps, dict) else {}).values()}
    unknown = sorted(set(map(str, table)) - named)
    if unknown:
        return [f"{where}.call.head_sizes names generations it does not run on: {unknown}: name those of "
                f"capabilities.generations ({', '.join(sorted(named))})"]
    return []


def _call_rules(call: dict) -> CallRules:
    """The call rules of an entry problems() found no fault in."""
    fields = {k: tuple(v) if k in ("kv_layouts", "fp8_kv_head_dims") else v for k, v in call.items()}
    if "head_sizes" in call:
        fields["head_sizes"] = {str(gen): tuple(tuple(int(n) for n in entry) for entry in entries)
                                for gen, entries in call["head_sizes"].items()}
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
    archs: Archs = Archs()
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
           "install", "head_size_rule", "call", "pythons", "archs", "build"}
# Family fields made from others (capabilities -> min_capability, generations, excluded; the key ->
# name), not JSON fields of their own; every other field is one, typed by its annotation
# (json_types: the validator's typed check and cmake/knobs.schema.json read the same annotation).
DERIVED_FIELDS = {"name", "min_capability", "generations", "excluded", "selectable_features", "raw"}
# JSON fields the declaration spells otherwise than Family holds them: checked below by hand.
_SPELLED = {"capabilities", "default_on", "build"}
_REQUIRED = {"version", "made", "build_knob", "capabilities", "dtypes", "features", "default_on",
             "fallback", "adapter", "record"}
_REQUIRED_BY_MADE = {EXTENSION: {"module", "op_namespace", "forward_op", "archs", "build"},
                     CUTE_DSL: {"subpackage", "probe", "deps_check", "install"}}
_SECTION_FIELDS = ("about", "default_order")
_MAJOR = re.compile(r"[1-9][0-9]*")
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# A family's name becomes a CMake list item and variable part (VFA_<NAME>_GENCODE), a key of
# build_info.json and of CMake's string(JSON) paths, and a word of messages: lower-case letters,
# digits and _ only (a ';' splits a CMake list, a '.' or a space a path).
FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]*")
# The knob whose choices are the families' versions (fa_version= and the environment).
VERSION_KNOB = "VLLM_FLASH_ATTN_VERSION"
_FIX = "(the section's \"about\" lines say what each field holds)"


def problems(data: Any) -> list[str]:
    """Every mistake of the declaration's ``families`` section, each naming the field
    (``families.<name>.<field>``) and the fix; [] when there is none.

    The one validator of the declaration: the package calls it (parse(), at first use) and
    so does the configure (cmake/Families.cmake runs ``python -m vendored_flash_attn.declaration.families
    check FILE``), so a mistake stops the build with the same words before anything is
    compiled. Standard library only.
    """
    if not isinstance(data, dict) or not isinstance(data.get("families"), dict):
        return ['cmake/knobs.json has no "families" section (an object of families): restore it '
                'from the repository']
    section, knobs = data["families"], data.get("knobs", {})
    found: list[str] = []
    names = [n for n in section if n not in _SECTION_FIELDS]
    versions: dict[int, str] = {}
    modules: dict[str, str] = {}
    records: dict[str, str] = {}
    for name in names:
        if not FAMILY_NAME.fullmatch(name):
            found.append(f"families.{name}: a family name is lower-case letters, digits and _ (such as fa5): the "
                         f"build makes CMake list items and variables (VFA_<NAME>_GENCODE) and build_info.json "
                         f"keys of it, where {name!r} does not survive; rename it")
            continue
        found += _entry_problems(name, section[name], knobs, names, versions, modules, records)
    found += _version_knob_problems(knobs, versions)
    table_problems = cuda_archs.problems(data)
    found += table_problems
    table = None if table_problems else cuda_archs.parse(data)
    for name in names:
        if isinstance(section[name], dict) and "archs" in section[name]:
            found += family_build.archs_problems(f"families.{name}", section[name], knobs, table)
        if isinstance(section[name], dict) and section[name].get("made") == EXTENSION and "build" in section[name]:
            found += family_build.build_problems(f"families.{name}", section[name], knobs)
        if isinstance(section[name], dict):
            found += family_build.presets_problems(f"families.{name}", section[name], knobs)
    order = section.get("default_order")
    where = "families.default_order"
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        found.append(f"{where} must be a list of family names, every family once (the selector's default "
                     f"order): list {', '.join(names)}")
    else:
        for n in order:
            if n not in names:
                found.append(f"{where} names {n!r}, which is no family{_closest(n, names)}: list every family "
                             f"once ({', '.join(names)})")
        twice = sorted({n for n in order if order.count(n) > 1})
        left = [n for n in names if n not in order]
        if twice or left:
            found.append(f"{where} {order} must list every family once ({', '.join(names)}): "
                         + "; ".join(([f"{', '.join(twice)} more than once"] if twice else [])
                                     + ([f"{', '.join(left)} missing"] if left else [])))
    return found


def _version_knob_problems(knobs: Any, versions: dict[int, str]) -> list[str]:
    """VLLM_FLASH_ATTN_VERSION's choices are the families' versions: a family whose version the
    knob refuses cannot be forced, and a choice no family has would be taken and then fail."""
    knob = knobs.get(VERSION_KNOB) if isinstance(knobs, dict) else None
    choices = knob.get("choices") if isinstance(knob, dict) else None
    want = [str(v) for v in sorted(versions)]
    if not isinstance(choices, list) or sorted(map(str, choices), key=lambda c: (len(c), c)) != want:
        return [f"knobs.{VERSION_KNOB}.choices {choices!r} are not the families' versions: set them to "
                f"{want!r} (a family's version is what fa_version= and {VERSION_KNOB} take)"]
    return []


def _entry_problems(name: str, entry: Any, knobs: dict, names: list[str], versions: dict, modules: dict,
                    records: dict) -> list[str]:
    where = f"families.{name}"
    if not isinstance(entry, dict):
        return [f"{where} must be an object (a family's fields {_FIX})"]
    found: list[str] = []
    made = entry.get("made")
    required = set(_REQUIRED)
    if made in _REQUIRED_BY_MADE:
        required |= _REQUIRED_BY_MADE[made]
    elif "made" in entry:
        found.append(f"{where}.made {made!r} is not one of {', '.join(MADE)}{_closest(made, MADE)}: "
                     f"extension for a CUDA extension this build compiles, cute_dsl for staged CuTe DSL kernels")
    unknown = sorted(entry.keys() - _FIELDS)
    missing = sorted(required - entry.keys())
    if missing or unknown:
        hints = "".join(f"; {u}{_closest(u, _FIELDS)}" for u in unknown if _closest(u, _FIELDS))
        found.append(f"{where}: missing fields {missing}, unknown fields {unknown}{hints}: add the missing, "
                     f"rename or remove the unknown {_FIX}")
    version = entry.get("version")
    if "version" in entry:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            found.append(f"{where}.version must be a whole number >= 1 (what fa_version= takes), got {version!r}")
        elif version in versions:
            found.append(f"{where}.version {version} is also {versions[version]}'s: families declare a version "
                         f"twice; give each family its own version (and VLLM_FLASH_ATTN_VERSION's choices)")
        else:
            versions[version] = name
    for field in ("build_knob", "head_dims_knob", "dtypes_knob", "features_knob"):
        knob = entry.get(field)
        if knob is None and field != "build_knob":
            continue
        if field in entry and (not isinstance(knob, str) or knob not in knobs):
            found.append(f"{where}.{field}: {knob} is not a knob of cmake/knobs.json{_closest(knob, knobs)}: "
                         f"name a declared knob" + ("" if field == "build_knob" else ", or null"))
    for field in ("adapter", "head_size_rule", "deps_check"):
        value = entry.get(field)
        if value is not None and field in entry and not (isinstance(value, str) and _REFERENCE.fullmatch(value)):
            found.append(f"{where}.{field} must be module:function (such as vendored_flash_attn.families.fa2:forward), "
                         f"got {value!r}")
    found += _capability_problems(where, entry)
    found += _default_problems(where, entry)
    fallback = entry.get("fallback")
    if "fallback" in entry and fallback is not None and (fallback not in names or fallback == name):
        found.append(f"{where}.fallback {fallback!r} names no other family{_closest(fallback, names)}: name "
                     f"one of {', '.join(n for n in names if n != name)}, or null")
    record = entry.get("record")
    if "record" in entry:
        if not isinstance(record, str) or not record or record.startswith(("/", "..")):
            found.append(f"{where}.record must be \"{BUILD_INFO_RECORD}<key>\" or a file inside the package, "
                         f"got {record!r}")
        elif record in records:
            found.append(f"{where}.record {record!r} is also {records[record]}'s: give each family its own record")
        else:
            records[record] = name
    if made == EXTENSION:
        module, namespace = entry.get("module"), entry.get("op_namespace")
        if "module" in entry and not (isinstance(module, str) and _IDENTIFIER.fullmatch(module)):
            found.append(f"{where}.module must be a Python module name, got {module!r}")
        elif isinstance(module, str):
            if module in modules:
                found.append(f"{where}.module {module!r} is also {modules[module]}'s: give each its own module")
            modules[module] = name
            if "op_namespace" in entry and namespace != module:
                # cmake/TorchExtension.cmake compiles TORCH_EXTENSION_NAME=<module>, under which
                # upstream's registration (STABLE_TORCH_LIBRARY) puts its ops: torch.ops.<module>.
                found.append(f"{where}.op_namespace {namespace!r} is not its module {module!r}: the build "
                             f"registers the module's ops under its own name (TORCH_EXTENSION_NAME), so the "
                             f"namespace follows the module; set op_namespace to {module!r} (rename both together)")
    for field in ("dtypes", "features", "artefacts"):
        value = entry.get(field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            found.append(f"{where}.{field} must be a list of words, got {value!r}")
    call = entry.get("call", {})
    if not isinstance(call, dict) or call.keys() - _CALL_FIELDS:
        found.append(f"{where}.call must be an object of {sorted(_CALL_FIELDS)}"
                     + (f", not {sorted(call.keys() - _CALL_FIELDS)}" if isinstance(call, dict) else ""))
    elif set(call.get("kv_layouts", KV_LAYOUTS)) - set(KV_LAYOUTS):
        found.append(f"{where}.call.kv_layouts must be of {', '.join(KV_LAYOUTS)}, got {call['kv_layouts']}")
    else:
        if not isinstance(call.get("cuda_graphs", True), bool) or (
                call.get("cuda_graphs") is False and not call.get("cuda_graphs_why")):
            found.append(f"{where}.call.cuda_graphs must be true or false, and false needs call.cuda_graphs_why "
                         "(what the interface's refusal under capture says)")
        found += _head_sizes_problems(where, call, entry.get("capabilities"))
    pythons = entry.get("pythons", [])
    if not isinstance(pythons, list) or not all(isinstance(v, str) and re.fullmatch(r"3\.\d+", v) for v in pythons):
        found.append(f"{where}.pythons must be a list of Python minors such as \"3.12\", got {pythons!r}")
    # Every other field's type, as its annotation says (where no rule above already named the field).
    hints = _family_hints()
    for field in sorted(entry.keys() & hints.keys() - _SPELLED - DERIVED_FIELDS):
        wrong = json_types.problem(entry[field], hints[field])
        if wrong and not any(p.startswith((f"{where}.{field} ", f"{where}.{field}.", f"{where}.{field}:"))
                             for p in found):
            found.append(f"{where}.{field}{'' if wrong.startswith('.') else ' '}{wrong}")
    return found


def _family_hints() -> dict[str, Any]:
    return json_types.hints(Family)


def _capability_problems(where: str, entry: dict) -> list[str]:
    caps = entry.get("capabilities")
    if "capabilities" not in entry:
        return []
    where = f"{where}.capabilities"
    if (not isinstance(caps, dict) or not isinstance(caps.get("min"), str)
            or not cuda_archs.CAPABILITY.fullmatch(caps["min"])):
        return [f"{where}.min must be a compute capability such as \"8.0\" (the lowest it runs on), in an object "
                f"with optional generations and excluded, got {caps!r}"]
    found = []
    unknown = sorted(caps.keys() - {"min", "generations", "excluded"})
    if unknown:
        found.append(f"{where} has unknown fields {unknown}: min, generations and excluded are what it holds")
    maps = {}
    for field in ("generations", "excluded"):
        value = caps.get(field, {})
        if not isinstance(value, dict) or not all(_MAJOR.fullmatch(str(k)) and isinstance(v, str)
                                                   for k, v in value.items()):
            found.append(f"{where}.{field} must be an object of {{\"<major>\": \"<words>\"}} (\"9\": \"sm90\"), "
                         f"got {value!r}")
            value = {}
        maps[field] = {int(k) for k in value}
    lowest = int(caps["min"].split(".")[0])
    both = sorted(maps["generations"] & maps["excluded"])
    if both:
        found.append(f"{where}: generation {', '.join(map(str, both))} is both in generations and excluded: "
                     f"a family runs on a generation or does not; take it out of one of them")
    below = sorted(m for m in maps["generations"] if m < lowest)
    if below:
        found.append(f"{where}.generations {', '.join(map(str, below))} lie below min {caps['min']}: lower min, "
                     f"or drop them")
    if lowest in maps["excluded"] and lowest not in maps["generations"]:  # (in both: said above)
        found.append(f"{where}.min {caps['min']} is of generation {lowest}, which excluded says it does not run "
                     f"on: raise min to the lowest generation it runs on, or take \"{lowest}\" out of excluded")
    elif maps["generations"] and lowest not in maps["generations"]:
        found.append(f"{where}.min {caps['min']} is of generation {lowest}, which generations "
                     f"({', '.join(map(str, sorted(maps['generations'])))}) leaves out: add \"{lowest}\" to "
                     f"generations, or raise min to the lowest generation it runs on")
    return found


def _default_problems(where: str, entry: dict) -> list[str]:
    if "default_on" not in entry:
        return []
    default_on, found = entry["default_on"], []
    if default_on != "all" and not (isinstance(default_on, list) and all(
            isinstance(m, int) and not isinstance(m, bool) for m in default_on)):
        return [f"{where}.default_on must be \"all\" or a list of GPU majors (9, 10), got {default_on!r}"]
    caps = entry.get("capabilities")
    if isinstance(default_on, list) and isinstance(caps, dict) and isinstance(caps.get("min"), str) \
            and cuda_archs.CAPABILITY.fullmatch(caps["min"]):
        lowest = int(caps["min"].split(".")[0])
        generations = {int(k) for k in caps.get("generations", {}) if _MAJOR.fullmatch(str(k))}
        excluded = {int(k) for k in caps.get("excluded", {}) if _MAJOR.fullmatch(str(k))}
        cannot = [m for m in default_on if m < lowest or m in excluded or (generations and m not in generations)]
        if cannot:
            found.append(f"{where}.default_on names {', '.join(map(str, cannot))}, where its capabilities say it "
                         f"does not run: take them out, or declare the generation in capabilities")
    not_default = entry.get("not_default", {})
    if not isinstance(not_default, dict) or not all(_MAJOR.fullmatch(str(k)) and isinstance(v, str)
                                                    for k, v in not_default.items()):
        found.append(f"{where}.not_default must be an object of {{\"<major>\": \"why\"}}, got {not_default!r}")
    return found


def _family(name: str, entry: dict, knobs: dict) -> Family:
    """One family of a declaration problems() found no fault in."""
    default_on = entry["default_on"]
    caps = entry["capabilities"]
    return Family(
        name=name, version=int(entry["version"]), made=entry["made"], build_knob=entry["build_knob"],
        min_capability=cuda_archs.capability(caps["min"]),
        generations={int(k): str(v) for k, v in caps.get("generations", {}).items()},
        excluded={int(k): str(v) for k, v in caps.get("excluded", {}).items()},
        dtypes=tuple(entry["dtypes"]), features=tuple(entry["features"]),
        default_on=None if default_on == "all" else tuple(int(m) for m in default_on),
        not_default={int(k): str(v) for k, v in entry.get("not_default", {}).items()},
        fallback=entry["fallback"], adapter=entry["adapter"], record=entry["record"],
        call=_call_rules(entry.get("call", {})),
        head_size_rule=entry.get("head_size_rule"),
        artefacts=tuple(entry.get("artefacts", ())),
        head_dims_knob=entry.get("head_dims_knob"), dtypes_knob=entry.get("dtypes_knob"),
        features_knob=entry.get("features_knob"),
        module=entry.get("module", ""), op_namespace=entry.get("op_namespace", ""),
        forward_op=entry.get("forward_op", ""), subpackage=entry.get("subpackage", ""),
        probe=entry.get("probe", ""), deps_check=entry.get("deps_check", ""),
        install=entry.get("install", ""), pythons=tuple(entry.get("pythons", [])),
        selectable_features=tuple(knobs[entry["features_knob"]].get("choices", ()))
        if entry.get("features_knob") else (),
        archs=family_build.archs_of(entry.get("archs", {})),
        raw=entry)


@dataclass(frozen=True)
class Registry:
    """The declared families, in declaration order, and the selector's default order."""

    families: tuple[Family, ...]
    default_order: tuple[str, ...]
    # The arch table (cuda_archs): which GPUs a compiled family's code (its build record's
    # gencode) runs on.
    cuda_archs: cuda_archs.Table = cuda_archs.Table({}, {})

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
    """The registry of a declaration; FamilyDeclarationError naming every mistake (problems())."""
    found = problems(data)
    if found:
        raise FamilyDeclarationError("cmake/knobs.json, families section:\n  " + "\n  ".join(found))
    section, knobs = data["families"], data.get("knobs", {})
    families = tuple(_family(name, entry, knobs) for name, entry in section.items() if name not in _SECTION_FIELDS)
    return Registry(families, tuple(section["default_order"]), cuda_archs.parse(data))


_registry: Optional[Registry] = None


def registry() -> Registry:
    """The families this package declares (read once)."""
    global _registry
    if _registry is None:
        _registry = parse(knob_values.load())
    return _registry


def set_registry(new: Optional[Registry]) -> Optional[Registry]:
    """Replace the registry (None: the installed declaration again); returns the previous one.
    Tests use it with a copy of the declaration; the selector's caches are cleared by the
    environment swap that follows (environment.set_environment)."""
    global _registry
    previous, _registry = _registry, new
    return previous


def _module_source(module: str, where: list[str]) -> Optional[Any]:
    """The spec of ``module`` found on ``where`` without importing it (or a parent package:
    their code may need torch, which the configure's Python need not have); None when absent."""
    from importlib.machinery import PathFinder

    spec, search = None, where
    parts = module.split(".")
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return spec


def _defines(path: str, name: str) -> bool:
    """Whether the Python source at ``path`` binds ``name`` at its top level."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def reference_problems(data: dict, where: list[str]) -> list[str]:
    """The families' module:function references (adapter, head_size_rule, deps_check) that name
    a module not found on ``where`` (the project's python/ folder, at configure) or a function
    its source does not define: found without importing anything, so the configure stops on a
    renamed or missing adapter instead of a wheel that fails at its first call."""
    found = []
    section = data.get("families", {}) if isinstance(data, dict) else {}
    for name, entry in section.items():
        if name in _SECTION_FIELDS or not isinstance(entry, dict):
            continue
        for field in ("adapter", "head_size_rule", "deps_check"):
            value = entry.get(field)
            if not (isinstance(value, str) and _REFERENCE.fullmatch(value)):
                continue  # problems() names it
            module, _, function = value.partition(":")
            spec = _module_source(module, where)
            if spec is None:
                found.append(f"families.{name}.{field}: module {module} is not there (looked in "
                             f"{', '.join(where)}): add it, or name the module that has the {field}")
            elif isinstance(spec.origin, str) and spec.origin.endswith(".py") and not _defines(spec.origin, function):
                found.append(f"families.{name}.{field}: {spec.origin} defines no {function}: add it, or name "
                             f"the function it has")
    return found


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m vendored_flash_attn.declaration.families check FILE``: the declaration's mistakes, one a
    line, exit status 1 when there is any (cmake/Families.cmake runs it at configure): those
    problems() finds and the references to modules of the python/ folder holding this package
    (reference_problems)."""
    import os
    import sys

    read = json_types.declaration_command(sys.argv[1:] if argv is None else argv,
                                          "vendored_flash_attn.declaration.families", "check", (), errors=sys.stderr)
    if isinstance(read, int):
        return read
    _, data = read
    found = problems(data)
    if not found:
        found = reference_problems(data, [os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))])
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
