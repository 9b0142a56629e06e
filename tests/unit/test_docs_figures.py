"""Figures the docs cite: each from a table or file in the repository, one figure in
every place that cites it."""

from __future__ import annotations

import json

import re
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PERFORMANCE = PROJECT / "docs" / "PERFORMANCE.md"

# *.md names cited that belong to other projects.
EXTERNAL_DOCS = {
    "docs/Distributed.md": "sccache's own docs (dist-compile/README.md)",
    # upstream's flash_attn/cute/README.md, shipped with FA4 (cmake/FA4Package.cmake names it
    # as ${cute}/README.md) and imitated by the synthetic upstream
    "/README.md": "upstream's flash_attn/cute/README.md",
    "flash_attn/cute/README.md": "upstream's flash_attn/cute/README.md",
}


def test_every_markdown_file_cited_is_in_the_repository():
    """A figure's source must travel with the repository (PERFORMANCE.md cited a file of
    anchor figures that never was in it)."""
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT,
                             capture_output=True, text=True, check=True).stdout.split()
    docs = {Path(f) for f in tracked if f.endswith(".md")}
    names = {d.name for d in docs}
    missing = []
    for text_file in tracked:
        if not text_file.endswith((".md", ".py", ".cmake", ".sh", ".txt", ".toml", ".json")):
            continue
        path = PROJECT / text_file
        if not path.is_file():
            continue
        for cited in set(re.findall(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b", path.read_text(errors="replace"))):
            candidates = (Path(text_file).parent / cited, Path(cited))
            resolved = any((PROJECT / c).resolve().is_file() for c in candidates) or cited in names
            if not resolved and cited not in EXTERNAL_DOCS:
                missing.append(f"{text_file}: {cited}")
    assert missing == []


def fp8_two_level_speed_table() -> list[tuple[str, float, float]]:
    """(case, FP8 TFLOP/s on, off) from PERFORMANCE.md's FP8 two-level speed table."""
    section = PERFORMANCE.read_text().split("## FP8 two-level accumulation", 1)[1].split("\n## ", 1)[0]
    table = section.split("| case | FP8 TFLOP/s, on | FP8 TFLOP/s, off |", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    return [(case, float(on), float(off)) for case, on, off, *_ in rows]


def test_the_fp8_two_level_off_speed_up_is_one_figure_from_its_table():
    rows = fp8_two_level_speed_table()
    assert len(rows) == 3
    gains = [round((off / on - 1) * 100) for _, on, off in rows]
    figure = f"{min(gains)}–{max(gains)} %"
    assert f"`OFF` buys {figure} of FP8 speed" in " ".join(PERFORMANCE.read_text().split())
    # The fa3 family's declared build notes (cmake/knobs.json, build.why) cite it where the knob's define is.
    why = " ".join(" ".join(json.loads((PROJECT / "cmake" / "knobs.json").read_text())["families"]["fa3"]["build"]["why"]).split())
    assert f"OFF is {figure} faster FP8" in why
