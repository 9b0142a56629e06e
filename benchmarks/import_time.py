#!/usr/bin/env python3
"""Import time: ``import vendored_flash_attn`` alone, and the first FA4 use, in fresh processes.

Each sample is a new Python process (``--repeats`` per kind, median reported):
  bare interpreter   ``python -c pass``-like: the floor every other row carries
  vfa alone          ``import vendored_flash_attn`` first thing in the process: the package
                     must stay lazy (no torch, no compiled module, no cutlass)
  torch + vfa        ``import torch`` then ``import vendored_flash_attn`` (vLLM's order)
  FA4 first use      ``import torch``, ``import vendored_flash_attn``, then
                     ``vendored_flash_attn.families.fa4.adapter.load()``: the dependency check, the import of
                     cutlass and FA4's sources and the kernel-cache install, what the first
                     ``fa_version=4`` call pays once per process (no GPU needed)
Each child reports which heavy modules (torch, cutlass, tvm_ffi, quack, FA4's sources) are
in ``sys.modules`` after each step. The check: ``import vendored_flash_attn`` (and the
selector's FA4 query ``fa_version_unsupported_reason(4)``) must leave ``cutlass`` out of
``sys.modules``; the script exits 1 when a sample breaks it. When FA4 cannot load
(no ``[fa4]`` extra, no FA4 in the wheel) its row says "FA4 absent: <reason>".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

KINDS = ("bare", "vfa_alone", "torch_vfa", "fa4_first_use")
KIND_LABEL = {"bare": "bare interpreter", "vfa_alone": "import vendored_flash_attn alone",
              "torch_vfa": "import torch + vendored_flash_attn", "fa4_first_use": "FA4 first use (fa4.load())"}
# Modules whose presence in sys.modules the children report; cutlass must stay out until FA4 is used.
WATCHED = ("torch", "cutlass", "tvm_ffi", "quack", "vendored_flash_attn._fa4.cute.interface")
LAZY_MODULE = "cutlass"

CHILD = r"""
import json, os, sys, time
kind = os.environ["VFA_IMPORT_TIME_KIND"]
watched = json.loads(os.environ["VFA_IMPORT_TIME_WATCHED"])
res = {"kind": kind, "steps": {}, "modules": {}}
def step(name, fn):
    t = time.perf_counter()
    value = fn()
    res["steps"][name] = time.perf_counter() - t
    res["modules"][name] = [m for m in watched if m in sys.modules]
    return value
try:
    if kind in ("torch_vfa", "fa4_first_use"):
        step("import torch", lambda: __import__("torch"))
    if kind != "bare":
        vfa = step("import vendored_flash_attn", lambda: __import__("vendored_flash_attn"))
    if kind == "fa4_first_use":
        res["fa4_reason"] = step("fa_version_unsupported_reason(4)", lambda: vfa.fa_version_unsupported_reason(4))
        def load():
            from vendored_flash_attn.families.fa4 import adapter as fa4
            return fa4.load()
        try:
            layout = step("fa4.load()", load)
            res["fa4_cache_layout"] = layout.cache_layout
        except Exception as exc:
            res["absent"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:600]
except Exception as exc:
    res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
print("VFA_IMPORT_TIME " + json.dumps(res))
"""


def run_child(kind: str, timeout: float, env=None) -> dict:
    child_env = dict(os.environ if env is None else env)
    child_env["VFA_IMPORT_TIME_KIND"] = kind
    child_env["VFA_IMPORT_TIME_WATCHED"] = json.dumps(WATCHED)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"kind": kind, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("VFA_IMPORT_TIME "):
            res = json.loads(line[len("VFA_IMPORT_TIME "):])
            res["process_wall_s"] = wall
            return res
    return {"kind": kind, "error": f"child exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}",
            "process_wall_s": wall}


def lazy_violations(samples: list[dict]) -> list[str]:
    """Every step before FA4's own load that left ``cutlass`` in sys.modules."""
    found = []
    for i, s in enumerate(samples):
        for step, modules in (s.get("modules") or {}).items():
            if step != "fa4.load()" and LAZY_MODULE in modules:
                found.append(f"{KIND_LABEL.get(s.get('kind'), s.get('kind'))} sample {i}: "
                             f"{LAZY_MODULE} in sys.modules after {step}")
    return found


def summarise(samples: list[dict], kinds=KINDS) -> dict:
    """Median seconds per (kind, step) and of the whole process; FA4's absence reason."""
    out: dict = {}
    for kind in kinds:
        mine = [s for s in samples if s.get("kind") == kind]
        ok = [s for s in mine if not s.get("error")]  # FA4 absent: its steps before fa4.load() still count
        row: dict = {"samples": len(mine), "ok": len(ok), "steps": {}}
        steps = []
        for s in ok:
            steps += [k for k in s["steps"] if k not in steps]
        for name in steps:
            values = [s["steps"][name] for s in ok if name in s["steps"]]
            row["steps"][name] = {"median_s": statistics.median(values), "min_s": min(values),
                                  "max_s": max(values), "n": len(values)}
        walls = [s["process_wall_s"] for s in ok if s.get("process_wall_s") is not None]
        row["process_wall_median_s"] = statistics.median(walls) if walls else None
        absent = next((s["absent"] for s in mine if s.get("absent")), None)
        if absent:
            row["absent"] = absent
        errors = [s["error"] for s in mine if s.get("error")]
        if errors:
            row["errors"] = errors[:3]
        last = ok[-1] if ok else (mine[-1] if mine else {})
        row["modules_after"] = last.get("modules", {})
        out[kind] = row
    return out


def step_median(summary: dict, kind: str, step: str) -> Optional[float]:
    return ((summary.get(kind) or {}).get("steps", {}).get(step) or {}).get("median_s")


def table(result: dict) -> tuple[list[str], list[list[str]], list[str]]:
    s = result["summary"]
    columns = ["process", "import torch", "import vfa", "FA4 query", "fa4.load()", "process wall",
               "modules after import vfa", "note"]
    rows = []
    for kind in result["kinds"]:
        row = s.get(kind) or {}
        note = ""
        if row.get("absent"):
            note = f"FA4 absent: {row['absent']}"
        elif row.get("errors"):
            note = f"error: {row['errors'][0]}"
        mods = row.get("modules_after", {}).get("import vendored_flash_attn")
        rows.append([KIND_LABEL[kind],
                     common.fmt(step_median(s, kind, "import torch"), 3),
                     common.fmt(step_median(s, kind, "import vendored_flash_attn"), 4),
                     common.fmt(step_median(s, kind, "fa_version_unsupported_reason(4)"), 4),
                     common.fmt(step_median(s, kind, "fa4.load()"), 2),
                     common.fmt(row.get("process_wall_median_s"), 2),
                     "-" if mods is None else (", ".join(mods) or "none watched"),
                     note[:100]])
    lazy = result["lazy_check"]
    notes = [f"median of {result['repeats']} fresh processes per row, seconds",
             f"CHECK {lazy['verdict']}: {lazy['check']}" + (": " + "; ".join(lazy["violations"][:3])
                                                             if lazy["violations"] else "")]
    fa4 = step_median(s, "fa4_first_use", "fa4.load()")
    vfa = step_median(s, "torch_vfa", "import vendored_flash_attn")
    if fa4 is not None and vfa is not None:
        notes.append(f"FA4's first use adds {fa4:.2f} s to a process (import vendored_flash_attn: {vfa:.4f} s)")
    return columns, rows, notes


def measure(args) -> dict:
    kinds = [k for k in KINDS if k in args.kinds]
    samples = []
    # Interleave the kinds, so that a slow phase of the machine hits all of them alike.
    for i in range(args.repeats):
        for kind in kinds:
            res = run_child(kind, args.timeout)
            res["repeat"] = i
            samples.append(res)
            print(f"[import_time] {kind} #{i}: " + ", ".join(f"{k} {v:.3f} s" for k, v in res.get("steps", {}).items())
                  + (f" ({res.get('absent') or res.get('error')})" if res.get("absent") or res.get("error") else ""),
                  file=sys.stderr, flush=True)
    violations = lazy_violations(samples)
    return {
        "benchmark": "import_time", "machine": common.machine_info(gpu=False),
        "build_info": common.build_info_dict(), "repeats": args.repeats, "kinds": kinds,
        "watched_modules": list(WATCHED), "samples": samples, "summary": summarise(samples, kinds),
        "lazy_check": {"check": f"import vendored_flash_attn (and the selector's FA4 query) leaves "
                                f"{LAZY_MODULE} out of sys.modules",
                       "verdict": "PASS" if not violations else "FAIL", "violations": violations},
    }


def print_results(result: dict, plain: bool = False) -> None:
    columns, rows, notes = table(result)
    common.print_table("Import time in a fresh process", columns, rows, notes, plain=plain)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for import_time.json")
    p.add_argument("--repeats", type=int, default=7, help="fresh processes per kind (default 7)")
    p.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS, help="which processes to run")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per child process")
    p.add_argument("--plain", action="store_true")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = measure(args)
    path = common.write_json(args.out / "import_time.json", result)
    print(f"[import_time] wrote {path}", file=sys.stderr)
    print_results(result, plain=args.plain)
    return 0 if result["lazy_check"]["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
