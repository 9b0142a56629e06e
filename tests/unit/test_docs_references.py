"""README.md, docs/*.md and every other Markdown file of the repository name its files,
knobs and modules as they are.

Every repository path the docs name in code (a `span` or a code block) is a file or folder of
the repository, and every relative link's target too; every `VFA_*` setting is a knob that
cmake/knobs.json declares; every `vendored_flash_attn.<name>` is a module of the package (and
its `<module>.<name>` a name defined there), a name the package exports, or a module the
build makes for a declared family; docs/runtime.md's file table lists exactly the package's
files. What the docs name that is not ours (upstream's files, the example family of
docs/runtime.md's "Adding a family", the typo README shows being refused) is listed here with
why, and each such entry must still be named somewhere, so the lists cannot rot."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Iterator

PROJECT = Path(__file__).resolve().parents[2]
PACKAGE = PROJECT / "python" / "vendored_flash_attn"
DOCS = [PROJECT / name for name in subprocess.run(["git", "ls-files", "*.md"], cwd=PROJECT, capture_output=True,
                                                 text=True, check=True).stdout.split()]

# Repository-looking paths the docs name that are not files of this repository.
NOT_OURS_PATHS = {
    "tests/test_vllm_flash_attn.py": "upstream's test file at the pin (tests/upstream runs it)",
    "tests/cute/test_flash_attn_fp8_kv_cache.py": "upstream's FA4 FP8 KV test at the pin",
    "tests/kernels/test_flash_attn.py": "vLLM's test file, of which upstream's is a copy (tests/upstream/README.md)",
    "python/vendored_flash_attn/families/fa5.py": "the example family of docs/runtime.md's \"Adding a family\"",
}
# `VFA_*` words that are not knobs.
NOT_KNOBS = {
    "VFA_PRESTE": "README's example of a typo'd knob that stops the configure",
    "VFA_DIST_SERVER_KEY_CREATED": "a line of the cluster's secrets file (dist-compile/cluster.py secrets), no setting",
}
# `vendored_flash_attn.<name>` the docs name that no module or family declares.
NOT_OUR_MODULES = {
    "families.fa5": "the example family of docs/runtime.md's \"Adding a family\"",
    "_fa5": "the example family of docs/runtime.md's \"Adding a family\"",
}

_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SPLIT = re.compile(r"[\s=,;()\"'|]+")


@lru_cache(maxsize=1)
def tracked() -> frozenset[str]:
    """The repository's files (tracked, or new and not ignored) and every folder above one."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT, capture_output=True,
                           text=True, check=True).stdout.split()
    found = set(files)
    for name in files:
        parts = name.split("/")
        found |= {"/".join(parts[:i]) for i in range(1, len(parts))}
    return frozenset(found)


def code_words(text: str) -> Iterator[tuple[int, str]]:
    """(line, word) of what the text holds in code: the words of each `span`, and every word
    of a fenced code block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        for chunk in ([line] if fenced else _SPAN.findall(line)):
            # a comma inside braces is the shorthand's (a/{b,c}.py), not a separator
            chunk = re.sub(r"\{[^{}]*\}", lambda m: m.group(0).replace(",", "\0"), chunk)
            for word in (w.replace("\0", ",") for w in _SPLIT.split(chunk)):
                word = word.strip("`*.:")
                if word:
                    yield number, word


def _expand_braces(path: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (the docs' shorthand for sibling files)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not match:
        return [path]
    return [p for choice in match.group(1).split(",")
            for p in _expand_braces(path[:match.start()] + choice + path[match.end():])]


def path_problem(path: str) -> str | None:
    """Why a repository path the docs name is not one; None when it is. A placeholder
    (``<stage>``, ``$VAR``) stands for a part the reader fills in: what precedes it must exist."""
    path = re.sub(r":\d+.*$|#.*$", "", path).rstrip("/")
    for one in _expand_braces(path):
        placeholder = re.search(r"[<$]", one)
        if placeholder:
            one = one[:placeholder.start()].rsplit("/", 1)[0]
        if any(c in one for c in "*?["):
            if not any(fnmatch.fnmatchcase(name, one) for name in tracked()):
                return f"{one} matches no file"
        elif one not in tracked():
            return f"{one} is not in the repository"
    return None


def test_every_repository_path_the_docs_name_exists():
    tops = {name.split("/")[0] for name in tracked() if "/" in name} | {n for n in tracked() if "/" not in n}
    wrong, seen_not_ours = [], set()
    for doc in DOCS:
        text = doc.read_text()
        for number, word in code_words(text):
            if "/" not in word or word.split("/")[0] not in tops:
                continue
            if word in NOT_OURS_PATHS:
                seen_not_ours.add(word)
                continue
            problem = path_problem(word)
            if problem:
                wrong.append(f"{doc.relative_to(PROJECT)}:{number}: `{word}`: {problem}")
        for number, line in enumerate(text.splitlines(), 1):
            for target in _LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL, an anchor of the same page
                rel = (doc.parent / target.split("#")[0]).resolve().relative_to(PROJECT).as_posix()
                if rel not in tracked():
                    wrong.append(f"{doc.relative_to(PROJECT)}:{number}: link ({target}): {rel} is not in the repository")
    assert wrong == []
    assert seen_not_ours == set(NOT_OURS_PATHS), "no doc names these any more: drop them from NOT_OURS_PATHS"


@lru_cache(maxsize=1)
def knob_names() -> frozenset[str]:
    from vfa_build.knobs import knobs

    declaration = knobs.load()
    return frozenset(declaration.known_names()) | frozenset(declaration.cache_variables)


def test_every_knob_the_docs_name_is_declared():
    """Anywhere in the text, not only in code: a knob named in prose is one a reader sets.
    ``VFA_FA3_*`` (a family of knobs) must be the start of a declared one."""
    wrong, seen_not_knobs = [], set()
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for name in re.findall(r"\bVFA_[A-Za-z0-9_]*\*?", line):
                if name in NOT_KNOBS:
                    seen_not_knobs.add(name)
                elif name.endswith(("*", "_")):
                    if not any(known.startswith(name.rstrip("*")) for known in knob_names()):
                        wrong.append(f"{doc.relative_to(PROJECT)}:{number}: {name}: no declared knob starts so")
                elif name not in knob_names():
                    wrong.append(f"{doc.relative_to(PROJECT)}:{number}: {name} is not declared in cmake/knobs.json")
    assert wrong == []
    assert seen_not_knobs == set(NOT_KNOBS), "no doc names these any more: drop them from NOT_KNOBS"


@lru_cache(maxsize=None)
def defined_names(module: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level."""
    found = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return frozenset(found)


def built_modules() -> set[str]:
    """What the build puts into the package for the declared families: each compiled family's
    module, each packaged family's subpackage and the module that marks it (``probe``)."""
    from vendored_flash_attn.declaration.families import registry

    found = set()
    for family in registry():
        for dotted in (family.module, family.subpackage, family.probe):
            if dotted:
                found.add(dotted.removeprefix("vendored_flash_attn."))
    return found


def module_problem(dotted: str) -> str | None:
    """Why ``vendored_flash_attn.<dotted>`` names nothing of the package; None when it does."""
    import vendored_flash_attn

    parts = dotted.split(".")
    folder = PACKAGE
    for i, part in enumerate(parts):  # down the package's folders to a module, then a name of it
        module = folder / f"{part}.py"
        if module.is_file():
            if len(parts) > i + 1 and parts[i + 1] not in defined_names(module):
                return f"{module.relative_to(PACKAGE).as_posix()} defines no {parts[i + 1]}"
            return None
        if not (folder / part / "__init__.py").is_file():
            break
        folder = folder / part
    else:
        return None  # a folder of the package
    if parts[0] in vendored_flash_attn.__all__:
        return None
    built = built_modules()
    # a built module, or one below a staged package (upstream's own modules, e.g. _fa4.cute.interface)
    if any(dotted == b or dotted.startswith(b + ".") for b in built):
        return None
    if any(b.startswith(dotted + ".") for b in built):  # a package above one (_fa4)
        return None
    return "no module of the package, no name it exports, no module the build makes"


def test_every_package_module_the_docs_name_exists():
    wrong, seen_not_ours = [], set()
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in re.finditer(r"\bvendored_flash_attn((?:\.[A-Za-z_]\w*)+)", line):
                dotted = match.group(1)[1:]
                ours = next((m for m in NOT_OUR_MODULES if dotted == m or dotted.startswith(m + ".")), None)
                if ours:
                    seen_not_ours.add(ours)
                    continue
                problem = module_problem(dotted)
                if problem:
                    wrong.append(f"{doc.relative_to(PROJECT)}:{number}: vendored_flash_attn.{dotted}: {problem}")
    assert wrong == []
    assert seen_not_ours == set(NOT_OUR_MODULES), "no doc names these any more: drop them from NOT_OUR_MODULES"


def test_the_runtime_doc_lists_every_file_of_the_package():
    """docs/runtime.md's file table: each package file in one row (by its path in the package),
    and no file that is gone. A folder's __init__.py holds only its docstring (test_package.py)
    and has no row."""
    text = (PROJECT / "docs" / "runtime.md").read_text()
    table = text.split("\n| file | concern |\n", 1)[1].split("\n\n", 1)[0]
    listed = [name for row in table.splitlines()[1:] for name in _SPAN.findall(row.strip("|").split("|")[0])]
    files = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
                   if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts
                   and not (p.name == "__init__.py" and p.parent != PACKAGE))
    assert sorted(listed) == files


def test_every_name_the_docs_take_from_a_module_of_ours_is_there():
    """`fa4.run`, `fa4.cache.install`, `sccache_stats.save_counts`: in code, a module of the
    package or of the build's (cmake/vfa_build) followed by a name must define that name; a
    module of the build named as the entry point takes it (`knobs.knobs`, `fa4.precompile`) is one. `call.<field>` may
    also be a field of a family's declared `call` (families.CallRules)."""
    import dataclasses

    from vendored_flash_attn.declaration.families import CallRules

    modules: dict[str, list[Path]] = {}
    build = PROJECT / "cmake" / "vfa_build"
    # The build's modules by name, but for fa4/'s, whose names (compile, stage, precompile, ...) are
    # words a record's fields use too (`precompile.archs`): the docs name those by their path.
    for path in (*PACKAGE.rglob("*.py"), *(p for p in build.rglob("*.py") if p.parent.name != "fa4")):
        modules.setdefault(path.stem, []).append(path)  # op_schemas: the package's and the build's
        if PACKAGE in path.parents and path.stem != "__init__":  # and by its path: fa4.cache, families.fa2
            parts = path.relative_to(PACKAGE).with_suffix("").parts
            for i in range(len(parts) - 1):
                modules.setdefault(".".join(parts[i:]), []).append(path)
    call_fields = {f.name for f in dataclasses.fields(CallRules)}
    wrong = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for span in _SPAN.findall(line):
                for word in span.split():
                    if re.search(r"\.(json|jsonl|txt|tsv|log|py|md|sh|toml|cmake)\b", word):
                        continue  # a file's name (build_info.wheel.json, kernels.jsonl)
                    for dotted in re.findall(r"(?<![\w./-])([a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)", word):
                        parts = dotted.split(".")  # the longest start that names a module, then a name
                        at = next((i for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in modules), 1)
                        module, name = ".".join(parts[:at]), parts[at]
                        if module not in modules or any(name in defined_names(m) for m in modules[module]):
                            continue
                        if (build / module.replace(".", "/") / f"{name}.py").is_file():
                            continue  # a module of the build as its entry point names it
                        if module == "call" and name in call_fields:
                            continue
                        where = " or ".join(str(m.relative_to(PROJECT)) for m in modules[module])
                        wrong.append(f"{doc.relative_to(PROJECT)}:{number}: `{module}.{name}`: {where} defines no {name}")
    assert wrong == []
