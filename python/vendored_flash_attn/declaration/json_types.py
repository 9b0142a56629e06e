"""What a JSON value of a declared field's type is, read off the typed model's annotations
(the dataclasses the declaration's validators parse into: knobs.py's Knob, families.Family,
CallRules, family_build.Archs, cuda_archs.Row). One mapping of a Python annotation, two readings:

* ``problem(value, hint)``: why a JSON value is not of that type (the validators' typed parse,
  at configure and when the package reads the declaration), and
* ``schema(hint)``: its JSON Schema (cmake/vfa_build/knobs/schema.py makes cmake/knobs.schema.json of it),

so the validator and the schema cannot disagree on a field's type
(tests/unit/test_knob_schema.py breaks every field of the model and asks both).

Types: str, bool, int, Optional[X] (null taken), tuple[X, ...] and tuple[X, X, ...] (arrays),
dict[str, X] and dict[int, X] (objects; int keys are GPU majors, "9"), dataclasses (objects of
their fields, those without a default required, no others). Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from typing import Any, Optional

_MAJOR = re.compile(r"[1-9][0-9]*")


@functools.lru_cache(maxsize=None)
def hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved annotations (read once: the package reads its declaration at first use)."""
    return typing.get_type_hints(cls)


def _parts(hint: Any) -> tuple[Any, tuple]:
    return typing.get_origin(hint), typing.get_args(hint)


def describe(hint: Any) -> str:
    """"a list of strings", "an object of {major: string}": what a message asks for."""
    if hint is str:
        return "a string"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "a whole number"
    origin, args = _parts(hint)
    if origin is typing.Union and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return f"{describe(inner)} or null"
    if origin is tuple:
        count = "" if args[-1] is Ellipsis else f"{len(args)} "
        return f"a list of {count}{describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        key = "major" if args[0] is int else "name"
        return f"an object of {{{key}: {describe(args[1]).removeprefix('a ').removeprefix('an ')}}}"
    if dataclasses.is_dataclass(hint):
        return f"an object of {', '.join(f.name for f in dataclasses.fields(hint))}"
    raise TypeError(f"no JSON type for the model's annotation {hint!r}: teach vendored_flash_attn/declaration/json_types.py it")


def problem(value: Any, hint: Any) -> Optional[str]:
    """"must be a list of strings, got 'x'" when ``value`` is not of ``hint``; None when it is."""
    def wrong() -> str:
        return f"must be {describe(hint)}, got {value!r}"

    if hint is str:
        return None if isinstance(value, str) else wrong()
    if hint is bool:
        return None if isinstance(value, bool) else wrong()
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else wrong()
    origin, args = _parts(hint)
    if origin is typing.Union and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return None if value is None or problem(value, inner) is None else wrong()
    if origin is tuple:
        fixed = args[-1] is not Ellipsis
        if not isinstance(value, list) or (fixed and len(value) != len(args)):
            return wrong()
        return wrong() if any(problem(v, args[0]) for v in value) else None
    if origin is dict:
        if not isinstance(value, dict) or any(problem(v, args[1]) for v in value.values()):
            return wrong()
        return wrong() if args[0] is int and not all(_MAJOR.fullmatch(str(k)) for k in value) else None
    if dataclasses.is_dataclass(hint):
        return object_problem(value, hint)
    describe(hint)  # raises: an annotation this module does not know
    return None


def object_problem(value: Any, cls: type, skip: frozenset = frozenset()) -> Optional[str]:
    """The first field of a dataclass's JSON object that is wrong (unknown, missing, mistyped)."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    if not isinstance(value, dict):
        return f"must be an object of {', '.join(names)}, got {value!r}"
    unknown = sorted(set(value) - set(names))
    if unknown:
        return f"has unknown fields {unknown}: it holds {', '.join(names)}"
    types = hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return f"lacks {f.name} ({describe(types[f.name])})"
            continue
        found = problem(value[f.name], types[f.name])
        if found:
            return f".{f.name} {found}"
    return None


def schema(hint: Any) -> dict:
    """The JSON Schema of an annotation (the same types ``problem`` checks)."""
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    origin, args = _parts(hint)
    if origin is typing.Union and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return {"anyOf": [schema(inner), {"type": "null"}]}
    if origin is tuple:
        out = {"type": "array", "items": schema(args[0])}
        if args[-1] is not Ellipsis:
            out.update(minItems=len(args), maxItems=len(args))
        return out
    if origin is dict:
        out = {"type": "object", "additionalProperties": schema(args[1])}
        if args[0] is int:
            out["propertyNames"] = {"pattern": f"^{_MAJOR.pattern}$"}
        return out
    if dataclasses.is_dataclass(hint):
        return object_schema(hint)
    describe(hint)  # raises
    return {}


def object_schema(cls: type, skip: frozenset = frozenset(), **override: dict) -> dict:
    """A dataclass as a JSON object: its fields (less ``skip``) typed by their annotations (or
    ``override``), those without a default required, nothing else allowed."""
    types = hints(cls)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        props[f.name] = override.pop(f.name, None) or schema(types[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    if override:
        raise TypeError(f"{cls.__name__} has no fields {sorted(override)}")
    out = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def declaration_command(argv: list[str], tool: str, command: str, operands: tuple[str, ...],
                        errors: typing.TextIO) -> typing.Union[int, tuple[list[str], Any]]:
    """The command line of a declaration tool the configure runs, ``python -m <tool> <command>
    DECLARATION.json <operands>``, and the declaration read: (the arguments, the JSON value), or
    the exit status to return when the command line is not that (2, the usage on stderr) or the
    file cannot be read as JSON (1, the message on ``errors``: where that tool's CMake caller
    looks for it).
      declaration_command(["check", "cmake/knobs.json"], "vendored_flash_attn.declaration.families", "check",
                          (), sys.stderr)  ->  (["check", "cmake/knobs.json"], {...})
      declaration_command(["parse", "missing.json", "9.0"], "vendored_flash_attn.declaration.cuda_archs",
                          "parse", ("TEXT",), sys.stdout)  ->  1, having printed
                          "missing.json cannot be read as JSON ([Errno 2] ...): fix the file"
    """
    import json
    import sys

    if len(argv) != 2 + len(operands) or argv[0] != command:
        print(f"usage: python -m {tool} {command} " + " ".join(("DECLARATION.json",) + operands), file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            return argv, json.load(f)
    except (OSError, ValueError) as error:
        print(f"{argv[1]} cannot be read as JSON ({error}): fix the file", file=errors)
        return 1
