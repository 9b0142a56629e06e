"""The Python side of the knob declaration, cmake/knobs.json.

The declaration is the one place a knob is defined; CMake reads it in
cmake/Options.cmake. From it this script makes, the way scikit-build-core makes
its settings' docs from their declaration:

* docs/knobs.md's knob tables (between ``<!-- knobs:<table> begin ... -->`` and
  ``<!-- knobs:<table> end -->``), and
* pyproject.toml's ``[tool.cibuildwheel.linux] environment-pass`` (between
  ``# knobs:environment-pass begin`` and ``# knobs:environment-pass end``).

    python cmake/vfa_build knobs.knobs write           rewrite both, and cmake/knobs.schema.json (the
                                          JSON Schema of the declaration, made from the
                                          typed model: cmake/vfa_build/knobs/schema.py)
    python cmake/vfa_build knobs.knobs check           exit 1 (with a diff) when they or the
                                          declaration itself are out of order
    python cmake/vfa_build knobs.knobs validate [FILE] the first mistake of the knobs' entries, with its
                                          JSON path and fix (exit 1; the configure runs it)
    python cmake/vfa_build knobs.knobs suggest NAME..  "NAME=CLOSEST" for each name that is close
                                          to a declared one (CMake's did-you-mean)

Standard library only: CMake runs ``suggest`` with whatever Python it found.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

PROJECT = Path(__file__).resolve().parents[3]
DECLARATION = PROJECT / "cmake" / "knobs.json"

TYPES = ("bool", "tristate", "int", "choice", "list", "path", "string")
SCOPES = ("build", "version", "runtime", "ci", "benchmark")


# A choice: what a list knob's value is split into and CMake carries as a list item.
CHOICE = re.compile(r"[a-z0-9][a-z0-9_.+-]*")


def _bool_words(path: Path = DECLARATION) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The declaration's bool words (its "bool_words"), ON words and OFF words."""
    try:
        words = json.loads(Path(path).read_text(encoding="utf-8"))["bool_words"]
        return tuple(words["on"]), tuple(words["off"])
    except (OSError, ValueError, KeyError, TypeError):
        return (), ()  # load() names what is wrong with the file


BOOL_ON, BOOL_OFF = _bool_words()

GENERATED_NOTE = "generated from cmake/knobs.json by `python cmake/vfa_build knobs.knobs write`; edit the declaration, not this"
# Where the knob tables are written, and each table's name -> the scopes it lists.
KNOBS_DOC = "docs/knobs.md"
README_TABLES = {"build": ("build", "version"), "runtime": ("runtime",)}


@dataclass(frozen=True)
class Knob:
    """One entry of the declaration's "knobs" (its key is ``name``): the typed model the
    validator (_knob) parses into, and what cmake/knobs.schema.json is made from
    (cmake/vfa_build/knobs/schema.py): a field here is a field of the JSON, no other list of them."""

    name: str
    type: str
    default: str
    scope: str
    cibuildwheel: bool
    doc: str
    default_doc: str = ""
    choices: tuple[str, ...] = ()
    min: Optional[int] = None
    max: Optional[int] = None
    env: tuple[str, ...] = ()
    record: bool = True
    # {preset: [values]} of a family's selection knob (families.<name>.*_knob): what VFA_PRESET
    # selects when the knob is not set; a preset it does not name selects every choice. Checked by
    # the families' validator (python/vendored_flash_attn/declaration/families.py), read by
    # cmake/KernelSelection.cmake.
    presets: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def env_names(self) -> tuple[str, ...]:
        return (self.name, *self.env)


# The JSON fields of a knob, and those it must have: the model's fields (its key is the name).
FIELDS = {f.name for f in fields(Knob)} - {"name"}
REQUIRED = {f.name for f in fields(Knob) if f.default is MISSING and f.default_factory is MISSING} - {"name"}


@dataclass(frozen=True)
class Declaration:
    knobs: dict[str, Knob]
    pass_through: tuple[str, ...]
    cache_variables: tuple[str, ...]

    def scope(self, *scopes: str) -> list[Knob]:
        return [k for k in self.knobs.values() if k.scope in scopes]

    def known_names(self) -> list[str]:
        """Every name a user may set: knobs and their other environment names."""
        return [name for knob in self.knobs.values() for name in knob.env_names]


class DeclarationError(ValueError):
    """cmake/knobs.json is malformed."""


def value_problem(knob: Knob, value: str) -> Optional[str]:
    """Why ``value`` is not valid for ``knob`` (as CMake checks it), or None."""
    value = value.strip()
    if value == "":
        return None
    if knob.type in ("bool", "tristate"):
        words = BOOL_ON + BOOL_OFF + (("AUTO",) if knob.type == "tristate" else ())
        return None if value.upper() in words else f"'{value}' is not one of {', '.join(words)}"
    if knob.type == "int":
        if not value.isdigit() or not (knob.min <= int(value) <= knob.max):
            return f"'{value}' is not an integer from {knob.min} to {knob.max}"
        return None
    if knob.type == "choice":
        return None if value.lower() in knob.choices else f"'{value}' is not one of {', '.join(knob.choices)}"
    if knob.type == "list":
        items = [i for i in re.split(r"[ ,;]+", value.lower()) if i]
        bad = [i for i in items if i not in knob.choices]
        return None if items == ["none"] or not bad else f"'{bad[0]}' is not one of {', '.join(knob.choices)}"
    return None


def _json_types():
    """The package's json_types (python/vendored_flash_attn/declaration/json_types.py, standard library only):
    one reading of the model's annotations for the typed parse and the schema."""
    python = str(PROJECT / "python")
    if python not in sys.path:
        sys.path.insert(0, python)
    from vendored_flash_attn.declaration import json_types

    return json_types


def _knob(name: str, entry: dict) -> Knob:
    where = f"cmake/knobs.json: knobs.{name}"
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        raise DeclarationError(f"{where}: a knob name is upper case letters, digits and _")
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where}: must be an object")
    missing = REQUIRED - entry.keys()
    unknown = entry.keys() - FIELDS
    if missing or unknown:
        hints = "".join(f"; {u}: did you mean {c[0]!r}?" for u in sorted(unknown)
                        for c in [difflib.get_close_matches(u, sorted(FIELDS), n=1)] if c)
        raise DeclarationError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}{hints}: "
                               f"add the missing, rename or remove the unknown (the file's \"about\" lines say "
                               f"each field; cmake/knobs.schema.json shows them in an editor)")
    wrong = _json_types().object_problem(entry, Knob, skip=frozenset({"name"}))
    if wrong:  # a field's type, as the model's annotation says (cmake/knobs.schema.json reads the same)
        raise DeclarationError(f"{where}{'' if wrong.startswith('.') else ' '}{wrong}: fix it (the file's "
                               f"\"about\" lines say each field)")
    if entry["type"] not in TYPES:
        raise DeclarationError(f"{where}: type {entry['type']!r} is not one of {', '.join(TYPES)}")
    if entry["scope"] not in SCOPES:
        raise DeclarationError(f"{where}: scope {entry['scope']!r} is not one of {', '.join(SCOPES)}")
    for field in ("default", "doc", "default_doc"):
        if not isinstance(entry.get(field, ""), str):
            raise DeclarationError(f"{where}: {field} must be a string")
    if not entry["doc"].strip() or "\n" in entry["doc"]:
        raise DeclarationError(f"{where}: doc must be one non-empty line")
    for field in ("cibuildwheel", "record"):
        if not isinstance(entry.get(field, True), bool):
            raise DeclarationError(f"{where}: {field} must be true or false")
    choices = entry.get("choices", [])
    if (entry["type"] in ("choice", "list")) != bool(choices):
        raise DeclarationError(f"{where}: choices are required for choice and list knobs, and only for them")
    if not all(isinstance(c, str) and CHOICE.fullmatch(c) for c in choices) or len(set(choices)) != len(choices):
        raise DeclarationError(f"{where}.choices must be distinct lower-case words ({CHOICE.pattern}: a list "
                               f"knob's value is split at ',', ';' and spaces, and CMake lists split at ';'), "
                               f"got {choices!r}")
    if (entry["type"] == "int" and not {"min", "max"} <= entry.keys()) or (
            entry["type"] != "int" and entry.keys() & {"min", "max"}):
        raise DeclarationError(f"{where}: min and max are required for int knobs, and only for them")
    if entry["type"] == "int" and not (isinstance(entry["min"], int) and isinstance(entry["max"], int)
                                       and 0 <= entry["min"] <= entry["max"] < 10**15):
        raise DeclarationError(f"{where}: min and max must be integers, 0 <= min <= max < 10^15")
    env = entry.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise DeclarationError(f"{where}: env must be a list of names")
    knob = Knob(name=name, type=entry["type"], default=entry["default"], scope=entry["scope"],
                cibuildwheel=entry["cibuildwheel"], doc=entry["doc"], default_doc=entry.get("default_doc", ""),
                choices=tuple(choices), min=entry.get("min"), max=entry.get("max"), env=tuple(env),
                record=entry.get("record", True),
                presets={str(k): tuple(v) for k, v in entry.get("presets", {}).items()})
    problem = value_problem(knob, knob.default)
    if problem:
        raise DeclarationError(f"{where}: the default {problem}")
    canonical = {"bool": ("ON", "OFF"), "tristate": ("auto", "ON", "OFF")}.get(knob.type)
    if canonical and knob.default not in canonical:
        raise DeclarationError(f"{where}: write the default as one of {', '.join(canonical)}")
    if knob.default == "" and not knob.default_doc and knob.type not in ("path", "string"):
        raise DeclarationError(f"{where}: a knob without a default needs default_doc (what the build does instead)")
    return knob


# The declaration's sections: {name: (its fields, those required)}; None: read by its own
# validator (knobs: _knob; families: families.py). cmake/vfa_build/knobs/schema.py says the same of them.
SECTIONS = {"$schema": None, "about": None, "knobs": None, "families": None,
            "bool_words": ({"about", "on", "off"}, {"on", "off"}),
            "cache_variables": ({"about", "names"}, {"names"}),
            "cibuildwheel_pass_through": ({"about", "names"}, {"names"}),
            "cuda_archs": ({"about", "names", "table"}, {"table"})}
REQUIRED_SECTIONS = ("bool_words", "knobs", "cuda_archs", "families")


def _section_problem(data: Any) -> Optional[str]:
    """The first section of the declaration that is unknown, missing or not of its fields."""
    if not isinstance(data, dict):
        return "cmake/knobs.json must be a JSON object"
    unknown = sorted(set(data) - set(SECTIONS))
    missing = [s for s in REQUIRED_SECTIONS if s not in data]
    if unknown or missing:
        hints = "".join(f"; {u}: did you mean {c[0]!r}?" for u in unknown
                        for c in [difflib.get_close_matches(u, list(SECTIONS), n=1)] if c)
        return (f"cmake/knobs.json: missing sections {missing}, unknown sections {unknown}{hints}: restore the "
                f"missing from the repository, rename or remove the unknown")
    for section, spec in SECTIONS.items():
        if spec is None or section not in data:
            continue
        value, (allowed, required) = data[section], spec
        if not isinstance(value, dict) or set(value) - allowed or required - set(value):
            return (f"cmake/knobs.json: {section} must be an object of {sorted(allowed)} (required: "
                    f"{sorted(required)}), got {sorted(value) if isinstance(value, dict) else value!r}")
        for field in ("on", "off", "names"):
            if section != "cuda_archs" and field in value and not (
                    isinstance(value[field], list) and all(isinstance(v, str) for v in value[field])):
                return f"cmake/knobs.json: {section}.{field} must be a list of strings, got {value[field]!r}"
    return None


def load(path: Path = DECLARATION) -> Declaration:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DeclarationError(f"cannot read {path}: {exc}") from exc
    problem = _section_problem(data)
    if problem:
        raise DeclarationError(problem)
    if not isinstance(data["knobs"], dict):
        raise DeclarationError(f"cmake/knobs.json: knobs must be an object of knobs by name, got {data['knobs']!r}")
    knobs = {name: _knob(name, entry) for name, entry in data.get("knobs", {}).items()}
    names = [n for k in knobs.values() for n in k.env_names]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DeclarationError(f"cmake/knobs.json: names declared twice: {', '.join(duplicates)}")
    pass_through = tuple(data.get("cibuildwheel_pass_through", {}).get("names", []))
    clash = sorted(set(pass_through) & set(names))
    if clash:
        raise DeclarationError(f"cmake/knobs.json: knobs also listed as pass-through: {', '.join(clash)}")
    return Declaration(knobs=knobs, pass_through=pass_through,
                       cache_variables=tuple(data.get("cache_variables", {}).get("names", [])))


# --- what is generated ----------------------------------------------------------------

def _code(value: str) -> str:
    return f"`{value}`"


def _allowed(knob: Knob) -> str:
    if knob.type == "bool":
        return "`ON`/`OFF`"
    if knob.type == "tristate":
        return "`auto` or `ON`/`OFF`"
    if knob.type == "int":
        return f"{knob.min}–{knob.max}"
    if knob.type == "choice":
        return ", ".join(map(_code, knob.choices))
    if knob.type == "list":
        return "any of " + ", ".join(map(_code, knob.choices)) + "; or `none`"
    return knob.type


def _default(knob: Knob) -> str:
    if knob.default_doc:
        return knob.default_doc
    return _code(knob.default) if knob.default else "—"


def readme_table(decl: Declaration, scopes: tuple[str, ...]) -> str:
    rows = ["| knob | values | default | meaning |", "|---|---|---|---|"]
    for knob in decl.scope(*scopes):
        names = " or ".join(map(_code, knob.env_names))
        rows.append(f"| {names} | {_allowed(knob)} | {_default(knob)} | {knob.doc} |")
    kept = [k.name for k in decl.scope(*scopes) if not k.cibuildwheel]
    if kept and "build" in scopes:
        rows += ["", "cibuildwheel passes every knob above into its container (`environment-pass` in "
                 "pyproject.toml) except " + ", ".join(map(_code, kept)) + "."]
    return "\n".join(rows)


def environment_pass(decl: Declaration) -> list[str]:
    return [*decl.pass_through, *(n for k in decl.knobs.values() if k.cibuildwheel for n in k.env_names)]


def environment_pass_toml(decl: Declaration, width: int = 100) -> str:
    lines, line = [], "  "
    for name in environment_pass(decl):
        item = f'"{name}", '
        if len(line) + len(item) > width and line.strip():
            lines.append(line.rstrip())
            line = "  "
        line += item
    lines.append(line.rstrip())
    return "environment-pass = [\n" + "\n".join(lines) + "\n]"


def _replace_between(text: str, begin: re.Pattern, end: str, body: str, where: str) -> str:
    match = begin.search(text)
    stop = text.find(end, match.end()) if match else -1
    if not match or stop < 0:
        raise DeclarationError(f"{where}: the generated block's markers are missing ({begin.pattern!r} … {end!r})")
    return text[:match.end()] + "\n" + body + "\n" + text[stop:]


def generated(project: Path = PROJECT, decl: Optional[Declaration] = None) -> dict[Path, str]:
    """Each generated file's text as the declaration makes it."""
    decl = decl or load(project / "cmake" / "knobs.json")
    readme = project / KNOBS_DOC
    text = readme.read_text(encoding="utf-8")
    up = "../" * KNOBS_DOC.count("/")  # the declaration's links are written from the project root
    for table, scopes in README_TABLES.items():
        begin = re.compile(rf"<!-- knobs:{table} begin[^\n]*-->")
        body = re.sub(r"\]\((?![a-z]+:|#|/)", "](" + up, readme_table(decl, scopes))
        text = _replace_between(text, begin, f"<!-- knobs:{table} end -->", body, str(readme))
    pyproject = project / "pyproject.toml"
    toml = _replace_between(pyproject.read_text(encoding="utf-8"), re.compile(r"# knobs:environment-pass begin[^\n]*"),
                            "# knobs:environment-pass end", environment_pass_toml(decl), str(pyproject))
    return {readme: text, pyproject: toml, project / "cmake" / "knobs.schema.json": _schema_text()}


def _schema_text() -> str:
    """cmake/knobs.schema.json as the typed model makes it (knobs/schema.py)."""
    from vfa_build.knobs import schema as knobs_schema

    return knobs_schema.text(sys.modules[__name__])


def drift(project: Path = PROJECT) -> str:
    """A unified diff of what `write` would change; empty when all is in order."""
    out = []
    for path, want in generated(project).items():
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != want:
            out += difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                        f"{path.name} (now)", f"{path.name} (from cmake/knobs.json)")
    return "".join(out)


def suggestions(names: list[str], decl: Declaration) -> dict[str, str]:
    known = decl.known_names()
    found = {}
    for name in names:
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.75)
        if close:
            found[name] = close[0]
    return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python cmake/vfa_build knobs.knobs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write", help="rewrite the knob tables (docs/knobs.md) and environment-pass from the declaration")
    sub.add_parser("check", help="exit 1 when they differ from what the declaration makes")
    validate = sub.add_parser("validate", help="the declaration's first mistake in its knobs, with its JSON path "
                                               "and the fix (exit 1); the configure runs it")
    validate.add_argument("file", nargs="?", type=Path, default=DECLARATION)
    suggest = sub.add_parser("suggest", help="the closest declared name for each given name")
    suggest.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            for path, text in generated().items():
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    path.write_text(text, encoding="utf-8")
                    print(f"rewrote {path.relative_to(PROJECT)}")
        elif args.command == "validate":
            try:
                load(args.file)
            except DeclarationError as exc:
                print(exc)
                return 1
        elif args.command == "check":
            diff = drift()
            if diff:
                sys.stdout.write(diff)
                print("\nout of date: run `python cmake/vfa_build knobs.knobs write`", file=sys.stderr)
                return 1
        else:
            for name, close in suggestions(args.names, load()).items():
                print(f"{name}={close}")
    except DeclarationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
