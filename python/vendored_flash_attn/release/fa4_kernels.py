"""On a GPU, with the wheel installed: FA4's precompiled kernels run with no compile.

    python -m vendored_flash_attn.release.wheel_check fa4-kernels [--report FILE]
    (the same: cmake/vfa_build/fa4/precompile.py check-installed [--report FILE])

Every kernel the wheel precompiled for this Python and this GPU (the calls its build record's
runs planned, vendored_flash_attn.families.fa4.plan) is called through the public
``flash_attn_varlen_func`` on real data; nothing may compile: a kernel written to the user
cache (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR, which must start empty) means one did. The GPU
half of the release gate's checks of FA4 (wheel_check's checks need no GPU).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..families.fa4 import cache as fa4_cache
from ..families.fa4.plan import FAMILY, Selection, make_call, plan
from ..declaration.families import registry
from .common import PACKAGE


def check_installed(report_path: Path | None = None) -> int:
    """On a GPU, with the wheel installed: every kernel the wheel precompiled for this Python
    and this GPU, called through the public ``flash_attn_varlen_func`` with FA4's version on
    real data, must load from the shipped kernels — nothing may compile (a kernel written to
    the user cache, which must start empty, means it did). Prints one line per call; exit
    status 1 when any call compiled, failed or returned non-finite values."""
    from importlib import resources

    import torch

    from ..families.fa4 import adapter as fa4
    from ..interface import flash_attn_varlen_func

    user = fa4_cache.user_cache_root()
    if fa4_cache.kernel_files(user):
        raise SystemExit(f"the user cache {user} is not empty: point FLASH_ATTENTION_CUTE_DSL_CACHE_DIR at an empty folder")
    family = registry().by_name(FAMILY)
    record = json.loads(resources.files(PACKAGE).joinpath(*family.record.split("/")).read_text(encoding="utf-8"))
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    runs = [r for r in record.get("precompile", {}).get("runs", [])
            if r.get("arch") == arch and r.get("python") == python and r.get("kernels")]
    result = {"arch": arch, "python": python, "shipped_runs": len(runs), "calls": []}
    if not runs:
        print(f"this wheel ships no FA4 kernels for {arch} and Python {python}: "
              f"{[(r.get('arch'), r.get('python'), r.get('kernels')) for r in record.get('precompile', {}).get('runs', [])]}")
        return 1
    t0 = time.perf_counter()
    loaded = fa4.load()
    result["load_seconds"] = round(time.perf_counter() - t0, 3)
    calls = []
    for run in runs:
        chosen = {k: tuple(v) for k, v in run["selection"].items()}
        calls += [c for c in plan(Selection(**chosen), arch) if c not in calls]
    for call in calls:
        args, kwargs = make_call(loaded.interface, torch, call, major, real=True)
        before = fa4_cache.kernel_files(user)
        torch.cuda.synchronize()
        start = time.perf_counter()
        error = None
        try:
            out = flash_attn_varlen_func(*args, fa_version=family.version, **kwargs)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            tensors = out if isinstance(out, tuple) else (out,)
            finite = all(bool(torch.isfinite(t).all()) for t in tensors)
        except Exception as exc:  # noqa: BLE001 - reported per call
            first, finite, error = time.perf_counter() - start, False, f"{type(exc).__name__}: {exc}"[:300]
        compiled = sorted(set(fa4_cache.kernel_files(user)) - set(before))
        row = {"call": call.name, "first_call_s": round(first, 4), "compiled": compiled,
               "finite": finite, "error": error}
        result["calls"].append(row)
        status = error or ("COMPILED " + ", ".join(compiled) if compiled else "") or ("" if finite else "NON-FINITE")
        print(f"  {call.name:48s} {first * 1e3:8.2f} ms  {status or 'loaded'}", flush=True)
    bad = [r["call"] for r in result["calls"] if r["compiled"] or r["error"] or not r["finite"]]
    times = sorted(r["first_call_s"] for r in result["calls"])
    result.update(failed=bad, first_call_max_s=times[-1], first_call_median_s=times[len(times) // 2])
    print(f"{len(calls) - len(bad)} of {len(calls)} precompiled kernels ran with no compile on {arch} "
          f"(Python {python}); first call median {result['first_call_median_s'] * 1e3:.1f} ms, max "
          f"{result['first_call_max_s'] * 1e3:.1f} ms; FA4 load {result['load_seconds']} s")
    if report_path:
        report_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 1 if bad else 0

