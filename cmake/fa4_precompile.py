#!/usr/bin/env python3
"""FA4 (upstream's ``flash_attn/cute``, CuTe DSL) as a subpackage of ours, compiled ahead of time.

Prototype of the two build steps the wheel build will call (docs/fa4.md says why each
choice was made and what was measured):

``stage``
    Copies the pinned ``flash_attn/cute`` sources into ``<dest>/<package path>`` and rewrites
    their absolute ``flash_attn.cute`` imports to our subpackage
    (``vendored_flash_attn._fa4.cute``), so the copy never shadows, and is never shadowed
    by, a real ``flash_attn`` install. Needs nothing but the standard library.

``plan``
    Prints the kernel calls a selection (head dims, dtypes, masks, layouts, GQA ratios,
    LSE) makes, one per compile key family the dispatch can reach. Standard library only.

``compile``
    Runs those calls through upstream's public ``flash_attn_func`` /
    ``flash_attn_varlen_func`` on fake CUDA tensors (torch ``FakeTensorMode``) with
    upstream's disk cache enabled, so each call compiles one real kernel (SASS for
    ``--arch``) into the cache and launches nothing: no GPU is needed. Needs torch and the
    ``fa4`` extra (``nvidia-cutlass-dsl`` ...) in the interpreter that runs it. The cache
    lands in ``<out>/<dsl flavour>/<upstream fingerprint>/<kernel kind>/<key hash>.o``:
    upstream's fingerprint covers the sources, Python minor, cutlass and tvm-ffi versions
    but not which CUDA build of the DSL compiled (cu12 and cu13 builds of
    ``nvidia-cutlass-dsl`` have one version string), so the flavour directory above it
    keeps kernels of one flavour from ever loading in the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from vendored_flash_attn import fa4_cache, fa4_deps  # noqa: E402  (standard library only)

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


def rewrite_imports(source: str, package: str = VENDORED_PACKAGE) -> str:
    """``source`` with every absolute reference to ``flash_attn.cute`` pointed at ``package``."""
    return _UPSTREAM_REFERENCE.sub(package, source)


def remaining_upstream_references(source: str) -> list[str]:
    """Lines of code (not comments) that still name upstream's package after a rewrite."""
    found = []
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _UPSTREAM_REFERENCE.search(code):
            found.append(line.strip())
    return found


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
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def add_precompile_run(record: Path, run: dict) -> None:
    """Append one ``compile`` run (an arch) to a stage's build record."""
    data = json.loads(record.read_text())
    data.setdefault("precompile", {}).setdefault("runs", []).append(run)
    record.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def probe() -> dict:
    """What the build's Python can do: "" when it can, else why not (CMake reads this).

    stage: fa4_deps.pin_drift needs packaging and tomllib/tomli. precompile: torch and the
    fa4 extra in its pinned versions (read from metadata: cutlass is not imported here).
    """
    import importlib.util

    stage_missing = [m for m in ("packaging",) if importlib.util.find_spec(m) is None]
    if importlib.util.find_spec("tomllib") is None and importlib.util.find_spec("tomli") is None:
        stage_missing.append("tomli")
    stage_reason = (f"the build's Python ({sys.executable}) lacks {', '.join(stage_missing)}"
                    if stage_missing else "")
    if stage_reason:
        return {"stage": stage_reason, "precompile": "FA4 is not staged: " + stage_reason}
    problems = fa4_deps.problems()
    if importlib.util.find_spec("torch") is None:
        problems.append("torch is not installed")
    precompile_reason = ""
    if problems:
        precompile_reason = (f"the build's Python ({sys.executable}) lacks FA4's dependencies: "
                             + "; ".join(problems) + f" (install them with: {fa4_deps.INSTALL_COMMAND})")
    return {"stage": "", "precompile": precompile_reason}


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
                         + ". Update the extra to the pin's dependencies (see fa4_deps.py).")
    target = dest.joinpath(*package.split("."))
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for parent in itertools.islice(target.parents, len(package.split(".")) - 1):
        init = parent / "__init__.py"
        if not init.exists():
            init.write_text("")
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
            if new != text:
                rewritten.append(rel.as_posix())
            out.write_text(new, encoding="utf-8")
        else:
            shutil.copyfile(src, out)
        files += 1
        size += out.stat().st_size
    return {"package": package, "path": str(target), "files": files, "bytes": size, "rewritten": rewritten}


# ---------------------------------------------------------------------------------------
# Selection -> kernel calls
# ---------------------------------------------------------------------------------------

DTYPES = ("bf16", "fp16")
MASKS = ("full", "causal", "local")
# fixed: flash_attn_func on (batch, seqlen, heads, dim); varlen: cu_seqlens_q/k;
# paged: cu_seqlens_q + page_table + seqused_k (vLLM's prefill / decode form).
LAYOUTS = ("fixed", "varlen", "paged")

# Shapes of the fake tensors. They pick no kernel by themselves except through what the
# compile key holds (tile sizes follow head dim / mask; pack-GQA follows the head ratio;
# page size == tile_n decides TMA paged loads), so one representative per class suffices.
BATCH = 2
SEQLEN = 1024
PAGE_SIZE = 128
LOCAL_WINDOW = (256, 0)


@dataclasses.dataclass(frozen=True)
class KernelCall:
    layout: str
    head_dim: int
    dtype: str
    mask: str
    q_heads: int
    kv_heads: int
    return_lse: bool

    @property
    def name(self) -> str:
        gqa = self.q_heads // self.kv_heads
        return (f"{self.layout}-hd{self.head_dim}-{self.dtype}-{self.mask}-gqa{gqa}"
                f"{'-lse' if self.return_lse else ''}")


@dataclasses.dataclass(frozen=True)
class Selection:
    head_dims: tuple[int, ...] = (128,)
    dtypes: tuple[str, ...] = ("bf16",)
    masks: tuple[str, ...] = ("full", "causal")
    layouts: tuple[str, ...] = ("varlen", "paged")
    # (query heads, KV heads): ratio 1 is plain MHA; ratio > 1 takes upstream's pack-GQA path.
    heads: tuple[tuple[int, int], ...] = ((16, 4),)
    return_lse: tuple[bool, ...] = (False,)

    def __post_init__(self):
        for name, values, allowed in (("dtypes", self.dtypes, DTYPES), ("masks", self.masks, MASKS),
                                      ("layouts", self.layouts, LAYOUTS)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"FA4 selection: {name} {bad} unknown; allowed: {', '.join(allowed)}")
        for q, kv in self.heads:
            if kv <= 0 or q % kv:
                raise ValueError(f"FA4 selection: {q} query heads are not a multiple of {kv} KV heads")
        bad_dims = [d for d in self.head_dims if d % 8 or not 8 <= d <= 256]
        if bad_dims:
            raise ValueError(f"FA4 selection: head dims {bad_dims} are not multiples of 8 in 8..256")


def plan(selection: Selection) -> list[KernelCall]:
    """One call per kernel the selection can reach, in a stable order, no duplicates."""
    calls = []
    for layout, dim, dtype, mask, (q, kv), lse in itertools.product(
            selection.layouts, selection.head_dims, selection.dtypes, selection.masks,
            selection.heads, selection.return_lse):
        call = KernelCall(layout, dim, dtype, mask, q, kv, lse)
        if call not in calls:
            calls.append(call)
    return calls


def selection_from_args(args: argparse.Namespace) -> Selection:
    def ints(text):
        return tuple(int(x) for x in re.split(r"[,\s]+", text.strip()) if x)

    def words(text):
        return tuple(x for x in re.split(r"[,\s]+", text.strip()) if x)

    heads = []
    for pair in words(args.heads):
        q, _, kv = pair.partition(":")
        heads.append((int(q), int(kv or q)))
    lse = {"no": (False,), "yes": (True,), "both": (False, True)}[args.lse]
    return Selection(ints(args.head_dims), words(args.dtypes), words(args.masks),
                     words(args.layouts), tuple(heads), lse)


# ---------------------------------------------------------------------------------------
# Compiling (needs torch and the fa4 extra)
# ---------------------------------------------------------------------------------------

def dsl_flavour() -> str:
    """The CUDA build of the CuTe DSL this process loaded, e.g. ``cu12.9`` (imports cutlass).

    nvidia-cutlass-dsl picks its cu12 or cu13 half at import (the newest one the driver
    supports, the newest installed without a driver), so this is read from cutlass after the
    import, never from the installed distributions.
    """
    import cutlass

    return fa4_cache.dsl_flavour(cutlass)  # the run time's rule, one place


def _make_call(interface, torch, call: KernelCall):
    """Fake CUDA tensors for ``call`` and the upstream function that takes them."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[call.dtype]
    dev = "cuda"
    q_heads, kv_heads, d = call.q_heads, call.kv_heads, call.head_dim
    kwargs = {"causal": call.mask == "causal", "return_lse": call.return_lse}
    if call.mask == "local":
        kwargs["window_size"] = LOCAL_WINDOW
    if call.layout == "fixed":
        q = torch.empty(BATCH, SEQLEN, q_heads, d, dtype=dtype, device=dev)
        k = torch.empty(BATCH, SEQLEN, kv_heads, d, dtype=dtype, device=dev)
        v = torch.empty(BATCH, SEQLEN, kv_heads, d, dtype=dtype, device=dev)
        return interface.flash_attn_func, (q, k, v), kwargs
    total = BATCH * SEQLEN
    q = torch.empty(total, q_heads, d, dtype=dtype, device=dev)
    cu_seqlens = torch.empty(BATCH + 1, dtype=torch.int32, device=dev)
    kwargs.update(cu_seqlens_q=cu_seqlens, max_seqlen_q=SEQLEN, max_seqlen_k=SEQLEN)
    if call.layout == "varlen":
        k = torch.empty(total, kv_heads, d, dtype=dtype, device=dev)
        v = torch.empty(total, kv_heads, d, dtype=dtype, device=dev)
        kwargs["cu_seqlens_k"] = cu_seqlens
    else:
        pages_per_seq = SEQLEN // PAGE_SIZE
        k = torch.empty(BATCH * pages_per_seq, PAGE_SIZE, kv_heads, d, dtype=dtype, device=dev)
        v = torch.empty(BATCH * pages_per_seq, PAGE_SIZE, kv_heads, d, dtype=dtype, device=dev)
        kwargs["page_table"] = torch.empty(BATCH, pages_per_seq, dtype=torch.int32, device=dev)
        kwargs["seqused_k"] = torch.empty(BATCH, dtype=torch.int32, device=dev)
    return interface.flash_attn_varlen_func, (q, k, v), kwargs


def _objects(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*.o")}


def compile_selection(stage_root: Path, out: Path, arch: str, calls: list[KernelCall],
                      package: str = VENDORED_PACKAGE, repeat: int = 1) -> dict:
    """Compile ``calls`` into ``out/<flavour>/...`` with the staged package; a report dict.

    ``repeat`` > 1 makes each call again (``verify``: over a filled cache, the first call
    shows the load from disk, the next ones the in-memory hit).
    """
    import resource

    number = re.fullmatch(r"sm_?(\d+)a?", arch)
    if not number:
        raise SystemExit(f"--arch {arch!r}: expected sm_90a, sm_100a, ...")
    # Upstream reads these when its modules are imported: set them first.
    # FLASH_ATTENTION_ARCH picks upstream's kernel family (sm90 / sm100 ...), CUTE_DSL_ARCH
    # the DSL's compile target (without it the DSL targets sm_100 on a GPU-less machine).
    os.environ["FLASH_ATTENTION_ARCH"] = f"sm_{number.group(1)}"
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "1"
    # The staged copy is a subpackage of ours, as in the wheel: our package (already imported
    # for fa4_deps) also looks for its submodules in the stage.
    import vendored_flash_attn

    vendored_flash_attn.__path__.append(str(stage_root.joinpath(*package.split(".")[:1])))
    t0 = time.perf_counter()
    flavour = dsl_flavour()
    cache_dir = out / flavour
    os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(cache_dir)
    import importlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    interface = importlib.import_module(f"{package}.interface")
    cache_utils = importlib.import_module(f"{package}.cache_utils")
    import_s = time.perf_counter() - t0
    results = []
    for call, attempt in itertools.product(calls, range(1, repeat + 1)):
        before = _objects(out)
        start = time.perf_counter()
        error = None
        try:
            with FakeTensorMode():
                fn, args, kwargs = _make_call(interface, torch, call)
                fn(*args, **kwargs)
        except Exception as exc:  # a kernel upstream refuses: recorded, the rest go on
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = time.perf_counter() - start
        new = {k: v for k, v in _objects(out).items() if k not in before}
        results.append({"call": call.name, **dataclasses.asdict(call), "attempt": attempt,
                        "seconds": round(seconds, 3), "objects": new, "error": error})
        status = error or f"{len(new)} new object(s), {sum(new.values())} B"
        print(f"  {call.name:40s} #{attempt} {seconds:7.3f} s  {status}", flush=True)
    import cutlass
    import tvm_ffi

    return {
        "arch": arch,
        "flavour": flavour,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cutlass": cutlass.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "fingerprint": cache_utils._compute_source_fingerprint(),
        "import_seconds": round(import_s, 2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "calls": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_stage = sub.add_parser("stage", help="copy flash_attn/cute as our subpackage, imports rewritten")
    p_stage.add_argument("--cute-src", type=Path, required=True, help="upstream's flash_attn/cute directory")
    p_stage.add_argument("--dest", type=Path, required=True, help="import root to stage into")
    p_stage.add_argument("--record", type=Path,
                         help="JSON of configure-time facts: write FA4's build record into the stage")
    sub.add_parser("probe", help="print what the build's Python can do (JSON)")
    for name in ("plan", "compile", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--head-dims", default="128")
        p.add_argument("--dtypes", default="bf16")
        p.add_argument("--masks", default="full,causal")
        p.add_argument("--layouts", default="varlen,paged")
        p.add_argument("--heads", default="16:4", help="query:kv head pairs, e.g. 16:4,8:8")
        p.add_argument("--lse", choices=("no", "yes", "both"), default="no")
        if name in ("compile", "verify"):
            p.add_argument("--stage", type=Path, required=True, help="import root made by `stage`")
            p.add_argument("--out", type=Path, required=True,
                           help="cache root to compile into (verify: to load from; nothing may compile)")
            p.add_argument("--arch", default="sm_90a")
            p.add_argument("--report", type=Path, help="write the report as JSON here")
        if name == "compile":
            p.add_argument("--record", type=Path, help="FA4's build record in the stage: add this run to it")
            p.add_argument("--best-effort", action="store_true",
                           help="a build that did not ask for kernels: on any failure warn, ship none, exit 0")
    args = parser.parse_args(argv)
    if args.command == "probe":
        print(json.dumps(probe()))
        return 0
    if args.command == "stage":
        summary = stage(args.cute_src, args.dest)
        if args.record:
            write_record(args.dest, json.loads(args.record.read_text()), summary)
        print(f"staged {summary['files']} files ({summary['bytes']} bytes, {len(summary['rewritten'])} "
              f"with imports rewritten) as {summary['package']}")
        return 0
    if args.command == "compile" and args.best_effort:
        return compile_best_effort(args)
    calls = plan(selection_from_args(args))
    if args.command == "plan":
        for call in calls:
            print(call.name)
        return 0
    verify = args.command == "verify"
    report = compile_selection(args.stage, args.out, args.arch, calls, repeat=2 if verify else 1)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    failed = [c["call"] for c in report["calls"] if c["error"] or (verify and c["objects"])]
    if verify:
        print(f"{len(calls) - len(set(failed))} of {len(calls)} kernels loaded from {args.out / report['flavour']}"
              f" without compiling")
        return 1 if failed else 0
    if args.record:
        add_precompile_run(args.record, _run_summary(args.arch, report, failed))
    print(f"{len(calls) - len(failed)} of {len(calls)} kernels compiled into {args.out / report['flavour']}"
          f" (import {report['import_seconds']} s, peak RSS {report['peak_rss_mb']} MB)")
    return 1 if failed else 0


def compile_best_effort(args: argparse.Namespace) -> int:
    """``compile`` for a build that did not ask for kernels (VFA_FA4_PRECOMPILE=auto): any
    failure is one warning, the kernels of this run are removed, the build goes on."""
    calls = plan(selection_from_args(args))
    try:
        report = compile_selection(args.stage, args.out, args.arch, calls)
        failed = [c["call"] for c in report["calls"] if c["error"]]
    except BaseException as exc:  # noqa: BLE001 - an import error deep in cutlass included
        report, failed = None, [f"{type(exc).__name__}: {exc}"]
    if failed:
        if args.out.exists():
            shutil.rmtree(args.out)
        print(f"WARNING: vendored-flash-attn: FA4 kernels for {args.arch} not precompiled "
              f"(VFA_FA4_PRECOMPILE=auto): {'; '.join(failed)[:2000]}. The wheel compiles them at first use; "
              "set VFA_FA4_PRECOMPILE=on to make this an error, off to skip it.", flush=True)
    if args.record:
        add_precompile_run(args.record, _run_summary(args.arch, report, failed))
    return 0


def _run_summary(arch: str, report: dict | None, failed: list[str]) -> dict:
    if report is None or failed:
        return {"arch": arch, "kernels": 0, "error": "; ".join(failed)[:2000]}
    return {"arch": arch, "kernels": sum(len(c["objects"]) for c in report["calls"]),
            **{k: report[k] for k in ("flavour", "python", "cutlass", "tvm_ffi", "fingerprint")}}


if __name__ == "__main__":
    sys.exit(main())
