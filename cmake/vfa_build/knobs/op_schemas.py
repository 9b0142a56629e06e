#!/usr/bin/env python3
"""The op schemas the pinned upstream registers, checked against the ones this package calls.

    python cmake/vfa_build knobs.op_schemas check FLASH_ATTENTION_DIR [--commit COMMIT]

``python/vendored_flash_attn/declaration/op_schemas.py`` holds the schema of every op ``interface.py``
and ``sparse.py`` call (positionally). This reads upstream's own registrations, the
``ops.def("...")`` strings of the files ``op_schemas.REGISTRATION_SOURCES`` names, and exits
1 with what differs when upstream registers another schema (or no such op): a pin bump that
changes an op's arguments stops the configure (cmake/OpSchemas.cmake runs this on every
configure) instead of building a wheel that calls the op with shifted arguments.

On success it prints the fingerprint of the checked schemas; ``op_schemas.CHECKED_AGAINST``
records it per upstream commit, and a CPU test checks that the record names the pinned
commit and today's schemas: a pin bump fails the CPU tests until this was run on the new
commit's sources and the record updated (the entry to paste is printed with --commit).

Standard library only; runs with the build's Python, nothing imported from torch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Mapping

OP_SCHEMAS_FILE = Path(__file__).resolve().parents[3] / "python/vendored_flash_attn/declaration/op_schemas.py"

# A C/C++ string or character literal, or a comment (which may hold quotes of its own).
_LITERAL_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
# TORCH_LIBRARY(ns, m), STABLE_TORCH_LIBRARY_EXPAND(NAME, ops), ...: the library's variable
# (the IMPL blocks take three arguments and do not match).
_LIBRARY_BLOCK = re.compile(r"\b\w*TORCH_LIBRARY\w*\(\s*\w+\s*,\s*(\w+)\s*\)")
_STRING = r'"(?:\\.|[^"\\\n])*"'


class RegistrationError(ValueError):
    """A registration source this reader cannot read (a def that is not string literals)."""


def load_op_schemas():
    """python/vendored_flash_attn/declaration/op_schemas.py, loaded by path: no package import (which
    would need the package's dependencies in the build's Python)."""
    spec = importlib.util.spec_from_file_location("vfa_op_schemas", OP_SCHEMAS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without_comments(text: str) -> str:
    return _LITERAL_OR_COMMENT.sub(lambda m: " " if m.group().startswith("/") else m.group(), text)


def _unquote(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


def registered_schemas(source: str) -> dict[str, str]:
    """Op name -> schema of every ``<library>.def("...")`` in a C++ registration source, the
    adjacent string literals joined as the compiler joins them (comments between them
    ignored)."""
    code = _without_comments(source)
    libraries = set(_LIBRARY_BLOCK.findall(code))
    schemas: dict[str, str] = {}
    for library in sorted(libraries):
        for call in re.finditer(rf"\b{library}\.def\s*\(", code):
            literals = re.match(rf"\s*((?:{_STRING}\s*)+)\)", code[call.end():])
            line = code.count("\n", 0, call.start()) + 1
            if literals is None:
                raise RegistrationError(f"line {line}: {library}.def( is not followed by string "
                                        "literals only; this reader cannot follow it")
            schema = "".join(_unquote(s) for s in re.findall(_STRING, literals.group(1)))
            name = schema.split("(", 1)[0].strip()
            if name in schemas:
                raise RegistrationError(f"line {line}: op {name} is defined twice")
            schemas[name] = schema
    return schemas


def canonical(schema: str) -> str:
    """``schema`` with its spacing normalised: upstream pads FA3's arguments into columns."""
    text = re.sub(r"\s+", " ", schema.strip())
    return re.sub(r"\s*(->|[(),\[\]])\s*", r"\1", text)


def fingerprint(schemas: Mapping[tuple[str, str], str]) -> str:
    """One digest of (namespace, op) -> schema, spacing aside."""
    lines = sorted(f"{namespace}::{canonical(schema)}" for (namespace, _), schema in schemas.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _arguments(schema: str) -> list[str]:
    inner = canonical(schema)
    return inner[inner.index("(") + 1: inner.rindex(")")].split(",")


def _first_difference(ours: str, theirs: str) -> str:
    mine, upstream = _arguments(ours), _arguments(theirs)
    for index, (a, b) in enumerate(zip(mine, upstream)):
        if a != b:
            return f"argument {index + 1}: upstream has '{b}', op_schemas.py '{a}'"
    if len(mine) != len(upstream):
        return f"upstream has {len(upstream)} arguments, op_schemas.py {len(mine)}"
    return "the return type differs"


def differences(upstream_dir: Path, module=None) -> list[str]:
    """Every way upstream's registrations in ``upstream_dir`` differ from op_schemas.py."""
    module = module or load_op_schemas()
    problems: list[str] = []
    registered: dict[str, dict[str, str]] = {}
    for (namespace, op), ours in module.OP_SCHEMAS.items():
        relative = module.REGISTRATION_SOURCES[namespace]
        if relative not in registered:
            path = upstream_dir / relative
            try:
                registered[relative] = registered_schemas(path.read_text(errors="replace", encoding="utf-8"))
            except OSError as exc:
                problems.append(f"{relative}: cannot read it ({exc.strerror or exc})")
                registered[relative] = {}
                continue
            except RegistrationError as exc:
                problems.append(f"{relative}: {exc}")
                registered[relative] = {}
                continue
        theirs = registered[relative].get(op)
        if theirs is None:
            found = ", ".join(sorted(registered[relative])) or "none"
            problems.append(f"{namespace}::{op}: {relative} registers no op {op} (it registers: {found})")
        elif canonical(theirs) != canonical(ours):
            problems.append(f"{namespace}::{op} ({relative}): {_first_difference(ours, theirs)}\n"
                            f"      upstream:        {canonical(theirs)}\n"
                            f"      op_schemas.py:   {canonical(ours)}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compare upstream's registrations with op_schemas.py")
    check.add_argument("upstream", type=Path, help="the flash-attention source folder")
    check.add_argument("--commit", help="its commit: print the record entry for op_schemas.CHECKED_AGAINST")
    args = parser.parse_args(argv)

    module = load_op_schemas()
    problems = differences(args.upstream, module)
    if problems:
        print("The op schemas upstream registers differ from python/vendored_flash_attn/declaration/op_schemas.py, "
              "whose ops interface.py and sparse.py call with positional arguments:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        print("Update op_schemas.py to upstream's schemas and the calls in interface.py / sparse.py "
              "to match (tests/unit/test_dispatch.py checks every argument), then record the commit "
              "in op_schemas.CHECKED_AGAINST (this script prints the entry with --commit).",
              file=sys.stderr)
        return 1
    digest = fingerprint(module.OP_SCHEMAS)
    print(f"the {len(module.OP_SCHEMAS)} ops python/ calls have upstream's schemas (fingerprint {digest[:16]})")
    if args.commit and module.CHECKED_AGAINST.get(args.commit) != digest:
        print(f"not yet recorded: add to op_schemas.CHECKED_AGAINST: \"{args.commit}\": \"{digest}\",")
    return 0


if __name__ == "__main__":
    sys.exit(main())
