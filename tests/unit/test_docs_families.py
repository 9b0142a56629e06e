"""docs/runtime.md describes the kernel families the declaration holds (cmake/knobs.json
"families"): its table lists exactly the declared families, with their versions, GPUs,
defaults and fallbacks, and its text names the declared default order and versions."""

from __future__ import annotations

import re
from pathlib import Path

from vendored_flash_attn.declaration import knob_values as declaration, families

RUNTIME = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def _families_table(text: str) -> list[dict[str, str]]:
    section = text.split("\n## Kernel families\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def _majors(cell: str) -> set[int]:
    """Compute capability majors a cell names: "9.x", "10.x–11.x", "8.0 and newer" (open: {-8})."""
    majors: set[int] = set()
    for low, high in re.findall(r"\b(\d+)\.x(?:–(\d+)\.x)?", cell):
        majors |= set(range(int(low), int(high or low) + 1))
    opened = re.search(r"\b(\d+)\.0 and newer", cell)
    if opened:
        majors.add(-int(opened.group(1)))
    return majors


def test_the_runtime_doc_lists_the_declared_families():
    registry = families.parse(declaration.load())
    text = RUNTIME.read_text()
    rows = _families_table(text)
    assert [(r["family"], int(r["version"])) for r in rows] == [(f.title, f.version) for f in registry]
    for row, family in zip(rows, registry):
        runs_on = _majors(row["runs on (compute capability)"])
        if family.generations:
            assert runs_on == set(family.generations), row
            for name in set(family.generations.values()):
                assert f"({name})" in row["runs on (compute capability)"], (row, name)
        else:
            assert runs_on == {-family.min_capability[0]}, row
        if family.default_on is not None:
            assert _majors(row["default on"]) == set(family.default_on), row
        else:
            assert row["default on"].startswith("every GPU it runs on"), row
        assert row["falls back to"] == (registry.by_name(family.fallback).title if family.fallback else "—")
        assert row["its calls go to"] == "`" + family.adapter.replace("vendored_flash_attn.", "").replace(":", ".") + "`"
    order = ", ".join(registry.by_name(n).title for n in registry.default_order)
    assert f"declared `default_order` ({order})" in " ".join(text.split())


def test_the_runtime_doc_names_the_declared_versions_for_the_override():
    registry = families.parse(declaration.load())
    quoted = [f'`"{v}"`' for v in registry.versions]
    words = ", ".join(quoted[:-1]) + " or " + quoted[-1]
    assert f"one of the declared versions, {words};" in " ".join(RUNTIME.read_text().split())


README = RUNTIME.parents[1] / "README.md"


def test_the_readme_gpu_table_follows_the_declared_families():
    """README's small table: on each GPU row, the families that run there and the selector's
    default, as the declaration says (a family's generations, else every GPU from its lowest
    capability; the default: the first of `default_order` whose `default_on` holds the GPU)."""
    registry = families.parse(declaration.load())
    section = README.read_text().split("\n## Supported GPUs and families\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert rows
    seen = set()
    for gpu, runs, default in rows:
        majors = _majors(gpu)
        assert majors and not majors & seen, gpu
        seen |= majors
        for major in majors:
            running = [f for f in registry
                       if (major in f.generations if f.generations else major >= f.min_capability[0])]
            assert re.findall(r"\bFA\d\b", runs) == [f.title for f in running], (gpu, runs)
            picked = next(f for f in (registry.by_name(n) for n in registry.default_order)
                          if f in running and (f.default_on is None or major in f.default_on))
            assert re.findall(r"\bFA\d\b", default)[0] == picked.title, (gpu, default)
