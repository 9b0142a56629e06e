"""The Python side of the knob declaration, cmake/knobs.json.

The declaration is the one place a knob is defined; CMake reads it in
cmake/Options.cmake. From it this script makes, the way scikit-build-core makes
its settings' docs from their declaration:

* the README's knob tables (between ``<!-- knobs:<table> begin ... -->`` and
  ``<!-- knobs:<table> end -->``), and
* pyproject.toml's ``[tool.cibuildwheel.linux] environment-pass`` (between
  ``# knobs:environment-pass begin`` and ``# knobs:environment-pass end``).

    python cmake/knobs.py write           rewrite both from the declaration
    python cmake/knobs.py check           exit 1 (with a diff) when they or the
                                          declaration itself are out of order
    python cmake/knobs.py suggest NAME..  "NAME=CLOSEST" for each name that is close
                                          to a declared one (CMake's did-you-mean)

Standard library only: CMake runs ``suggest`` with whatever Python it found.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PROJECT = Path(__file__).resolve().parents[1]
DECLARATION = PROJECT / "cmake" / "knobs.json"

TYPES = ("bool", "tristate", "int", "choice", "list", "path", "string")
SCOPES = ("build", "version", "runtime", "ci", "benchmark")
# presets: {preset: [values]} of a family's selection knob (families.<name>.*_knob): what VFA_PRESET
# selects when the knob is not set; a preset it does not name selects every choice. Checked by the
# families' validator (python/vendored_flash_attn/families.py), read by cmake/KernelSelection.cmake.
FIELDS = {"type", "default", "default_doc", "choices", "min", "max", "env", "scope", "cibuildwheel",
          "record", "doc", "presets"}
REQUIRED = {"type", "default", "scope", "cibuildwheel", "doc"}


def _bool_words(path: Path = DECLARATION) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The declaration's bool words (its "bool_words"), ON words and OFF words."""
    try:
        words = json.loads(Path(path).read_text())["bool_words"]
        return tuple(words["on"]), tuple(words["off"])
    except (OSError, ValueError, KeyError, TypeError):
        return (), ()  # load() names what is wrong with the file


BOOL_ON, BOOL_OFF = _bool_words()

GENERATED_NOTE = "generated from cmake/knobs.json by `python cmake/knobs.py write`; edit the declaration, not this"
# README table name -> the scopes it lists.
README_TABLES = {"build": ("build", "version"), "runtime": ("runtime",)}


@dataclass(frozen=True)
class Knob:
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

    @property
    def env_names(self) -> tuple[str, ...]:
        return (self.name, *self.env)


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


def _knob(name: str, entry: dict) -> Knob:
    where = f"cmake/knobs.json: {name}"
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        raise DeclarationError(f"{where}: a knob name is upper case letters, digits and _")
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where}: must be an object")
    missing = REQUIRED - entry.keys()
    unknown = entry.keys() - FIELDS
    if missing or unknown:
        raise DeclarationError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
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
    if not all(isinstance(c, str) and c == c.lower() and c for c in choices) or len(set(choices)) != len(choices):
        raise DeclarationError(f"{where}: choices must be distinct lower-case strings")
    if (entry["type"] == "int") != ("min" in entry and "max" in entry):
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
                record=entry.get("record", True))
    problem = value_problem(knob, knob.default)
    if problem:
        raise DeclarationError(f"{where}: the default {problem}")
    canonical = {"bool": ("ON", "OFF"), "tristate": ("auto", "ON", "OFF")}.get(knob.type)
    if canonical and knob.default not in canonical:
        raise DeclarationError(f"{where}: write the default as one of {', '.join(canonical)}")
    if knob.default == "" and not knob.default_doc and knob.type not in ("path", "string"):
        raise DeclarationError(f"{where}: a knob without a default needs default_doc (what the build does instead)")
    return knob


def load(path: Path = DECLARATION) -> Declaration:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DeclarationError(f"cannot read {path}: {exc}") from exc
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
    readme = project / "README.md"
    text = readme.read_text()
    for table, scopes in README_TABLES.items():
        begin = re.compile(rf"<!-- knobs:{table} begin[^\n]*-->")
        text = _replace_between(text, begin, f"<!-- knobs:{table} end -->", readme_table(decl, scopes),
                                str(readme))
    pyproject = project / "pyproject.toml"
    toml = _replace_between(pyproject.read_text(), re.compile(r"# knobs:environment-pass begin[^\n]*"),
                            "# knobs:environment-pass end", environment_pass_toml(decl), str(pyproject))
    return {readme: text, pyproject: toml}


def drift(project: Path = PROJECT) -> str:
    """A unified diff of what `write` would change; empty when all is in order."""
    out = []
    for path, want in generated(project).items():
        have = path.read_text()
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
    parser = argparse.ArgumentParser(prog="python cmake/knobs.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write", help="rewrite the README tables and environment-pass from the declaration")
    sub.add_parser("check", help="exit 1 when they differ from what the declaration makes")
    suggest = sub.add_parser("suggest", help="the closest declared name for each given name")
    suggest.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            for path, text in generated().items():
                if path.read_text() != text:
                    path.write_text(text)
                    print(f"rewrote {path.relative_to(PROJECT)}")
        elif args.command == "check":
            diff = drift()
            if diff:
                sys.stdout.write(diff)
                print("\nout of date: run `python cmake/knobs.py write`", file=sys.stderr)
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
