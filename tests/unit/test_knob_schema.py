"""cmake/knobs.schema.json, the declaration's JSON Schema, is made from the typed model its
validators parse into (cmake/vfa_build/knobs/schema.py, python/vendored_flash_attn/declaration/json_types.py): the
committed file must be what the model makes, the declaration must pass it, and the schema and the
validators (cmake/vfa_build/knobs/knobs.py's typed parse, families.problems) must refuse the same broken
declarations: every field of the model set to a value of another type, and a corpus of
structural mistakes."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import typing
from pathlib import Path

import jsonschema
import pytest

from vendored_flash_attn.declaration import cuda_archs, families, family_build
from vfa_build.knobs import knobs
from vfa_build.knobs import schema as knobs_schema

PROJECT = Path(__file__).resolve().parents[2]

SCHEMA_FILE = PROJECT / "cmake" / "knobs.schema.json"
DECLARATION = json.loads((PROJECT / "cmake" / "knobs.json").read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_what_the_model_makes():
    assert SCHEMA_FILE.read_text() == knobs_schema.text(knobs), "run `python cmake/vfa_build knobs.knobs write`"


def test_the_declaration_names_its_schema_and_passes_it(validator):
    assert DECLARATION["$schema"] == "./knobs.schema.json"  # editors resolve it beside the file
    assert [e.message for e in validator.iter_errors(DECLARATION)] == []


def _model_refuses(tmp_path: Path, data: dict) -> list[str]:
    """What the configure's validators say (cmake/Families.cmake: knobs.py validate, then
    families check): the knobs' typed parse stops on its first mistake."""
    path = tmp_path / "knobs.json"
    path.write_text(json.dumps(data))
    try:
        knobs.load(path)
    except knobs.DeclarationError as error:
        return [str(error)]
    return families.problems(data)


def _schema_refuses(validator, data: dict) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(data)]


# --- every field of the model, of another type ------------------------------------------------

def _wrong(hint) -> object:
    """A JSON value that is not of ``hint``."""
    if hint is str:
        return 7
    if hint in (bool, int):
        return "16"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return _wrong([a for a in args if a is not type(None)][0])
    if origin in (tuple, dict) or dataclasses.is_dataclass(hint):
        return "x" if origin is not tuple else {"x": 1}
    raise AssertionError(f"no wrong value for {hint!r}")


def _fields(cls, skip=()) -> list[tuple[str, object]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.name not in skip]


def _model_paths() -> list[tuple[tuple[str, ...], object]]:
    """(JSON path, annotation) of each field of the model, on declared entries: two knobs (a
    selection list knob with presets, an int knob), each family's fields with their call and archs
    fields, a row of the arch table."""
    paths = [(("knobs", knob, name), hint) for knob in ("VFA_FA3_HEAD_DIMS", "VFA_DIST_JOBS")
             for name, hint in _fields(knobs.Knob, skip={"name"})]
    family_hints = typing.get_type_hints(families.Family)
    for family in ("fa2", "fa3", "fa4"):
        for name in sorted(families._FIELDS - families._SPELLED):
            paths.append((("families", family, name), family_hints[name]))
        paths += [(("families", family, "call", name), hint) for name, hint in _fields(families.CallRules)]
        if family != "fa4":  # a cute_dsl family's archs is {"dsl": "a"} alone (the validator's own rule)
            paths += [(("families", family, "archs", name), hint) for name, hint in _fields(family_build.Archs)]
    paths += [(("cuda_archs", "table", "9.0", name), hint) for name, hint in _fields(cuda_archs.Row, {"capability"})]
    return paths


MODEL_PATHS = _model_paths()


def test_every_field_of_the_model_is_broken_once():
    assert len(MODEL_PATHS) > 100
    assert {p[-1] for p, _ in MODEL_PATHS} >= {f.name for f in dataclasses.fields(families.CallRules)}


@pytest.mark.parametrize("path, hint", MODEL_PATHS, ids=[".".join(p) for p, _ in MODEL_PATHS])
def test_a_field_of_another_type_is_refused_by_both(tmp_path, validator, path, hint):
    data = copy.deepcopy(DECLARATION)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = _wrong(hint)
    model, schema = _model_refuses(tmp_path, data), _schema_refuses(validator, data)
    assert model and schema, f"{'.'.join(path)} = {node[path[-1]]!r}: model {model}, schema {schema}"


# --- structural mistakes ----------------------------------------------------------------------

def _family(name):
    return lambda d: d["families"][name]


STRUCTURAL = {
    "unknown knob field": lambda d: d["knobs"]["VFA_PRESET"].update(defualt="full"),
    "knob without doc": lambda d: d["knobs"]["VFA_PRESET"].pop("doc"),
    "knob type not a type": lambda d: d["knobs"]["VFA_PRESET"].update(type="float"),
    "knob scope not a scope": lambda d: d["knobs"]["VFA_PRESET"].update(scope="runtimes"),
    "choice knob without choices": lambda d: d["knobs"]["VFA_PRESET"].pop("choices"),
    "int knob without max": lambda d: d["knobs"]["VFA_DIST_JOBS"].pop("max"),
    "string knob with min": lambda d: d["knobs"]["VFA_TORCH_VERSION"].update(min=1),
    "doc of two lines": lambda d: d["knobs"]["VFA_PRESET"].update(doc="one\ntwo"),
    "choice CMake would split": lambda d: d["knobs"]["VFA_PRESET"]["choices"].append("full;minimal"),
    "choice twice": lambda d: d["knobs"]["VFA_PRESET"]["choices"].append("full"),
    "knob name lower case": lambda d: d["knobs"].update(vfa_new=d["knobs"]["VFA_PRESET"]),
    "unknown section": lambda d: d.update(knbos={}),
    "missing section": lambda d: d.pop("bool_words"),
    "unknown bool_words field": lambda d: d["bool_words"].update(maybe=["M"]),
    "pass-through not a list": lambda d: d["cibuildwheel_pass_through"].update(names="SCCACHE_BUCKET"),
    "family field misspelt": lambda d: _family("fa2")(d).update(adaptor="x:y"),
    "family without record": lambda d: _family("fa2")(d).pop("record"),
    "made not a kind": lambda d: _family("fa2")(d).update(made="wasm"),
    "extension without module": lambda d: _family("fa3")(d).pop("module"),
    "cute_dsl without probe": lambda d: _family("fa4")(d).pop("probe"),
    "family name with ;": lambda d: d["families"].update({"fa;5": copy.deepcopy(d["families"]["fa2"])}),
    "version 0": lambda d: _family("fa2")(d).update(version=0),
    "capabilities without min": lambda d: _family("fa2")(d)["capabilities"].pop("min"),
    "capability min 9": lambda d: _family("fa3")(d)["capabilities"].update(min="9"),
    "generations of a word": lambda d: _family("fa4")(d)["capabilities"]["generations"].update(ten="sm100"),
    "default_on a word": lambda d: _family("fa2")(d).update(default_on="every"),
    "unknown call field": lambda d: _family("fa2")(d)["call"].update(max_splits=4),
    "head sizes of three": lambda d: _family("fa4")(d)["call"]["head_sizes"].update(sm90=[[8, 512, 8]]),
    "unknown archs field": lambda d: _family("fa2")(d)["archs"].update(ptxx="8.0"),
    "unknown build field": lambda d: _family("fa2")(d)["build"].update(sourcs=[]),
    "unknown kernels field": lambda d: _family("fa2")(d)["build"]["kernels"].update(varients=[]),
    "table row without nvcc": lambda d: d["cuda_archs"]["table"]["9.0"].pop("nvcc"),
    "table key 9": lambda d: d["cuda_archs"]["table"].update({"9": d["cuda_archs"]["table"]["9.0"]}),
    "name entry not a capability": lambda d: d["cuda_archs"]["names"].update(Hopper=["9.0 PTX"]),
    "name with a sign": lambda d: d["cuda_archs"]["names"].update({"Ampere+Tegra": ["8.7"]}),
    "unknown cuda_archs field": lambda d: d["cuda_archs"].update(rows={}),
}


@pytest.mark.parametrize("mistake", sorted(STRUCTURAL))
def test_a_structural_mistake_is_refused_by_both(tmp_path, validator, mistake):
    data = copy.deepcopy(DECLARATION)
    STRUCTURAL[mistake](data)
    model, schema = _model_refuses(tmp_path, data), _schema_refuses(validator, data)
    assert model and schema, f"{mistake}: model {model}, schema {schema}"


def test_the_configure_names_a_knobs_first_mistake_by_its_json_path(tmp_path):
    """What cmake/Families.cmake runs (`knobs.py validate FILE`), with no jsonschema: the first
    mistake, its JSON path and the fix."""
    import subprocess

    data = copy.deepcopy(DECLARATION)
    data["knobs"]["VFA_DIST_JOBS"]["max"] = "999"
    path = tmp_path / "knobs.json"
    path.write_text(json.dumps(data))
    result = subprocess.run([sys.executable, "-E", "-s", "-S", str(PROJECT / "cmake" / "vfa_build"), "knobs.knobs",
                             "validate", str(path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stdout.startswith("cmake/knobs.json: knobs.VFA_DIST_JOBS.max must be a whole number or null, "
                                    "got '999': fix it"), result.stdout + result.stderr
