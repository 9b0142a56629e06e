"""FA4's compile step: the planned kernel calls made through FA4's adapter on fake CUDA tensors.

Each call of the plan (vendored_flash_attn.families.fa4.plan) goes through ``vendored_flash_attn.families.fa4.adapter.run``
under torch's ``FakeTensorMode``, so it compiles one real kernel (SASS for the arch) with the
compile key a run-time call gets, and launches nothing: no GPU is needed. Needs torch and the
``fa4`` extra in the interpreter that runs it (one kernel set per Python: upstream's
fingerprint holds the Python minor). The kernels land in
``<out>/<dsl flavour>/<upstream fingerprint>/<kernel kind>/<key hash>.o``; each call's
report lists the ``[kind, key hash]`` of every kernel it looked up (what --share compares).
One process compiles here; fa4_workers spreads the calls over several.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import shutil
import sys
import time
from pathlib import Path

from vfa_build.fa4.stage import VENDORED_PACKAGE
from vendored_flash_attn.families.fa4 import cache as fa4_cache
from vendored_flash_attn.families.fa4.plan import KernelCall, generation, make_call


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
                      package: str = VENDORED_PACKAGE, verify: bool = False, progress: Path | None = None) -> dict:
    """Compile ``calls`` for ``arch`` into ``out/<flavour>/<fingerprint>/<kind>/`` through
    FA4's adapter (``vendored_flash_attn.families.fa4.adapter.run``) on fake tensors; a report dict, each
    call with the ``[kind, key hash]`` of every kernel it looked up (``lookups``).

    Going through the adapter, not upstream's public functions, makes the compile keys those
    of run-time calls: the adapter picks split-KV, descales, windows and the like the way it
    does for vLLM's calls. ``verify``: load from ``out`` as the installed wheel does and make
    each call twice; a kernel written to the (temporary) user cache means it compiled.
    ``progress``: a line is appended to this file as each call ends (what a worker's
    supervisor, fa4_workers, counts).
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

    from vendored_flash_attn.families.fa4 import adapter as fa4

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
        before = fa4_cache.kernel_files(user)
        start = time.perf_counter()
        error = refused = None
        del lookups[:]
        try:
            with FakeTensorMode():
                args, kwargs = make_call(loaded.interface, torch, call, gen)
                fa4.run(gen * 10, *args, **kwargs)
        except fa4.FA4Unsupported as exc:  # the adapter refuses it at run time too: nothing to ship
            refused = str(exc).splitlines()[0]
        except Exception as exc:  # a kernel that fails: recorded, the rest go on
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = time.perf_counter() - start
        new = {k: v for k, v in fa4_cache.kernel_files(user).items() if k not in before}
        results.append({"call": call.name, **dataclasses.asdict(call), "attempt": attempt,
                        "seconds": round(seconds, 3), "objects": new, "error": error, "refused": refused,
                        "lookups": [list(x) for x in lookups]})
        status = error or (f"refused: {refused}" if refused else f"{len(new)} new object(s), {sum(new.values())} B")
        print(f"  {call.name:48s} #{attempt} {seconds:7.3f} s  {status}", flush=True)
        if progress is not None:
            with open(progress, "a", encoding="utf-8") as done:
                done.write(f"{call.name}\n")
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
