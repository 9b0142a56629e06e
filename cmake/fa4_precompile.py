#!/usr/bin/env python3
"""FA4 (upstream's ``flash_attn/cute``, CuTe DSL) as a subpackage of ours, compiled ahead of time.

The build steps cmake/FA4Package.cmake runs, and the checks around them (docs/fa4.md says
why each choice was made and what was measured):

``stage``
    Copies the pinned ``flash_attn/cute`` sources into ``<dest>/<package path>`` and rewrites
    their absolute ``flash_attn.cute`` imports to our subpackage
    (``vendored_flash_attn._fa4.cute``), so the copy never shadows, and is never shadowed
    by, a real ``flash_attn`` install. Needs nothing but the standard library (+ packaging).

``plan``
    Prints the kernels of a selection (the wheel's head dims, dtypes and features, the GQA
    ratios, LSE) that vLLM's calls reach through the adapter on an arch, one per compile key.

``compile``
    Makes those calls through FA4's adapter (``vendored_flash_attn.fa4.run``) on fake CUDA
    tensors (torch ``FakeTensorMode``), so each call compiles one real kernel (SASS for
    ``--arch``) with the compile key a run-time call gets, and launches nothing: no GPU is
    needed. Needs torch and the ``fa4`` extra in the interpreter that runs it (one kernel set
    per Python: upstream's fingerprint holds the Python minor). The kernels land in
    ``<out>/<dsl flavour>/<upstream fingerprint>/<kernel kind>/<key hash>.o``: upstream's
    fingerprint covers the sources, Python minor, cutlass and tvm-ffi versions but not which
    CUDA build of the DSL compiled (cu12 and cu13 builds of ``nvidia-cutlass-dsl`` have one
    version string), so the flavour directory above it keeps kernels of one flavour from
    ever loading in the other.

    ``--share FILE`` (the build passes one per arch to every Python): one kernel set shipped
    for every Python whose kernels are the same bytes. When FILE is absent, this Python
    compiles and writes there the key hash of every kernel each call looked up. When another
    Python wrote it, this one compiles every call too, into a scratch folder, and compares
    every kernel byte for byte with the other Python's file for the same call (the cost is
    the same as compiling its own set: docs/fa4.md measured both); all equal: only
    ``<flavour>/<its fingerprint>/aliases.json`` ships for it (its key hashes -> the other
    Python's files, read by fa4_cache); else its own set ships and the log says why.

``verify``
    Loads them back as the installed wheel does; a kernel that compiles instead fails it.

``check-installed``
    On a GPU, with the wheel installed: every kernel it precompiled for this Python and GPU
    runs through the public call on real data with nothing compiled.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The build uses this checkout's package (fa4_deps, fa4_cache, the adapter); `check-installed`
# tests the installed wheel, so it must not put the checkout first.
if sys.argv[1:2] != ["check-installed"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from vendored_flash_attn import fa4_cache, fa4_deps  # noqa: E402  (standard library only)
from vendored_flash_attn.families import registry  # noqa: E402

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


def portable(text: str) -> str:
    """``text`` (an error message) with every absolute path cut to its last part: FA4's
    build record ships in the wheel, whose bytes must not depend on where this machine keeps
    its Python, its temporary build environment (pip's isolation) or the build dir."""
    return re.sub(r"(?<![\w.~])/(?:[^\s/'\":]+/)+(?=[^\s/'\":])", ".../", text)


def probe() -> dict:
    """What the build's Python can do: "" when it can, else why not (CMake reads this).

    stage: fa4_deps.pin_drift needs packaging and tomllib/tomli. precompile: torch and the
    fa4 extra in its pinned versions (read from metadata: cutlass is not imported here).
    """
    import importlib.util

    stage_missing = [m for m in ("packaging",) if importlib.util.find_spec(m) is None]
    if importlib.util.find_spec("tomllib") is None and importlib.util.find_spec("tomli") is None:
        stage_missing.append("tomli")
    # Named by version, not path: the reasons go into FA4's build record, which ships
    # (CMake's own messages name the interpreter's path).
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    stage_reason = f"the build's {python} lacks {', '.join(stage_missing)}" if stage_missing else ""
    if stage_reason:
        return {"stage": stage_reason, "precompile": "FA4 is not staged: " + stage_reason, "python": python[7:]}
    problems = fa4_deps.problems()
    if importlib.util.find_spec("torch") is None:
        problems.append("torch is not installed")
    precompile_reason = ""
    absent = fa4_deps.not_installed()
    if problems and len(absent) == len(problems):
        # One short line (issue 29: this was 560 characters): the names, and the command.
        names = ", ".join(fa4_deps.requirement_name(r) for r in absent)
        precompile_reason = f"{python} lacks FA4's packages ({names}): {fa4_deps.INSTALL_COMMAND}"
    elif problems:
        precompile_reason = (f"the build's {python} lacks FA4's dependencies: "
                             + "; ".join(problems) + f" (install them with: {fa4_deps.INSTALL_COMMAND})")
    return {"stage": "", "precompile": precompile_reason, "python": python[7:]}


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

# The wheel's selection, in the words of its FA3 knobs (VFA_FA3_HEAD_DIMS / _DTYPES /
# _FEATURES): FA4 precompiles the kernels of the shapes the wheel was built for, and
# VFA_FA4_PRECOMPILE_GQA_RATIOS adds what FA3's knobs have no word for. e4m3 means FP8 KV
# the way FA4 takes it on the target (sm90: a bf16 q with FP8 k/v in a paged cache, dequantized
# in the kernel; sm100: FP8 q, k and v).
DTYPES = ("bf16", "fp16", "e4m3")
FEATURES = ("paged", "split", "softcap", "local", "hdimdiff")
# Features whose kernels are not precompiled (each call compiles at first use): softcap's
# value is inside its score_mod and so inside the key (one kernel per value), and hdimdiff
# (192/128) has no FA4 dispatch through vLLM's call on sm90 beyond what head dims give.
NOT_PRECOMPILED = {"softcap": "the softcap value is part of the compile key (one kernel per value)",
                   "hdimdiff": "different q/v head sizes are not part of the precompiled selection"}

# How vLLM's calls reach FA4 through our adapter (fa4.run), one kernel per combination of
# what upstream's compile key holds (flash_attn/cute/interface.py at the pin):
#   layout  varlen: cu_seqlens_k; paged: block_table + seqused_k with a page of the kernel's
#           tile_n (TMA loads); paged_cpasync: any other page size (vLLM's default 16)
#   mask    full; causal; local: a sliding window (left, 0) on a causal call, as vLLM passes it
#   split   num_splits = 0 lets upstream's heuristic choose split-KV per call, so both kernels
#           are reachable; the key holds only whether it splits
#   lse     return_softmax_lse (cascade attention, context parallelism ask for it)
#   gqa     the query heads per KV head: exact in the key (upstream packs GQA when > 1)
LAYOUTS = ("varlen", "paged", "paged_cpasync")
MASKS = ("full", "causal", "local")
CPASYNC_PAGE_SIZE = 16
LOCAL_WINDOW = (256, 0)
KV_HEADS = 2
BATCH = 2
SEQLEN_Q = 128
PAGES_PER_SEQ = 8


@dataclasses.dataclass(frozen=True)
class KernelCall:
    layout: str
    head_dim: int
    dtype: str
    mask: str
    gqa: int
    split: bool
    return_lse: bool

    @property
    def name(self) -> str:
        return (f"{self.layout}-hd{self.head_dim}-{self.dtype}-{self.mask}-gqa{self.gqa}"
                f"{'-split' if self.split else ''}{'-lse' if self.return_lse else ''}")


@dataclasses.dataclass(frozen=True)
class Selection:
    head_dims: tuple[int, ...] = (128,)
    dtypes: tuple[str, ...] = ("bf16",)
    features: tuple[str, ...] = ("paged", "split", "local")
    gqa_ratios: tuple[int, ...] = (1, 4, 8)
    return_lse: tuple[bool, ...] = (False, True)

    def __post_init__(self):
        for name, values, allowed in (("dtypes", self.dtypes, DTYPES), ("features", self.features, FEATURES)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"FA4 selection: {name} {bad} unknown; allowed: {', '.join(allowed)}")
        bad_ratios = [r for r in self.gqa_ratios if r < 1]
        if bad_ratios:
            raise ValueError(f"FA4 selection: GQA ratios {bad_ratios} are not query heads per KV head (>= 1)")
        bad_dims = [d for d in self.head_dims if d % 8 or not 8 <= d <= 512]
        if bad_dims:
            raise ValueError(f"FA4 selection: head dims {bad_dims} are not multiples of 8 in 8..512")

    @property
    def layouts(self) -> tuple[str, ...]:
        return LAYOUTS if "paged" in self.features else ("varlen",)

    @property
    def masks(self) -> tuple[str, ...]:
        return MASKS if "local" in self.features else MASKS[:2]

    @property
    def splits(self) -> tuple[bool, ...]:
        return (False, True) if "split" in self.features else (False,)


def generation(arch: str) -> int:
    """sm_90a -> 9, sm_100a -> 10, sm_120a -> 12 (the families' generation numbers)."""
    number = re.fullmatch(r"sm_?(\d+)a?", arch)
    if not number:
        raise SystemExit(f"--arch {arch!r}: expected sm_90a, sm_100a, ...")
    return int(number.group(1)) // 10


def reachable(call: KernelCall, gen: int) -> bool:
    """Whether fa4.run takes ``call`` on a GPU of generation ``gen`` (what it refuses before
    any kernel is not compiled: a generation the declaration excludes, fa4.check_call's rules
    for FP8, sm120's paged / split)."""
    if gen in registry().by_name("fa4").excluded:
        return False
    if call.dtype == "e4m3":
        if gen == 12:
            return False
        if gen == 9:  # FP8 KV: paged with page size == tile_n, at the head dims FA4 is declared for
            allowed = registry().by_name("fa4").call.fp8_kv_head_dims
            if call.layout != "paged" or (allowed is not None and call.head_dim not in allowed):
                return False
    if gen == 12 and (call.layout != "varlen" or call.split):
        return False
    return True


def plan(selection: Selection, arch: str = "sm_90a") -> list[KernelCall]:
    """One call per kernel the selection can reach on ``arch``, in a stable order, no duplicates."""
    gen = generation(arch)
    calls = []
    for layout, dim, dtype, mask, gqa, split, lse in itertools.product(
            selection.layouts, selection.head_dims, selection.dtypes, selection.masks,
            selection.gqa_ratios, selection.splits, selection.return_lse):
        call = KernelCall(layout, dim, dtype, mask, gqa, split, lse)
        if reachable(call, gen) and call not in calls:
            calls.append(call)
    return calls


def selection_from_args(args: argparse.Namespace) -> Selection:
    def words(text):
        return tuple(x for x in re.split(r"[,;\s]+", text.strip()) if x)

    lse = {"no": (False,), "yes": (True,), "both": (False, True)}[args.lse]
    return Selection(tuple(int(x) for x in words(args.head_dims)), words(args.dtypes),
                     words(args.features), tuple(int(x) for x in words(args.gqa_ratios)), lse)


# ---------------------------------------------------------------------------------------
# Compiling (needs torch and the fa4 extra)
# ---------------------------------------------------------------------------------------

def _page_size(interface, call: KernelCall, gen: int) -> int:
    """The page size that gives ``call`` its layout: the kernel's tile_n for TMA loads (upstream's
    own tile rule on sm90; 128 on sm100), another size for cp.async loads."""
    if call.layout == "paged_cpasync":
        return CPASYNC_PAGE_SIZE
    if gen != 9:
        return 128
    causal = call.mask != "full"
    is_causal, is_local, _, _ = interface._resolve_causal_local_window(
        causal, *((LOCAL_WINDOW[0], LOCAL_WINDOW[1]) if call.mask == "local" else (None, None)))
    return interface._tile_size_fwd_sm90(call.head_dim, call.head_dim, is_causal, is_local).n_block_size


def _make_call(interface, torch, call: KernelCall, gen: int, real: bool = False) -> tuple[tuple, dict]:
    """CUDA tensors for ``call``, as vLLM passes them to flash_attn_varlen_func: the positional
    and keyword arguments of ``fa4.run`` after ``arch``. Fake tensors (under FakeTensorMode)
    unless ``real``: then valid metadata and random data, for a launch on a GPU."""
    half = torch.float16 if call.dtype == "fp16" else torch.bfloat16
    fp8 = torch.float8_e4m3fn
    q_dtype = fp8 if (call.dtype == "e4m3" and gen != 9) else half
    kv_dtype = fp8 if call.dtype == "e4m3" else half
    dev, d, hk = "cuda", call.head_dim, KV_HEADS
    hq = hk * call.gqa
    q = torch.empty(BATCH * SEQLEN_Q, hq, d, dtype=q_dtype, device=dev)
    cu_seqlens_q = torch.empty(BATCH + 1, dtype=torch.int32, device=dev)
    kwargs = dict(cu_seqlens_k=None, seqused_k=None, q_v=None, dropout_p=0.0, softmax_scale=None,
                  causal=call.mask != "full", window_size=LOCAL_WINDOW if call.mask == "local" else None,
                  softcap=0.0, alibi_slopes=None, block_table=None, return_softmax_lse=call.return_lse,
                  out=None, scheduler_metadata=None, q_descale=None, k_descale=None, v_descale=None,
                  num_splits=2 if call.split else 1, s_aux=None, cp_world_size=1, cp_rank=0,
                  cp_tot_seqused_k=None)
    if call.layout == "varlen":
        seqlen_k = PAGES_PER_SEQ * 128
        k = torch.empty(BATCH * seqlen_k, hk, d, dtype=kv_dtype, device=dev)
        v = torch.empty(BATCH * seqlen_k, hk, d, dtype=kv_dtype, device=dev)
        kwargs["cu_seqlens_k"] = torch.empty(BATCH + 1, dtype=torch.int32, device=dev)
    else:
        page = _page_size(interface, call, gen)
        seqlen_k = PAGES_PER_SEQ * page
        k = torch.empty(BATCH * PAGES_PER_SEQ, page, hk, d, dtype=kv_dtype, device=dev)
        v = torch.empty(BATCH * PAGES_PER_SEQ, page, hk, d, dtype=kv_dtype, device=dev)
        kwargs["block_table"] = torch.empty(BATCH, PAGES_PER_SEQ, dtype=torch.int32, device=dev)
        kwargs["seqused_k"] = torch.empty(BATCH, dtype=torch.int32, device=dev)
    if call.dtype == "e4m3":  # vLLM passes all three descales with an FP8 cache
        for name in ("q_descale", "k_descale", "v_descale"):
            kwargs[name] = torch.empty(BATCH, hk, dtype=torch.float32, device=dev)
    if real:
        for t in (q, k, v):
            t.view(torch.uint8).copy_(torch.randn(t.shape, device=dev).to(t.dtype).view(torch.uint8))
        cu_seqlens_q.copy_(torch.arange(BATCH + 1, device=dev) * SEQLEN_Q)
        if kwargs["cu_seqlens_k"] is not None:
            kwargs["cu_seqlens_k"].copy_(torch.arange(BATCH + 1, device=dev) * seqlen_k)
        else:
            kwargs["block_table"].copy_(torch.arange(BATCH * PAGES_PER_SEQ, device=dev).view(BATCH, PAGES_PER_SEQ))
            kwargs["seqused_k"].fill_(seqlen_k)
        for name in ("q_descale", "k_descale", "v_descale"):
            if kwargs[name] is not None:
                kwargs[name].fill_(1.0)
    return (q, k, v, SEQLEN_Q, cu_seqlens_q, seqlen_k), kwargs


def _objects(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*.o")} if root.is_dir() else {}


class _KeyLog:
    """Upstream's compile cache of one kernel kind (``kind``), noting the key hash of every
    lookup in ``sink`` (what --share compares and indexes)."""

    def __init__(self, inner, kind: str, hasher, sink: list):
        self.inner, self.kind, self.hasher, self.sink = inner, kind, hasher, sink

    def __contains__(self, key) -> bool:
        self.sink.append([self.kind, self.hasher(key)])
        return key in self.inner

    def __getitem__(self, key):
        return self.inner[key]

    def __setitem__(self, key, fn) -> None:
        self.inner[key] = fn


def compile_selection(stage_root: Path, out: Path, arch: str, calls: list[KernelCall],
                      package: str = VENDORED_PACKAGE, verify: bool = False) -> dict:
    """Compile ``calls`` for ``arch`` into ``out/<flavour>/<fingerprint>/<kind>/`` through
    FA4's adapter (``vendored_flash_attn.fa4.run``) on fake tensors; a report dict, each
    call with the ``[kind, key hash]`` of every kernel it looked up (``lookups``).

    Going through the adapter, not upstream's public functions, makes the compile keys those
    of run-time calls: the adapter picks split-KV, descales, windows and the like the way it
    does for vLLM's calls. ``verify``: load from ``out`` as the installed wheel does and make
    each call twice; a kernel written to the (temporary) user cache means it compiled.
    """
    import resource
    import tempfile

    gen = generation(arch)
    # Upstream reads these when its modules are imported: set them first.
    # FLASH_ATTENTION_ARCH picks upstream's kernel family (sm90 / sm100 ...), CUTE_DSL_ARCH
    # the DSL's compile target (without it the DSL targets sm_100 on a GPU-less machine).
    os.environ["FLASH_ATTENTION_ARCH"] = f"sm_{arch[3:].rstrip('a')}"
    os.environ["CUTE_DSL_ARCH"] = arch
    # The staged copy is a subpackage of ours, as in the wheel: our package (already imported
    # for fa4_deps) also looks for its submodules in the stage.
    import vendored_flash_attn

    vendored_flash_attn.__path__.append(str(stage_root.joinpath(*package.split(".")[:1])))
    t0 = time.perf_counter()
    import importlib

    import cutlass
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vendored_flash_attn import fa4

    loaded = fa4.load()
    cache_utils = importlib.import_module(f"{package}.cache_utils")
    user = Path(tempfile.mkdtemp(prefix="vfa-fa4-verify-")) if verify else out
    fa4_cache.install(loaded.interface, cache_utils, cutlass, shipped=out, user=user)
    lookups: list = []
    hasher = functools.partial(cache_utils.JITPersistentCache._key_to_hash, None)  # upstream's, uses no state
    for attribute, kind in fa4_cache.FORWARD_CACHES.items():
        function = getattr(loaded.interface, attribute, None)
        if function is not None:
            function.compile_cache = _KeyLog(function.compile_cache, kind, hasher, lookups)
    # The DSL picks its cu12 or cu13 half at import: the flavour is read from cutlass
    # after the import (the run time's rule, fa4_cache).
    flavour = fa4_cache.dsl_flavour(cutlass)
    import_s = time.perf_counter() - t0
    results = []
    for call, attempt in itertools.product(calls, range(1, 3 if verify else 2)):
        before = _objects(user)
        start = time.perf_counter()
        error = refused = None
        del lookups[:]
        try:
            with FakeTensorMode():
                args, kwargs = _make_call(loaded.interface, torch, call, gen)
                fa4.run(gen * 10, *args, **kwargs)
        except fa4.FA4Unsupported as exc:  # the adapter refuses it at run time too: nothing to ship
            refused = str(exc).splitlines()[0]
        except Exception as exc:  # a kernel that fails: recorded, the rest go on
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = time.perf_counter() - start
        new = {k: v for k, v in _objects(user).items() if k not in before}
        results.append({"call": call.name, **dataclasses.asdict(call), "attempt": attempt,
                        "seconds": round(seconds, 3), "objects": new, "error": error, "refused": refused,
                        "lookups": [list(x) for x in lookups]})
        status = error or (f"refused: {refused}" if refused else f"{len(new)} new object(s), {sum(new.values())} B")
        print(f"  {call.name:48s} #{attempt} {seconds:7.3f} s  {status}", flush=True)
    if verify:
        shutil.rmtree(user, ignore_errors=True)
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


# ---------------------------------------------------------------------------------------
# One kernel set for every Python (--share)
# ---------------------------------------------------------------------------------------

SHARE_SCHEMA = 1


def share_record(report: dict) -> dict:
    """What ``--share`` keeps of a run that compiled: its Python, DSL flavour, upstream
    fingerprint, arch and, for each call that gave kernels, the ``[kind, key hash]`` of each
    kernel it looked up, in order."""
    return {"schema": SHARE_SCHEMA, **{k: report[k] for k in ("arch", "python", "flavour", "fingerprint")},
            "calls": {c["call"]: c["lookups"] for c in report["calls"]
                      if c["attempt"] == 1 and not c["error"] and not c["refused"] and c["lookups"]}}


def _kernel_file(out: Path, record: dict, kind: str, digest: str) -> Path:
    return fa4_cache.kernel_dir(out, record["flavour"], record["fingerprint"], kind) / f"{digest}.o"


def alias_table(first: dict, own: dict, out: Path) -> tuple[dict, list[str]]:
    """This Python's key hashes (``own``: the share_record of a keys-only run) mapped to the
    kernel files another Python compiled (``first``: its share_record), per kind:
    ``({kind: {own hash: first hash}}, problems)``. Calls match by name, lookups by position;
    a call whose lookups differ in number or kind, or whose file is missing, is a problem."""
    table: dict = {}
    problems = []
    for name, theirs in first["calls"].items():
        mine = own["calls"].get(name)
        if mine is None or [k for k, _ in mine] != [k for k, _ in theirs]:
            problems.append(f"{name} looks up {mine} here, {theirs} with Python {first['python']}")
            continue
        for (kind, own_hash), (_, first_hash) in zip(mine, theirs):
            if not _kernel_file(out, first, kind, first_hash).is_file():
                problems.append(f"{name}: {kind}/{first_hash}.o is not among Python {first['python']}'s kernels")
            else:
                table.setdefault(kind, {})[own_hash] = first_hash
    return table, problems


def byte_differences(first: dict, compiled: dict, out: Path, compiled_out: Path) -> list[str]:
    """Kernels this Python compiled (``compiled``: the report of a compile into ``compiled_out``)
    that are not byte for byte the other Python's files for the same calls; [] when all are."""
    differences, seen = [], set()
    own = share_record(compiled)
    for name, mine in own["calls"].items():
        theirs = first["calls"].get(name, [])
        if len(mine) != len(theirs):
            differences.append(f"{name}: {len(mine)} kernels here, {len(theirs)} with Python {first['python']}")
            continue
        for (kind, own_hash), (_, first_hash) in zip(mine, theirs):
            if (kind, own_hash) in seen:  # a kernel several calls reach (the split-KV combine)
                continue
            seen.add((kind, own_hash))
            here, there = _kernel_file(compiled_out, own, kind, own_hash), _kernel_file(out, first, kind, first_hash)
            if not here.is_file() or not there.is_file() or here.read_bytes() != there.read_bytes():
                differences.append(f"{name}: {kind} kernel {own_hash[:12]} differs from Python {first['python']}'s "
                                   f"{first_hash[:12]}")
    if not own["calls"]:
        differences.append("no call compiled a kernel here: " + "; ".join(
            str(c["error"] or c["refused"]) for c in compiled["calls"]))
    return differences


def share_run(stage_root: Path, out: Path, arch: str, calls: list[KernelCall], share: Path,
              jobs: int = 1) -> tuple[dict | None, str]:
    """``--share`` with another Python's record. This Python compiles every call too, into a
    scratch folder, and compares each kernel it made byte for byte with the other Python's
    file for the same call and position (all of them: one sample would trust the rest).
    Returns ``(report, "")`` when every kernel is the same: nothing of this Python's ships
    but its aliases.json (its key hashes -> the other Python's files); ``(report, why)``
    when any differs: its own set, moved into ``out``; ``(None, why)`` when there is no
    record to compare with (compile as usual)."""
    import tempfile

    if not share.is_file():
        return None, "no other Python has compiled these kernels"
    first = json.loads(share.read_text())
    if first.get("schema") != SHARE_SCHEMA or first.get("arch") != arch:
        return None, f"{share} is not a record of this step for {arch}"
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-share-") as tmp:
        scratch = Path(tmp)
        compiled = compile_in_workers(stage_root, scratch, arch, calls, jobs)
        own = share_record(compiled)
        why = ""
        if compiled["flavour"] != first["flavour"]:
            why = f"its DSL is the {compiled['flavour']} build, Python {first['python']}'s the {first['flavour']}"
        table, problems = ({}, []) if why else alias_table(first, own, out)
        if problems:
            why = f"{len(problems)} calls do not match: {problems[0]}"
        differences = [] if why else byte_differences(first, compiled, out, scratch)
        if differences:
            why = f"{len(differences)} of its kernels differ: {differences[0]}"
        if why or any(c["error"] for c in compiled["calls"]):
            if compiled["fingerprint"] == first["fingerprint"] and why:
                raise RuntimeError(f"Python {compiled['python']} and {first['python']} share upstream's fingerprint "
                                   f"{first['fingerprint'][:12]} but not their kernels: {why}")
            # Its own set, compiled already: into the output, as a run without --share would leave it.
            shutil.copytree(scratch, out, dirs_exist_ok=True)
            return compiled, why or "some of its kernels failed to compile"
    compared = sum(len(lookups) for lookups in own["calls"].values())
    for call in compiled["calls"]:
        call["objects"] = {}  # compiled to compare, not shipped
    same_as = {"python": first["python"], "fingerprint": first["fingerprint"], "compared": compared}
    if compiled["fingerprint"] == first["fingerprint"]:  # another interpreter of the same minor and versions
        compiled.update(aliases=0, aliased={}, same_as=same_as)
        return compiled, ""
    # One index per fingerprint, for every arch: an earlier arch's entries stay.
    index = out / compiled["flavour"] / compiled["fingerprint"] / fa4_cache.ALIASES_FILE
    entries = sum(len(t) for t in table.values())
    if index.is_file():
        earlier_same_as, earlier = fa4_cache.parse_aliases(index.read_bytes())
        if earlier_same_as != first["fingerprint"]:
            raise RuntimeError(f"{index} already names the kernels of another build Python ({earlier_same_as[:12]})")
        for kind, more in earlier.items():
            table[kind] = {**more, **table.get(kind, {})}
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(fa4_cache.aliases_text(first["fingerprint"], compiled["python"], table))
    compiled.update(aliases=entries, aliased={str(index.relative_to(out)): index.stat().st_size}, same_as=same_as)
    return compiled, ""


def produce(args: argparse.Namespace, calls: list[KernelCall]) -> dict:
    """The kernels of ``compile``: another Python's files where ``--share`` finds every one of
    them the same, else this Python's own (then recorded in ``--share`` for the next Python)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if args.share:
        report, why = share_run(args.stage, args.out, args.arch, calls, args.share, args.jobs)
        if report is not None:
            if why:
                print(f"Python {python} ships its own FA4 kernels for {args.arch}: {why}", flush=True)
            return report
        print(f"Python {python} compiles its own FA4 kernels for {args.arch}: {why}", flush=True)
    return compile_in_workers(args.stage, args.out, args.arch, calls, args.jobs)


def keep_share_record(args: argparse.Namespace, report: dict) -> None:
    """After a run that compiled every kernel it was asked for: the record the next Python shares."""
    if args.share and "same_as" not in report:
        args.share.parent.mkdir(parents=True, exist_ok=True)
        args.share.write_text(json.dumps(share_record(report), indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_stage = sub.add_parser("stage", help="copy flash_attn/cute as our subpackage, imports rewritten")
    p_stage.add_argument("--cute-src", type=Path, required=True, help="upstream's flash_attn/cute directory")
    p_stage.add_argument("--dest", type=Path, required=True, help="import root to stage into")
    p_stage.add_argument("--record", type=Path,
                         help="JSON of configure-time facts: write FA4's build record into the stage")
    sub.add_parser("probe", help="print what the build's Python can do (JSON)")
    p_check = sub.add_parser("check-installed", help="on a GPU: the installed wheel's precompiled kernels run "
                             "with no compile (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR: an empty folder)")
    p_check.add_argument("--report", type=Path, help="write the result as JSON here")
    defaults = Selection()
    for name in ("plan", "compile", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--head-dims", default=",".join(map(str, defaults.head_dims)),
                       help="the wheel's head dims (VFA_FA3_HEAD_DIMS)")
        p.add_argument("--dtypes", default=",".join(defaults.dtypes), help="the wheel's dtypes (VFA_FA3_DTYPES)")
        p.add_argument("--features", default=",".join(defaults.features),
                       help="the wheel's features (VFA_FA3_FEATURES): paged, split, local widen the selection")
        p.add_argument("--gqa-ratios", default=",".join(map(str, defaults.gqa_ratios)),
                       help="query heads per KV head (VFA_FA4_PRECOMPILE_GQA_RATIOS)")
        p.add_argument("--lse", choices=("no", "yes", "both"), default="both")
        p.add_argument("--arch", default="sm_90a")
        if name in ("compile", "verify"):
            p.add_argument("--stage", type=Path, required=True, help="import root made by `stage`")
            p.add_argument("--out", type=Path, required=True,
                           help="cache root to compile into (verify: to load from; nothing may compile)")
            p.add_argument("--report", type=Path, help="write the report as JSON here")
        if name == "compile":
            p.add_argument("--jobs", type=int, default=1,
                           help="worker processes (each imports the DSL: about 1.4 GB); the build passes its job count")
            p.add_argument("--record", type=Path, help="FA4's build record in the stage: add this run to it")
            p.add_argument("--share", type=Path,
                           help="one kernel set for every Python: absent, compile and record the keys here; "
                                "written by another Python, ship its kernels for this one where they are the same bytes")
            p.add_argument("--best-effort", action="store_true",
                           help="a build that did not ask for kernels: on any failure warn, ship none of "
                                "this run's kernels, exit 0")
    p_worker = sub.add_parser("compile-worker", help=argparse.SUPPRESS)
    for flag in ("--stage", "--out", "--calls", "--report"):
        p_worker.add_argument(flag, type=Path, required=True)
    p_worker.add_argument("--arch", required=True)
    args = parser.parse_args(argv)
    if args.command == "compile-worker":  # one share of `compile --jobs N` (compile_in_workers)
        todo = [KernelCall(**c) for c in json.loads(args.calls.read_text())]
        args.report.write_text(json.dumps(compile_selection(args.stage, args.out, args.arch, todo)))
        return 0
    if args.command == "probe":
        print(json.dumps(probe()))
        return 0
    if args.command == "check-installed":
        return check_installed(args.report)
    if args.command == "stage":
        summary = stage(args.cute_src, args.dest)
        if args.record:
            write_record(args.dest, json.loads(args.record.read_text()), summary)
        print(f"staged {summary['files']} files ({summary['bytes']} bytes, {len(summary['rewritten'])} "
              f"with imports rewritten) as {summary['package']}")
        return 0
    selection = selection_from_args(args)
    calls = plan(selection, args.arch)
    if args.command == "plan":
        for call in calls:
            print(call.name)
        skipped = sorted(set(selection.features) & set(NOT_PRECOMPILED))
        for feature in skipped:
            print(f"# not precompiled: {feature}: {NOT_PRECOMPILED[feature]}")
        return 0
    if args.command == "compile" and args.best_effort:
        return compile_best_effort(args, calls)
    verify = args.command == "verify"
    report = compile_selection(args.stage, args.out, args.arch, calls, verify=True) if verify else produce(args, calls)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    failed = [c["call"] for c in report["calls"] if c["error"] or (verify and c["objects"])]
    refused = sorted({c["call"] for c in report["calls"] if c["refused"]})
    if verify:
        print(f"{len(calls) - len(set(failed)) - len(refused)} of {len(calls)} kernels loaded from "
              f"{args.out / report['flavour']} without compiling ({len(refused)} refused by FA4)")
        return 1 if failed else 0
    if not failed:
        keep_share_record(args, report)
    if args.record:
        add_precompile_run(args.record, _run_summary(args.arch, report, failed, selection_from_args(args)))
    how = (f"shipped once: Python {report['same_as']['python']}'s files, {report['aliases']} listed in this "
           f"Python's {fa4_cache.ALIASES_FILE}" if "same_as" in report else "compiled")
    print(f"{len(calls) - len(failed) - len(refused)} of {len(calls)} kernels {how} into "
          f"{args.out / report['flavour']} for Python {report['python']} ({len(refused)} refused by FA4; import "
          f"{report['import_seconds']} s, peak RSS {report['peak_rss_mb']} MB)")
    return 1 if failed else 0


# How long a worker asked to stop (SIGTERM) may take before it is killed: the DSL's compile
# of one kernel does not look at signals, so a stop can wait for the kernel in hand.
WORKER_STOP_SECONDS = 10.0


def _interpreter_flags() -> list[str]:
    """This interpreter's own flags for a worker, so it sees what this process sees (the
    build runs FA4's steps in the environment its probe checked: cmake/FA4Package.cmake)."""
    flags = sys.flags
    return [flag for flag, on in (("-I", flags.isolated), ("-E", flags.ignore_environment and not flags.isolated),
                                  ("-s", flags.no_user_site and not flags.isolated), ("-S", flags.no_site)) if on]


def _die_with_parent() -> None:
    """In a worker, before it runs: killed when the process that started it dies (Linux),
    so no worker outlives the build step, whatever ended the step."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the supervisor's own stop still applies
        pass


def _first_error(text: str) -> str:
    """The line that says what went wrong in a worker's stderr: a traceback's last line (the
    exception), else its last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line
    return lines[-1] if lines else "(nothing on stderr)"


class WorkerFailed(RuntimeError):
    """A compile worker failed; the others were stopped before this was raised."""


def _stop(processes) -> None:
    """Stop every process still running (SIGTERM, then SIGKILL after WORKER_STOP_SECONDS) and
    reap them all: when this returns, none of them runs or writes anything any more."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + WORKER_STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # it ignored SIGTERM
            process.kill()
            process.wait()


def compile_in_workers(stage_root: Path, out: Path, arch: str, calls: list[KernelCall], jobs: int) -> dict:
    """``compile_selection`` over ``jobs`` worker processes of this interpreter (each imports
    the DSL: about 1.4 GB), the calls dealt round-robin; one report, calls in plan order.
    Kernels are keyed files, so workers share the output folder; a kernel two workers reach
    (the split-KV combine) is written under upstream's lock, with the same bytes.

    Supervised: the first worker to fail stops the others (SIGTERM, then SIGKILL) before this
    raises, and so does anything that ends this process's wait (Ctrl-C, SIGTERM from the
    build tool): when this returns or raises, no worker is left to write into ``out``, so a
    clean-up after it sees every file there is going to be. Each worker's stderr is kept in
    a file and copied to this process's stderr, under a header, when it has ended; the error
    raised names the first failing worker's error line (WorkerFailed)."""
    import signal
    import tempfile

    shards = [shard for shard in (calls[i::jobs] for i in range(max(1, jobs))) if shard]
    if len(shards) <= 1:
        return compile_selection(stage_root, out, arch, calls)
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-workers-") as tmp:
        workers = []  # (index, process, report file, stderr file)
        # SIGTERM (what ninja and CI runners send) ends the wait like Ctrl-C does, so the
        # workers are stopped below, never left running.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            for index, shard in enumerate(shards):
                todo, report = Path(tmp, f"{index}.calls.json"), Path(tmp, f"{index}.report.json")
                todo.write_text(json.dumps([dataclasses.asdict(c) for c in shard]))
                command = [sys.executable, *_interpreter_flags(), str(Path(__file__).resolve()), "compile-worker",
                           "--stage", str(stage_root), "--out", str(out), "--arch", arch,
                           "--calls", str(todo), "--report", str(report)]
                stderr = open(Path(tmp, f"{index}.stderr"), "w+b")  # noqa: SIM115 - closed below
                workers.append((index, subprocess.Popen(command, stderr=stderr, preexec_fn=_die_with_parent),
                                report, stderr))
            failed = None
            running = {index for index, *_ in workers}
            while running and failed is None:
                for index, process, report, _ in workers:
                    if index in running and process.poll() is not None:
                        running.discard(index)
                        if process.returncode != 0 or not report.is_file():
                            failed = (index, process.returncode)
                            break
                else:
                    time.sleep(0.1)
        finally:
            _stop([process for _, process, _, _ in workers])
            signal.signal(signal.SIGTERM, previous)
            errors = {}
            for index, process, _, stderr in workers:
                stderr.seek(0)
                text = stderr.read().decode(errors="replace")
                stderr.close()
                if text.strip():
                    errors[index] = text
                    sys.stderr.write(f"--- FA4 compile worker {index + 1} of {len(workers)} "
                                     f"(exit {process.returncode}), its stderr:\n{text.rstrip()}\n")
            sys.stderr.flush()
        if failed is not None:
            index, code = failed
            stopped = len(workers) - 1
            raise WorkerFailed(f"FA4 compile worker {index + 1} of {len(workers)} exited with {code}: "
                               f"{_first_error(errors.get(index, ''))} (the other {stopped} stopped; "
                               "each worker's stderr is above)")
        reports = [json.loads(report.read_text()) for _, _, report, _ in workers]
    order = {call.name: i for i, call in enumerate(calls)}
    merged = {**reports[0], "jobs": len(shards),
              "import_seconds": max(r["import_seconds"] for r in reports),
              "peak_rss_mb": max(r["peak_rss_mb"] for r in reports),
              "calls": sorted((c for r in reports for c in r["calls"]), key=lambda c: order[c["call"]])}
    return merged


def _shipped_objects(report: dict) -> dict[str, int]:
    """The kernel files a run wrote (each once: with workers, a call's before/after listing
    of the folder can also hold another worker's kernel)."""
    return {path: size for call in report["calls"] for path, size in call["objects"].items()}


def compile_best_effort(args: argparse.Namespace, calls: list[KernelCall]) -> int:
    """``compile`` for a build that did not ask for kernels (VFA_FA4_PRECOMPILE=auto): any
    failure is one warning, the kernels of this run are removed (those of other Pythons or
    archs in the same folder stay), the build goes on."""
    before = set(_objects(args.out))
    try:
        report = produce(args, calls)
        failed = [c["call"] for c in report["calls"] if c["error"]]
    except Exception as exc:  # noqa: BLE001 - an import error deep in cutlass included
        # Not BaseException: Ctrl-C and SIGTERM stop the build (non-zero), never a warning.
        # The workers have all stopped by now (compile_in_workers), so the clean-up below
        # sees every file this run wrote.
        report, failed = None, [f"{type(exc).__name__}: {exc}"]
    if not failed:
        keep_share_record(args, report)
    if failed:
        for rel in set(_objects(args.out)) - before:
            (args.out / rel).unlink()
        print(f"WARNING: vendored-flash-attn: FA4 kernels for {args.arch} (Python {sys.version_info.major}."
              f"{sys.version_info.minor}) not precompiled (VFA_FA4_PRECOMPILE=auto): {'; '.join(failed)[:2000]}. "
              "The wheel compiles them at first use; set VFA_FA4_PRECOMPILE=on to make this an error, off to "
              "skip it.", flush=True)
    if args.record:
        add_precompile_run(args.record, _run_summary(args.arch, report, failed, selection_from_args(args)))
    return 0


def _run_summary(arch: str, report: dict | None, failed: list[str], selection: Selection) -> dict:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    chosen = dataclasses.asdict(selection)
    if report is None or failed:
        return {"arch": arch, "python": python, "kernels": 0, "selection": chosen,
                "error": portable("; ".join(failed))[:2000]}
    calls = report["calls"]
    shipped = {**_shipped_objects(report), **report.get("aliased", {})}
    # A Python sharing another's kernels: its kernels are the aliases its index lists.
    kernels = report["aliases"] if "same_as" in report else len(shipped)
    same_as = {"same_as": {k: report["same_as"][k] for k in ("python", "fingerprint")}} if "same_as" in report else {}
    return {"arch": arch, "kernels": kernels, "selection": chosen, "jobs": report.get("jobs", 1),
            "calls": len(calls), "refused": sorted({c["call"] for c in calls if c["refused"]}),
            "bytes": sum(shipped.values()), **same_as,
            **{k: report[k] for k in ("flavour", "python", "cutlass", "tvm_ffi", "fingerprint")}}


def check_installed(report_path: Path | None = None) -> int:
    """On a GPU, with the wheel installed: every kernel the wheel precompiled for this Python
    and this GPU, called through the public ``flash_attn_varlen_func(..., fa_version=4)`` on
    real data, must load from the shipped kernels — nothing may compile (a kernel written to
    the user cache, which must start empty, means it did). Prints one line per call; exit
    status 1 when any call compiled, failed or returned non-finite values."""
    from importlib import resources

    import torch

    import vendored_flash_attn
    from vendored_flash_attn import fa4

    user = fa4_cache.user_cache_root()
    if _objects(user):
        raise SystemExit(f"the user cache {user} is not empty: point FLASH_ATTENTION_CUTE_DSL_CACHE_DIR at an empty folder")
    record = json.loads(resources.files("vendored_flash_attn._fa4").joinpath(RECORD_FILE).read_text())
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
        args, kwargs = _make_call(loaded.interface, torch, call, major, real=True)
        before = _objects(user)
        torch.cuda.synchronize()
        start = time.perf_counter()
        error = None
        try:
            out = vendored_flash_attn.flash_attn_varlen_func(*args, fa_version=4, **kwargs)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            tensors = out if isinstance(out, tuple) else (out,)
            finite = all(bool(torch.isfinite(t).all()) for t in tensors)
        except Exception as exc:  # noqa: BLE001 - reported per call
            first, finite, error = time.perf_counter() - start, False, f"{type(exc).__name__}: {exc}"[:300]
        compiled = sorted(set(_objects(user)) - set(before))
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
        report_path.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM during the workers' run: stop the build
        print("fa4_precompile.py: interrupted; every FA4 compile worker it started has stopped", file=sys.stderr)
        sys.exit(130)
