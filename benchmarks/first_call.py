#!/usr/bin/env python3
"""First-call latency in a fresh process.

Each measurement is a new Python process that imports torch and vendored_flash_attn,
creates small bf16 inputs (Llama-3.1-8B heads: 32/8, d=128) and times, with a device
synchronize after each step:
  import_torch_s     import torch
  import_vfa_s       import vendored_flash_attn (lazy: cheap by design)
  cuda_init_s        CUDA context + input tensors
  selector_s         (split runs only) get_flash_attn_version(): imports the compiled
                     module(s) the selector needs
  first_call_s       the first flash_attn_varlen_func call (fa_version=None: the default
                     choice), varlen prefill 1 x 256 tokens, causal; in direct runs this
                     includes the selector and the module import
  second_call_s      the same call again (steady state)
  first_decode_s     the first paged-decode call (4 sequences, page 16): another kernel
                     variant, so another lazy load / JIT
Settings: the default choice, and VLLM_FLASH_ATTN_VERSION=2. JIT cache: "cold" runs get
a fresh empty CUDA_CACHE_PATH (what a new machine or container sees: FA2 built as sm80
SASS + PTX is JIT-compiled by the driver on Hopper, one kernel variant at a time);
"warm" runs reuse the cache the cold run filled.
The bar: the default first call on Hopper in a fresh process <= 0.1 s (checked on the
cold, direct run: module import included).

FA4 (fa_version=4 on every call, so nothing falls back silently), the same two shape
classes, each in a fresh process with fa4.load() timed apart (importing cutlass and FA4's
sources takes seconds: benchmarks/import_time.py measures it), under three kernel-cache states:
  shipped     the wheel's precompiled kernels; an empty user cache
              (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR pointed at a fresh folder)
  jit         VFA_FA4_SHIPPED_KERNELS=off and an empty user cache: every kernel compiles
  user cache  a second process over the user cache the jit run filled (shipped still off)
After each call the child counts the kernels (.o) in the user cache: a call that adds one
compiled. The FA4 bar, per shape: with shipped kernels the first call <= 0.05 s and no
kernel compiled. When FA4 cannot run here the rows say why ("FA4 absent: <reason>").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

BAR_S = 0.1
FA4_BAR_S = 0.05
# The shape classes of the child, by the time each one's first call lands in.
SHAPES = {"varlen prefill 1 x 256, causal": "first_call_s", "paged decode 4 x 1, ctx 100, page 16": "first_decode_s"}
# FA4 kernel-cache states, in the order they run (the user-cache state reuses the jit state's folder).
FA4_STATES = ("shipped", "jit", "user cache")
USER_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"  # upstream's knob, read by fa4_cache.user_cache_root

CHILD = r"""
import json, os, sys, time
T = {}
t = time.perf_counter()
import torch
T["import_torch_s"] = time.perf_counter() - t
t = time.perf_counter()
import vendored_flash_attn as vfa
T["import_vfa_s"] = time.perf_counter() - t
res = {"times": T, "env_version": os.environ.get("VLLM_FLASH_ATTN_VERSION")}
res["cutlass_after_import"] = "cutlass" in sys.modules
forced = os.environ.get("VFA_FIRST_CALL_FA_VERSION") or None
forced = int(forced) if forced else None
# The forced family's kernels are CuTe DSL Python (FA4's): loaded, and their user cache
# counted, around the first call. Read from its declaration, not its version.
from vendored_flash_attn.declaration.families import CUTE_DSL, registry
cute_dsl = registry().get(forced) is not None and registry().get(forced).made == CUTE_DSL
kernels_seen = {}

class Absent(Exception):
    pass

def user_cache_kernels(step):
    # FA4: kernels (.o) in the user cache after ``step``; a step that adds one compiled it.
    if not cute_dsl:
        return
    from vendored_flash_attn.families.fa4 import cache as fa4_cache
    root = fa4_cache.user_cache_root()
    kernels_seen[step] = sum(1 for _ in root.rglob("*.o")) if root.is_dir() else 0
    res["user_cache_kernels"] = kernels_seen

try:
    if forced is not None:  # before any CUDA call: a machine without the family says why, not a crash
        res["absent"] = vfa.fa_version_unsupported_reason(forced)
        if res["absent"] is not None:
            raise Absent(res["absent"])
    t = time.perf_counter()
    torch.cuda.init()
    h, hk, d, s = 32, 8, 128, 256
    q = torch.randn(s, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(s, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(s, hk, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    b, ctx, page = 4, 100, 16
    nblk = (ctx + page - 1) // page
    kc = torch.randn(b * nblk, page, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(b * nblk, page, hk, d, device="cuda", dtype=torch.bfloat16)
    qd = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    table = torch.arange(b * nblk, dtype=torch.int32, device="cuda").view(b, nblk)
    used = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    cuq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    T["cuda_init_s"] = time.perf_counter() - t
    if cute_dsl:
        user_cache_kernels("before")
        t = time.perf_counter()
        from vendored_flash_attn.families.fa4 import adapter as fa4
        res["fa4_cache_layout"] = fa4.load().cache_layout
        T["fa4_load_s"] = time.perf_counter() - t
        res["cutlass_after_load"] = "cutlass" in sys.modules
        user_cache_kernels("load")
    if os.environ.get("VFA_FIRST_CALL_SPLIT") == "1":
        t = time.perf_counter()
        res["selected"] = vfa.get_flash_attn_version(head_size=d, dtype=torch.bfloat16)
        T["selector_s"] = time.perf_counter() - t
    call = lambda: vfa.flash_attn_varlen_func(q, k, v, s, cu, s, cu_seqlens_k=cu, causal=True,
                                              fa_version=forced)
    t = time.perf_counter()
    call()
    torch.cuda.synchronize()
    T["first_call_s"] = time.perf_counter() - t
    user_cache_kernels("first_call")
    t = time.perf_counter()
    call()
    torch.cuda.synchronize()
    T["second_call_s"] = time.perf_counter() - t
    t = time.perf_counter()
    vfa.flash_attn_varlen_func(qd, kc, vc, 1, cuq, ctx, seqused_k=used, block_table=table, causal=True,
                               fa_version=forced)
    torch.cuda.synchronize()
    T["first_decode_s"] = time.perf_counter() - t
    user_cache_kernels("first_decode")
    if forced is not None:
        res["selected"], res["reason"] = forced, f"fa_version={forced} on every call"
    else:
        sel = vfa.select_flash_attn_version(head_size=d, dtype=torch.bfloat16)
        res["selected"] = sel.version
        res["reason"] = sel.reason
    res["gpu"] = torch.cuda.get_device_name()
    res["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
except Absent:
    pass  # the family cannot run here: res["absent"] says why
except Exception as exc:
    res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
print("VFA_FIRST_CALL " + json.dumps(res))
"""


def child_env(env_version, jit_cache: Path, split: bool, extra_env=None, base=None) -> dict:
    """The child's environment: ``extra_env`` sets variables (a value of None unsets one)."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_FLASH_ATTN_VERSION", None)
    env.pop("VFA_FIRST_CALL_FA_VERSION", None)
    if env_version is not None:
        env["VLLM_FLASH_ATTN_VERSION"] = str(env_version)
    env["CUDA_CACHE_PATH"] = str(jit_cache)
    env.setdefault("CUDA_CACHE_MAXSIZE", str(4 * 2**30))
    env["VFA_FIRST_CALL_SPLIT"] = "1" if split else "0"
    for name, value in (extra_env or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def fa4_plan(root: Path) -> list[dict]:
    """FA4's child runs, in order: the cache state and the environment each one gets.
    Every run calls FA4's version explicitly (VFA_FIRST_CALL_FA_VERSION: the one CuTe DSL family's,
    from the declaration)."""
    from vendored_flash_attn.families.fa4.cache import SHIPPED_KERNELS_ENV  # the knob's one definition
    from vendored_flash_attn.declaration.families import CUTE_DSL, registry

    shipped_user, jit_user = str(root / "user-cache-shipped"), str(root / "user-cache-jit")
    (cute,) = [f for f in registry() if f.made == CUTE_DSL]
    common_env = {"VFA_FIRST_CALL_FA_VERSION": str(cute.version)}
    env = {
        "shipped": {USER_CACHE_ENV: shipped_user, SHIPPED_KERNELS_ENV: None},
        "jit": {USER_CACHE_ENV: jit_user, SHIPPED_KERNELS_ENV: "off"},
        "user cache": {USER_CACHE_ENV: jit_user, SHIPPED_KERNELS_ENV: "off"},
    }
    return [{"state": state, "env": dict(common_env, **env[state])} for state in FA4_STATES]


def run_child(env_version, jit_cache: Path, split: bool, timeout: float, extra_env=None) -> dict:
    env = child_env(env_version, jit_cache, split, extra_env)
    t0 = __import__("time").perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = __import__("time").perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("VFA_FIRST_CALL "):
            res = json.loads(line[len("VFA_FIRST_CALL "):])
            res["process_wall_s"] = wall
            return res
    return {"error": f"child exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}",
            "process_wall_s": wall}


def measure(args) -> dict:
    runs = []
    for env_version in (None, 2):
        if args.fa4_only or (args.only_default and env_version is not None):
            continue
        with tempfile.TemporaryDirectory(prefix="vfa-jit-") as jit:
            cache = Path(jit)
            plan = [("cold", False), ("warm", False), ("warm", True)]
            for jit_state, split in plan:
                label = f"{'default' if env_version is None else 'VLLM_FLASH_ATTN_VERSION=2'} / " \
                        f"JIT cache {jit_state} / {'split' if split else 'direct'}"
                print(f"[first_call] {label} ...", file=sys.stderr, flush=True)
                res = run_child(env_version, cache, split, args.timeout)
                res.update({"setting": "default" if env_version is None else "VLLM_FLASH_ATTN_VERSION=2",
                            "jit_cache": jit_state, "split": split, "label": label})
                cache_bytes = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
                res["jit_cache_bytes_after"] = cache_bytes
                runs.append(res)
                t = res.get("times", {})
                print(f"[first_call]   first call {common.fmt(t.get('first_call_s'), 3)} s, "
                      f"version {res.get('selected')}, {res.get('error', '')}", file=sys.stderr)
    fa4_runs = [] if args.no_fa4 else measure_fa4(args)
    runs += fa4_runs
    bar_run = next((r for r in runs if r["setting"] == "default" and r["jit_cache"] == "cold"
                    and not r["split"]), None)
    value = (bar_run or {}).get("times", {}).get("first_call_s")
    bar = {"bar": f"default first FA call in a fresh process <= {BAR_S} s (cold JIT cache, module import included)",
           "value_s": value, "threshold_s": BAR_S,
           "verdict": common.bar_verdict(value, BAR_S, higher_is_better=False),
           "selected": (bar_run or {}).get("selected")}
    return {"benchmark": "first_call", "machine": common.machine_info(), "build_info": common.build_info_dict(),
            "runs": runs, "bar": bar, "fa4_bars": fa4_bars(fa4_runs) if not args.no_fa4 else []}


def measure_fa4(args) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-first-call-") as root:
        jit_cache = Path(root) / "cuda-jit"
        for step in fa4_plan(Path(root)):
            label = f"FA4 / {step['state']}"
            print(f"[first_call] {label} ...", file=sys.stderr, flush=True)
            res = run_child(None, jit_cache, False, args.timeout, extra_env=step["env"])
            user = Path(step["env"][USER_CACHE_ENV])
            res.update({"setting": "fa_version=4", "fa4_cache": step["state"], "jit_cache": "-",
                        "split": True, "label": label,
                        "env": {k: v for k, v in step["env"].items() if k != USER_CACHE_ENV},
                        "user_cache_bytes_after": sum(p.stat().st_size for p in user.rglob("*") if p.is_file())})
            runs.append(res)
            if res.get("absent"):
                print(f"[first_call]   FA4 absent: {res['absent']}", file=sys.stderr)
                break  # the same in every state
            t = res.get("times", {})
            print(f"[first_call]   fa4.load {common.fmt(t.get('fa4_load_s'), 2)} s, first call "
                  f"{common.fmt(t.get('first_call_s'), 4)} s, first decode {common.fmt(t.get('first_decode_s'), 4)} s, "
                  f"compiled {fa4_compiled(res)} {res.get('error', '')}", file=sys.stderr)
    return runs


def fa4_compiled(res: dict) -> dict:
    """Kernels each step added to the user cache (a step that adds one compiled it), by
    shape; None where the child did not get that far."""
    seen = res.get("user_cache_kernels") or {}
    steps = {"fa4.load": ("before", "load"), "first_call_s": ("load", "first_call"),
             "first_decode_s": ("first_call", "first_decode")}
    return {name: (seen[b] - seen[a] if a in seen and b in seen else None) for name, (a, b) in steps.items()}


def fa4_bars(fa4_runs: list[dict]) -> list[dict]:
    """Per shape: with the shipped kernels, the first call (after fa4.load()) <= FA4_BAR_S and
    no kernel compiled."""
    shipped = next((r for r in fa4_runs if r.get("fa4_cache") == "shipped"), None)
    bars = []
    for shape, key in SHAPES.items():
        bar = {"bar": f"FA4 first call, {shape}, shipped kernels: <= {FA4_BAR_S} s, no compile",
               "shape": shape, "threshold_s": FA4_BAR_S, "value_s": None, "compiled": None}
        if shipped is None:
            bar.update(verdict="n/a", why="FA4 not run")
        elif shipped.get("absent"):
            bar.update(verdict="n/a", why=f"FA4 absent: {shipped['absent']}")
        elif (shipped.get("times") or {}).get(key) is None:
            bar.update(verdict="FAIL", why=f"no time: {shipped.get('error', 'the child stopped before this call')}")
        else:
            value, compiled = shipped["times"][key], fa4_compiled(shipped)[key]
            bar.update(value_s=value, compiled=compiled)
            fast = common.bar_verdict(value, FA4_BAR_S, higher_is_better=False) == "PASS"
            if compiled is None:
                bar.update(verdict="FAIL" if not fast else "n/a", why="the user cache could not be counted")
            else:
                bar.update(verdict="PASS" if fast and compiled == 0 else "FAIL",
                           why=f"{value:.4f} s, {compiled} kernel(s) compiled")
        bars.append(bar)
    return bars


def print_results(result: dict, plain: bool = False) -> None:
    rows = []
    for r in result["runs"]:
        if "fa4_cache" in r:
            continue  # print_fa4 shows them
        t = r.get("times", {})
        rows.append([r["setting"], f"{r['jit_cache']}/{'split' if r['split'] else 'direct'}",
                     common.fmt(r.get("selected")),
                     common.fmt(t.get("import_torch_s"), 3), common.fmt(t.get("import_vfa_s"), 4),
                     common.fmt(t.get("cuda_init_s"), 3), common.fmt(t.get("selector_s"), 3),
                     common.fmt(t.get("first_call_s"), 4), common.fmt(t.get("second_call_s"), 5),
                     common.fmt(t.get("first_decode_s"), 4),
                     (r.get("error") or "")[:60]])
    if not rows:  # --fa4-only
        print_fa4(result, plain=plain)
        return
    bar = result["bar"]
    notes = [f"BAR {bar['verdict']}: {bar['bar']}: measured {common.fmt(bar['value_s'], 4)} s "
             f"(selected FA{bar['selected']})",
             "split runs call get_flash_attn_version() first, so first_call there excludes the module import"]
    common.print_table("First call in a fresh process, seconds",
                       ["setting", "JIT/run", "FA", "import torch", "import vfa", "CUDA init", "selector",
                        "1st call", "2nd call", "1st decode", "error"], rows, notes, plain=plain)
    print_fa4(result, plain=plain)


def fa4_table(result: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """FA4's rows: one per (cache state, shape), and the bar lines."""
    columns = ["cache", "shape", "import vfa", "cutlass after import", "fa4.load", "1st call", "compiled",
               "2nd call", "shipped dir", "note"]
    rows = []
    for r in result["runs"]:
        if "fa4_cache" not in r:
            continue
        if r.get("absent"):
            rows.append([r["fa4_cache"], "-", common.fmt(r.get("times", {}).get("import_vfa_s"), 4),
                         common.fmt(r.get("cutlass_after_import")), "-", "-", "-", "-", "-",
                         f"FA4 absent: {r['absent']}"])
            continue
        t = r.get("times", {})
        compiled = fa4_compiled(r)
        kinds = ((r.get("fa4_cache_layout") or {}).get("kinds") or {})
        shipped = (kinds.get("fwd") or {}).get("shipped")
        # A Python that shares another's kernels has no folder of its own, only their index.
        aliases = (kinds.get("fwd") or {}).get("aliases")
        shipped_text = "off" if (r.get("fa4_cache_layout") or {}).get("shipped_off") else (
            "yes" if shipped else (f"shared ({aliases})" if aliases else (
                "none" if r.get("fa4_cache_layout") else "-")))
        for i, (shape, key) in enumerate(SHAPES.items()):
            rows.append([r["fa4_cache"], shape, common.fmt(t.get("import_vfa_s"), 4) if i == 0 else "",
                         common.fmt(r.get("cutlass_after_import")) if i == 0 else "",
                         common.fmt(t.get("fa4_load_s"), 2) if i == 0 else "",
                         common.fmt(t.get(key), 4), common.fmt(compiled.get(key)),
                         common.fmt(t.get("second_call_s"), 5) if key == "first_call_s" else "",
                         shipped_text if i == 0 else "", (r.get("error") or "")[:60] if i == 0 else ""])
    notes = [f"BAR {b['verdict']}: {b['bar']}: {b.get('why', '')}" for b in result.get("fa4_bars", [])]
    notes.append("fa_version=4 on every call; 1st call is timed after fa4.load() (cutlass + FA4 sources); "
                 "compiled = kernels the call added to the user cache; shipped dir: the wheel's kernels for "
                 "this Python and DSL flavour (shared (N): N kernels through its index of another Python's files; "
                 "none: the wheel ships none for them; off: VFA_FA4_SHIPPED_KERNELS=off)")
    return columns, rows, notes


def print_fa4(result: dict, plain: bool = False) -> None:
    columns, rows, notes = fa4_table(result)
    if rows:
        common.print_table("FA4 first call in a fresh process, seconds", columns, rows, notes, plain=plain)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for first_call.json")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    p.add_argument("--only-default", action="store_true", help="skip the VLLM_FLASH_ATTN_VERSION=2 runs")
    fa4 = p.add_mutually_exclusive_group()
    fa4.add_argument("--no-fa4", action="store_true", help="skip the FA4 runs")
    fa4.add_argument("--fa4-only", action="store_true", help="only the FA4 runs (shipped, jit, user cache)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the child runs and the environment each gets, run nothing")
    p.add_argument("--plain", action="store_true")
    return p.parse_args(argv)


def print_plan(args) -> None:
    if not args.fa4_only:
        for env_version in (None,) if args.only_default else (None, 2):
            for jit_state, split in (("cold", False), ("warm", False), ("warm", True)):
                print(f"{'default' if env_version is None else 'VLLM_FLASH_ATTN_VERSION=2'} / JIT cache "
                      f"{jit_state} / {'split' if split else 'direct'}")
    if not args.no_fa4:
        for step in fa4_plan(Path("<tmp>")):
            env = " ".join(f"{k}={'<unset>' if v is None else v}" for k, v in step["env"].items())
            print(f"FA4 / {step['state']}: {env}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print_plan(args)
        return 0
    result = measure(args)
    path = common.write_json(args.out / "first_call.json", result)
    print(f"[first_call] wrote {path}", file=sys.stderr)
    print_results(result, plain=args.plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
