"""Figures measured for the selector's defaults, shipped with the package (``measured.json``
next to this module), which ``python -m vendored_flash_attn info`` shows beside the families
declaration's ``not_default`` reasons (cmake/knobs.json), which cite them.

``measured.json`` holds, per GPU generation (compute capability major, as a string), the
attention seconds per family of a ``benchmarks/serving.py`` run: its replay of vLLM's seed
workload, per block size and phase, with the machine, date and command. It is written only by
``python benchmarks/serving.py --record <serving.json>`` from a run's JSON; an entry that is
absent was not measured, and nothing here is typed in by hand. Standard library only; a
missing or broken file is reported, never raised (``info`` must always work).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

FILE = Path(__file__).resolve().parents[1] / "measured.json"  # at the package root
PHASES = (("prefill_s", "prefill"), ("decode_graph_s", "decode in CUDA graphs"), ("total_graphed_s", "total"))


@functools.lru_cache(maxsize=1)
def load(path: Optional[Path] = None) -> dict:
    try:
        data = json.loads(Path(path or FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"error": f"{FILE.name}: {exc}"}
    if not isinstance(data, dict) or not isinstance(data.get("serving", {}), dict):
        return {"error": f"{FILE.name}: not an object with a 'serving' object"}
    return data


def serving(major: int, data: Optional[dict] = None) -> Optional[dict]:
    """The serving figures recorded for GPU generation ``major``, None when not measured."""
    data = load() if data is None else data
    return (data.get("serving") or {}).get(str(major))


def serving_lines(major: int, data: Optional[dict] = None) -> list[str]:
    """What ``info`` says about generation ``major``: per block size, each phase's families
    from fastest to slowest (attention seconds of the whole replayed run)."""
    data = load() if data is None else data
    if "error" in data:
        return [f"measured figures unreadable: {data['error']}"]
    entry = serving(major, data)
    if entry is None:
        return ["serving replay (benchmarks/serving.py): not measured"]
    lines = [f"serving replay (benchmarks/serving.py, {entry.get('gpu', '?')}, {entry.get('date', '?')}; "
             f"attention seconds of the seed workload; `{entry.get('command', '?')}`):"]
    for block_size, rows in sorted((entry.get("rows") or {}).items(), key=lambda kv: int(kv[0])):
        parts = []
        for key, label in PHASES:
            ranked = sorted(((name, figures[key]) for name, figures in rows.items() if figures.get(key)),
                            key=lambda pair: pair[1])
            if ranked:
                parts.append(f"{label} " + " < ".join(f"{name.upper().replace('_', ' ')} {s:.3f}" for name, s in ranked))
        lines.append(f"  block size {block_size}: " + "; ".join(parts))
    e2e = entry.get("end_to_end") or {}
    if e2e.get("fa3_over_fa2"):
        lines.append(f"  end to end (its model): FA3/FA2 {e2e['fa3_over_fa2']:.3f}x; vLLM's seed measurement "
                     f"{e2e.get('seed_fa3_over_fa2', 0):.3f}x")
    return lines
