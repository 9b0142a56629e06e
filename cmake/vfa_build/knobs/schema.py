"""cmake/knobs.schema.json, the JSON Schema of cmake/knobs.json, made from the typed model its
readers parse into, as scikit-build-core makes its settings' schema from their declaration:

* a knob: ``Knob`` (cmake/vfa_build/knobs/knobs.py);
* a kernel family: ``Family`` with its ``CallRules`` (python/vendored_flash_attn/declaration/families.py) and
  ``Archs`` (family_build.py), the JSON fields the validator knows (families._FIELDS: a field
  no model types stops the generation);
* a row of the arch table: ``Row`` (cuda_archs.py).

``python cmake/vfa_build knobs.knobs write`` writes it (beside docs/knobs.md's tables) and ``check`` fails when the
committed file is not what the model makes; tests/unit/test_knob_schema.py validates the
declaration against it with jsonschema and holds the model and the schema together on a corpus
of broken declarations. Editors read it through the declaration's ``"$schema"``. The configure
does not need jsonschema: the model's own typed parse (knobs.py validate, families check) stops on
the first error with its JSON path and the fix. The schema never refuses what the model takes;
rules across fields beyond the ones written here (a default among the choices, versions, arch
rules) are the typed parse's alone.

Standard library only.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

PROJECT = Path(__file__).resolve().parents[3]
SCHEMA_FILE = PROJECT / "cmake" / "knobs.schema.json"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _package() -> tuple[ModuleType, ...]:
    """The package's model modules, from this checkout (standard library only, no torch)."""
    python = str(PROJECT / "python")
    if python not in sys.path:
        sys.path.insert(0, python)
    from vendored_flash_attn.declaration import cuda_archs, families, family_build, json_types

    return cuda_archs, families, family_build, json_types


def _words() -> dict:
    return {"type": "array", "items": {"type": "string"}}


def _knob(knobs: ModuleType, json_types: ModuleType) -> dict:
    out = json_types.object_schema(knobs.Knob, skip=frozenset({"name"}),
                        type={"enum": list(knobs.TYPES)}, scope={"enum": list(knobs.SCOPES)},
                        doc={"type": "string", "pattern": r"^[^\n]*\S[^\n]*$"},
                        choices={"type": "array", "uniqueItems": True,
                                 "items": {"type": "string", "pattern": f"^{knobs.CHOICE.pattern}$"}})
    # The cross-field rules of the typed parse (knobs._knob) a schema can say.
    out["allOf"] = [
        {"if": {"properties": {"type": {"enum": ["choice", "list"]}}},
         "then": {"required": ["choices"]}, "else": {"not": {"required": ["choices"]}}},
        {"if": {"properties": {"type": {"const": "int"}}},
         "then": {"required": ["min", "max"]}, "else": {"allOf": [{"not": {"required": ["min"]}},
                                                                   {"not": {"required": ["max"]}}]}},
    ]
    return out


def _family(cuda_archs: ModuleType, families: ModuleType, family_build: ModuleType, json_types: ModuleType) -> dict:
    """A family's JSON fields (families._FIELDS), typed by the Family it parses into; the fields
    the JSON spells otherwise (capabilities, default_on) or the validator keeps raw (build)."""
    hints = typing.get_type_hints(families.Family)
    untyped = set(hints) - families._FIELDS - families.DERIVED_FIELDS
    if untyped:
        raise TypeError(f"Family fields {sorted(untyped)} are neither declared JSON fields (families._FIELDS) nor "
                        "derived ones (families.DERIVED_FIELDS): declare them")
    schema = json_types.schema
    spelled = {
        "capabilities": {"type": "object", "properties": {
            "min": {"type": "string", "pattern": f"^{cuda_archs.CAPABILITY.pattern}$"},
            "generations": schema(hints["generations"]), "excluded": schema(hints["excluded"])},
            "required": ["min"], "additionalProperties": False},
        "default_on": {"anyOf": [{"const": "all"}, schema(tuple[int, ...])]},
        "made": {"enum": list(family_build.MADE)},
        "version": {"type": "integer", "minimum": 1},
        "build": {"type": "object", "properties": {
            **{name: {} for name in sorted(family_build._BUILD_FIELDS - {"kernels"})},
            "kernels": {"type": "object", "properties": {name: {} for name in sorted(family_build._KERNELS_FIELDS)},
                        "additionalProperties": False}},
            "additionalProperties": False},
    }
    props = {}
    for name in sorted(families._FIELDS):
        if name in spelled:
            props[name] = spelled[name]
        elif name in hints:
            props[name] = schema(hints[name])
        else:
            raise TypeError(f"families._FIELDS declares {name!r}, which no model types: add it to Family, or "
                            "spell it in cmake/vfa_build/knobs/schema.py")
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": sorted(families._REQUIRED),
            "allOf": [{"if": {"properties": {"made": {"const": made}}, "required": ["made"]},
                       "then": {"required": sorted(fields)}}
                      for made, fields in sorted(families._REQUIRED_BY_MADE.items())]}


def _section(knobs: ModuleType, name: str, **fields: dict) -> dict:
    """A small section (knobs.SECTIONS: its fields and those required) of ``fields``' schemas."""
    allowed, required = knobs.SECTIONS[name]
    if set(fields) != allowed:
        raise TypeError(f"knobs.SECTIONS[{name!r}] holds {sorted(allowed)}, the schema {sorted(fields)}")
    return {"type": "object", "properties": fields, "required": sorted(required), "additionalProperties": False}


def schema(knobs: ModuleType) -> dict:
    """The schema of the whole declaration (``knobs``: cmake/vfa_build/knobs/knobs.py, the Knob model's module)."""
    cuda_archs, families, family_build, json_types = _package()
    capability = f"^{cuda_archs.CAPABILITY.pattern}$"
    sections = {
        "$schema": {"type": "string"},
        "about": _words(),
        "bool_words": _section(knobs, "bool_words", about={"type": "string"}, on=_words(), off=_words()),
        "cache_variables": _section(knobs, "cache_variables", about={"type": "string"}, names=_words()),
        "cibuildwheel_pass_through": _section(knobs, "cibuildwheel_pass_through", about={"type": "string"},
                                              names=_words()),
        "knobs": {"type": "object", "propertyNames": {"pattern": "^[A-Z][A-Z0-9_]*$"},
                  "additionalProperties": _knob(knobs, json_types)},
        "cuda_archs": _section(
            knobs, "cuda_archs", about=_words(),
            names={"type": "object", "propertyNames": {"pattern": "^[A-Za-z]+$"},
                   "additionalProperties": {"type": "array", "minItems": 1, "items": {
                       "type": "string", "pattern": f"{capability[:-1]}(\\+PTX)?$"}}},
            table={"type": "object", "propertyNames": {"pattern": capability},
                   "additionalProperties": json_types.object_schema(cuda_archs.Row, skip=frozenset({"capability"}))}),
        "families": {"type": "object", "properties": {"about": _words(), "default_order": _words()},
                     # a family is every other key (patternProperties also match the section's own)
                     "patternProperties": {
                         "^(?!" + "|".join(f"{n}$" for n in families._SECTION_FIELDS) + ")"
                         + f"{families.FAMILY_NAME.pattern}$": _family(cuda_archs, families, family_build, json_types)},
                     "required": ["default_order"], "additionalProperties": False},
    }
    if set(sections) != set(knobs.SECTIONS):
        raise TypeError(f"knobs.SECTIONS {sorted(knobs.SECTIONS)} and the schema's {sorted(sections)} differ")
    return {
        "$schema": DRAFT,
        "title": "vendored-flash-attn's declaration (cmake/knobs.json)",
        "description": "Generated from the typed model of its readers by `python cmake/vfa_build knobs.knobs write` "
                       "(cmake/vfa_build/knobs/schema.py); edit the model, not this.",
        "type": "object",
        "properties": sections,
        "required": list(knobs.REQUIRED_SECTIONS),
        "additionalProperties": False,
    }


def text(knobs: ModuleType) -> str:
    return json.dumps(schema(knobs), indent=2) + "\n"
