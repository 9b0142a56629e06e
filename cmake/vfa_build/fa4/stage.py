"""FA4's staging step: upstream's ``flash_attn/cute`` copied into our package, and FA4's build record.

``stage`` copies the pinned ``flash_attn/cute`` sources into ``<dest>/<package path>`` and
rewrites their absolute ``flash_attn.cute`` imports to our subpackage
(``vendored_flash_attn._fa4.cute``), so the copy never shadows, and is never shadowed by, a
real ``flash_attn`` install; it refuses a pin whose dependencies differ from the ``fa4`` extra.
The build record (``_fa4/build_info.json`` in the stage) holds what CMake knew at configure
time and what the stage made; each ``compile`` run (an arch, a Python) is added to it. Needs
nothing but the standard library (+ packaging, through fa4_deps). Used by cmake/vfa_build/fa4/precompile.py.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import shutil
from pathlib import Path

from vendored_flash_attn.families.fa4 import deps as fa4_deps

# Where the staged copy lives inside our package, and how its sources refer to themselves.
UPSTREAM_PACKAGE = "flash_attn.cute"
VENDORED_PACKAGE = "vendored_flash_attn._fa4.cute"

# An absolute reference to upstream's package in code: `flash_attn.cute` followed by the end
# of the dotted name or a submodule. Not preceded by a name character or a dot, so
# `vendored_flash_attn.cute` or `x.flash_attn.cute` are left alone.
_UPSTREAM_REFERENCE = re.compile(r"(?<![\w.])flash_attn\.cute(?![\w])")

# Files of the cute directory that are not part of the importable package but must ship
# (the licence and its authors) or document it; every *.py file ships, because upstream's
# cache fingerprint hashes all of them and the precompiled kernels must match the copy.
_SHIPPED_NON_PYTHON = ("LICENSE", "AUTHORS", "README.md")


def _lines(source: str) -> list[str]:
    """``source``'s lines as ``ast`` counts them (``\\n``, ``\\r\\n``, ``\\r``; not str.splitlines'
    form feeds and other separators), each with its end."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n|$)", source)


def _offset(source: str, line: int, col: int) -> int:
    """The character offset of ``ast``'s (line, UTF-8 byte column) in ``source``."""
    lines = _lines(source)
    return sum(len(x) for x in lines[:line - 1]) + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8"))


# `from flash_attn import ...` at a node's start: the `flash_attn` after `from` and any spacing
# or line continuations.
_FROM_UPSTREAM_ROOT = re.compile(r"from(?:[ \t]|\\\r?\n)+(flash_attn)(?=[ \t\\])")


def _rewrite_root_imports(source: str, package: str) -> str:
    """``from flash_attn import cute [as x]`` pointed at ``package``'s parent: the one import of
    upstream's root package that names our copy. Any other name taken from ``flash_attn`` is
    left for ``upstream_imports`` to refuse."""
    parent, _, last = package.rpartition(".")
    if last != UPSTREAM_PACKAGE.rpartition(".")[2] or not parent:
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # upstream_imports names the file and line
    spans = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "flash_attn"
                and all(alias.name == last for alias in node.names)):
            match = _FROM_UPSTREAM_ROOT.match(source, _offset(source, node.lineno, node.col_offset))
            if match:
                spans.append(match.span(1))
    for start, end in sorted(spans, reverse=True):
        source = source[:start] + parent + source[end:]
    return source


def rewrite_imports(source: str, package: str = VENDORED_PACKAGE) -> str:
    """``source`` with every absolute reference to ``flash_attn.cute`` pointed at ``package``,
    and ``from flash_attn import cute`` at its parent."""
    return _rewrite_root_imports(_UPSTREAM_REFERENCE.sub(package, source), package)


def _names_upstream(name: str) -> bool:
    return name == "flash_attn" or name.startswith("flash_attn.")


def _leading_text(node: ast.AST) -> str | None:
    """The text a module-name expression starts with, where it starts with a literal:
    ``"a"``, ``"a" + x``, ``f"a{x}"``, ``"a".format(...)``, ``"%s" % x`` (its literal part)."""
    while True:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp):
            node = node.left
        elif isinstance(node, ast.JoinedStr):
            if not node.values:
                return None
            node = node.values[0]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value  # "flash_attn.{}".format(x), "flash_attn" .join(...)
        else:
            return None


_DYNAMIC_IMPORTERS = ("import_module", "__import__", "find_spec")


def upstream_imports(source: str, package: str = VENDORED_PACKAGE) -> list[tuple[int, str]]:
    """Where ``source`` (already rewritten) still imports upstream's ``flash_attn``: every
    absolute ``import flash_attn[...]`` / ``from flash_attn[...] import``, and every
    ``import_module`` / ``__import__`` / ``find_spec`` whose module name starts with
    ``flash_attn`` (a literal, a ``+``, an f-string). (line, the line's text) each; relative
    imports are our copy's own and never listed. Also a rewritten ``__import__("<package>.x")``
    without a fromlist: it returns our top package where upstream's returned ``flash_attn``.
    A file Python cannot parse is one entry."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [(err.lineno or 0, f"cannot be parsed to check its imports: {err.msg}")]
    lines = _lines(source)
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Import):
            hit = any(_names_upstream(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            hit = node.level == 0 and _names_upstream(node.module or "")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _DYNAMIC_IMPORTERS:
                text = _leading_text(node.args[0])
                # import_module(".x", "flash_attn") / find_spec(".x", package=...): the anchor package counts
                anchors = [a for a in node.args[1:2] if name != "__import__"]
                anchors += [k.value for k in node.keywords if k.arg == "package"]
                hit = any(t is not None and t.startswith("flash_attn") and not t.startswith("flash_attn_")
                          for t in [text, *map(_leading_text, anchors)])
                hit = hit or (name == "__import__" and text is not None and text.startswith(package)
                              and len(node.args) < 4
                              and not any(k.arg == "fromlist" for k in node.keywords))
        if hit:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(found)


def remaining_upstream_references(source: str) -> list[str]:
    """Lines of code (not comments) that still name upstream's package after a rewrite."""
    found = []
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _UPSTREAM_REFERENCE.search(code):
            found.append(line.strip())
    return found


def stage(cute_src: Path, dest: Path, package: str = VENDORED_PACKAGE) -> dict:
    """Copy ``cute_src`` (upstream's flash_attn/cute) to ``dest/<package as path>``, rewritten.

    ``dest`` becomes an import root: the parents of the package get an empty ``__init__.py``
    where they have none (the wheel build puts the copy inside our real package instead).
    Returns a summary: files, bytes, and the files whose imports were rewritten.
    """
    if not (cute_src / "__init__.py").is_file() or not (cute_src / "interface.py").is_file():
        raise SystemExit(f"{cute_src} is not upstream's flash_attn/cute (no __init__.py / interface.py)")
    # The fa4 extra must still be what this upstream declares: a pin bump that changes
    # flash_attn/cute's dependencies stops here, naming the difference, not at run time.
    pin_pyproject = cute_src / "pyproject.toml"
    if not pin_pyproject.is_file():
        raise SystemExit(f"{pin_pyproject} is missing: cannot check the fa4 extra against the pin")
    drift = fa4_deps.pin_drift(pin_pyproject.read_text(encoding="utf-8"))
    if drift:
        raise SystemExit(f"the fa4 extra in pyproject.toml differs from {pin_pyproject}: " + "; ".join(drift)
                         + ". Update the extra to the pin's dependencies (see fa4/deps.py).")
    target = dest.joinpath(*package.split("."))
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for parent in itertools.islice(target.parents, len(package.split(".")) - 1):
        init = parent / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")
    rewritten, files, size = [], 0, 0
    for src in sorted(cute_src.rglob("*")):
        rel = src.relative_to(cute_src)
        if src.is_dir() or "__pycache__" in rel.parts:
            continue
        if src.suffix != ".py" and rel.as_posix() not in _SHIPPED_NON_PYTHON:
            continue
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".py":
            text = src.read_text(encoding="utf-8")
            new = rewrite_imports(text, package)
            left = remaining_upstream_references(new)
            if left:
                raise SystemExit(f"{rel}: still refers to {UPSTREAM_PACKAGE} after the rewrite: {left[0]}")
            imports = upstream_imports(new, package)
            if imports:
                where = "; ".join(f"{src}:{line}: {text}" for line, text in imports)
                raise SystemExit(
                    f"cannot stage FA4: {where} imports upstream's flash_attn in a form that cannot be "
                    f"pointed at {package} safely (only flash_attn.cute names and `from flash_attn import "
                    "cute` are rewritten). The staged copy would import a real flash_attn install, or "
                    "fail without one. Make the import relative or name flash_attn.cute in that file "
                    "(a patch on the pin), or stay on a pin without it.")
            if new != text:
                rewritten.append(rel.as_posix())
            out.write_text(new, encoding="utf-8")
        else:
            shutil.copyfile(src, out)
        files += 1
        size += out.stat().st_size
    return {"package": package, "path": str(target), "files": files, "bytes": size, "rewritten": rewritten}


RECORD_FILE = "build_info.json"  # inside the staged _fa4 package: FA4's part of the build info
RECORD_SCHEMA = 1


def record_path(dest: Path, package: str = VENDORED_PACKAGE) -> Path:
    """FA4's build record in a stage: beside the staged package (``vendored_flash_attn/_fa4``)."""
    return dest.joinpath(*package.split(".")[:-1]) / RECORD_FILE


def write_record(dest: Path, configure: dict, summary: dict, package: str = VENDORED_PACKAGE) -> Path:
    """FA4's build record: what CMake knew at configure time (the sources' commit and whether
    they were verified against the pin, the precompile mode) and what the stage made."""
    record = {"schema": RECORD_SCHEMA, "package": package, **configure,
              "staged": {"files": summary["files"], "bytes": summary["bytes"],
                         "rewritten": len(summary["rewritten"])}}
    record.setdefault("precompile", {}).setdefault("runs", [])
    path = record_path(dest, package)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def add_precompile_run(record: Path, run: dict) -> None:
    """Append one ``compile`` run (an arch) to a stage's build record."""
    data = json.loads(record.read_text(encoding="utf-8"))
    data.setdefault("precompile", {}).setdefault("runs", []).append(run)
    record.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def portable(text: str) -> str:
    """``text`` (an error message) with every absolute path cut to its last part: FA4's
    build record ships in the wheel, whose bytes must not depend on where this machine keeps
    its Python, its temporary build environment (pip's isolation) or the build dir."""
    return re.sub(r"(?<![\w.~])/(?:[^\s/'\":]+/)+(?=[^\s/'\":])", ".../", text)
