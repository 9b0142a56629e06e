"""FA4's adapter: vLLM's ``flash_attn_varlen_func`` call mapped onto upstream's CuTe DSL kernels.

FA4 is upstream's ``flash_attn/cute`` at the pin, shipped in the wheel as
``vendored_flash_attn._fa4.cute`` (imports rewritten at build time, cmake/vfa_build/fa4/precompile.py)
and run with the ``[fa4]`` extra installed. Nothing here is imported by
``import vendored_flash_attn``; ``load()`` runs at the first FA4 call: dependency check
(``fa4_deps.check``, no cutlass import), then the import (seconds: cutlass, torch, the
sources), then the two-level AOT kernel cache (cache.py).

The family's adapter is ``forward`` (a call object, call.VarlenCall) and its ``launch`` (the
same call in the launch contract, call.LAUNCH, which the interface's quick path uses): the
interface hands it a call after the shared checks and the debug checks every family's calls
get; ``run`` is the same mapping for a given arch without them (the build's precompile step). It calls upstream's
``_flash_attn_fwd`` — the function the pin's own ``vllm_flash_attn/flash_attn_interface.py``
probes for, and the only one that takes the FP8 descales and ``fp8_kv_dequant`` — with every
argument by name. What FA4 cannot do is refused before any kernel with ``FA4Unsupported``,
naming the family that can (read off the declaration).

What FA4 does at the pin, read off ``flash_attn/cute/interface.py`` (617264c1):

* sm90: varlen, paged KV (``page_table`` + ``seqused_k``; TMA loads when the page size is
  the kernel's tile_n, else cp.async), causal, local window, softcap, sinks
  (``learnable_sink``, bf16, one per q head), split-KV, GQA packing, LSE; FP8 **KV** with a
  bf16/fp16 q (``fp8_kv_dequant``: paged only, page size == tile_n, head_dim == head_dim_v);
  no FP8 q (``assert arch // 10 == 10``).
* sm100/sm110: the same plus FP8 q/k/v with descales; no FP8-KV-only path.
* sm120: declared ``excluded`` (cmake/knobs.json: its forward kernel does not compile at the
  pin), so every call there is refused by the declaration's words before any rule below.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from . import cache as fa4_cache, deps as fa4_deps
from ...call.arguments import VarlenCall, launch_arguments
from ...selection.environment import current_environment, on_environment_change
from ...errors import FlashAttnInputError, FlashAttnTypeError, FlashAttnUnavailableError
from ...declaration.families import Family, registry, titles_text
from ...declaration.kernels import dtype_name, head_size_problem
from ...call.validation import _is_local, window_tuple


def _family() -> Family:
    """The family this module is the adapter of, as the declaration says (its ``adapter``)."""
    return next(f for f in registry() if f.adapter.partition(":")[0] == __name__)


# FA4's family declaration (cmake/knobs.json): its dtypes, features and call rules, which
# the shared checks read, and the GPU generations (compute capability major) it runs on.
# A call through the interface is handed its family with its resolution; ``run`` uses this.
FAMILY = _family()
GENERATIONS = FAMILY.generations
# The staged copy of upstream's flash_attn/cute: the module the declaration probes for.
SUBPACKAGE = FAMILY.probe
_E4M3 = torch.float8_e4m3fn


class FA4Unsupported(FlashAttnInputError):
    """A call FA4 cannot run; the message names the family of this package that can."""


@dataclass(frozen=True)
class Loaded:
    interface: object
    cache_layout: dict


_loaded: Optional[Loaded] = None
_load_lock = threading.Lock()


def load() -> Loaded:
    """Import FA4 once per process: dependency check, sources, AOT cache."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _load_lock:
        if _loaded is None:
            fa4_deps.check()
            try:
                interface = importlib.import_module(f"{SUBPACKAGE}.interface")
            except ModuleNotFoundError as exc:
                if exc.name and (SUBPACKAGE.startswith(exc.name) or exc.name.startswith(SUBPACKAGE)):
                    others = titles_text(f for f in registry() if f is not FAMILY)
                    raise FlashAttnUnavailableError(
                        f"{FAMILY.title} is not in this wheel (built with {FAMILY.build_knob}=off, or from a source "
                        f"tree without the staged {SUBPACKAGE}): rebuild with {FAMILY.build_knob}=on, or use {others}."
                    ) from exc
                raise
            cache_utils = importlib.import_module(f"{SUBPACKAGE}.cache_utils")
            import cutlass

            _loaded = Loaded(interface, fa4_cache.install(interface, cache_utils, cutlass))
    return _loaded


def _refuse(message: str):
    raise FA4Unsupported(message)


def _those_that(family: Family, arch: int, feature: str) -> Optional[str]:
    """"FA3 (fa_version=3)": the other declared families that have ``feature`` and run on
    GPUs of ``arch``, for a refusal's message; None when there is none."""
    major, minor = divmod(arch, 10)
    others = [f for f in registry().having(feature)
              if f is not family and f.capability_problem(major, minor, 0) is None]
    return " or ".join(f"{f.title} (fa_version={f.version})" for f in others) or None


def _or_fallback(family: Family) -> str:
    """"; use FA2 (fa_version=2)": the declared fallback, for a refusal's message."""
    fallback = registry().by_name(family.fallback) if family.fallback else None
    return f"; use {fallback.title} (fa_version={fallback.version})" if fallback else ""


# q's device index -> its compute capability as upstream numbers it: asked on every call.
_ARCHS: dict = {}
on_environment_change(_ARCHS.clear)


def device_arch(q: torch.Tensor) -> int:
    """Compute capability of q's GPU as upstream numbers it (90, 100, 120 ...)."""
    index = q.get_device()
    arch = _ARCHS.get(index)
    if arch is None:
        # A CUDA tensor's index names its device; -1 (a CPU tensor: a described test machine
        # only, the shared checks refuse it on a real one) the current device, fixed there.
        env = current_environment()
        major, minor = env.capability(index if index >= 0 else env.current_device())
        arch = _ARCHS[index] = major * 10 + minor
    return arch


def _window(window: tuple[int, int]) -> tuple[Optional[int], Optional[int]]:
    """vLLM's (left, right) with -1 = unbounded, as FA4's window_size_left/right (None = unbounded)."""
    left, right = window
    return (left if left >= 0 else None), (right if right >= 0 else None)


# What check_call accepted: (id of the family, arch, dtypes, head sizes, and the call's traits its
# rules read) -> (that family, fp8_kv_dequant). Asked on every call, decided once per kind; the
# entry holds the family so that its id is not reused while it is in the table. A refusal is not
# kept: it raises again with its own message.
_ACCEPTED: dict = {}
on_environment_change(_ACCEPTED.clear)


def check_call(family: Family, arch: int, q, k, v, block_table, seqused_k, softcap, num_splits, s_aux,
               causal, window: tuple[int, int]) -> bool:
    """Refuse what FA4 cannot run on ``arch``; True when the call is FP8 KV with a 16-bit q
    (upstream's ``fp8_kv_dequant``). What every family refuses (shapes, dtypes, index
    tensors, out=, and the arguments of features FA4 does not declare: ALiBi, q_v,
    scheduler_metadata, context parallelism) the shared checks
    (validation.check_varlen_call) refused before. What is FA4's own is checked here, each
    rule one of upstream's ``assert``s that the call would reach (interface.py and the kernel
    classes at the pin): ``python -O`` removes those, so none is left to them (docs/runtime.md
    lists each). The paged page-size rules that need upstream's tile choice are in ``launch``.
    The arguments are the call's (``window``: window_tuple(window_size))."""
    key = (id(family), arch, q.dtype, k.dtype, v.dtype, q.shape[-1], v.shape[-1], block_table is not None,
           num_splits > 1, s_aux is not None, softcap > 0, _is_local(window, causal), seqused_k is not None)
    known = _ACCEPTED.get(key)
    if known is not None and known[0] is family:
        return known[1]
    fp8_kv_dequant = _check_call(family, arch, q, k, v, block_table, seqused_k, softcap, num_splits, s_aux, causal,
                                 window)
    if len(_ACCEPTED) > 4096:  # odd shapes asked by a fuzzer: no unbounded growth
        _ACCEPTED.clear()
    _ACCEPTED[key] = (family, fp8_kv_dequant)
    return fp8_kv_dequant


def _check_call(family: Family, arch: int, q, k, v, block_table, seqused_k, softcap, num_splits, s_aux, causal,
                window: tuple[int, int]) -> bool:
    generation = family.generations.get(arch // 10)
    if generation is None:  # the declaration's words: where it runs, or why not here
        problem = family.capability_problem(arch // 10, arch % 10, max(q.get_device(), 0))
        _refuse(f"{problem or f'{family.title} does not run on sm{arch}'}{_or_fallback(family)}")
    elsewhere = (lambda feature: f"needs {_those_that(family, arch, feature) or 'a family this package lacks'}")
    head_size, head_size_v = q.shape[-1], v.shape[-1]
    # _validate_head_dims, with the alignment of K/V's element (16 bytes), per generation.
    problem = head_size_problem(family, None, head_size, head_size_v, dtype_name(v.dtype), generation=generation)
    if problem is not None:
        _refuse(problem + _or_fallback(family))
    kv_fp8 = k.dtype == _E4M3 or v.dtype == _E4M3
    fp8_kv_dequant = False
    all_fp8 = _those_that(family, arch, "fp8")
    with_all_fp8 = f"or FP8 q, k and v with {all_fp8}" if all_fp8 else "or a bf16/fp16 KV cache"
    if q.dtype == _E4M3:
        if generation == "sm90":
            _refuse(f"FP8 q {elsewhere('fp8')} on sm90: {family.title}'s FP8 attention is sm100-only at the pin "
                    f"({family.title} on sm90 takes FP8 KV with a bf16/fp16 q)")
        if arch // 10 != 10:  # upstream: assert arch // 10 == 10 (so not on sm110)
            _refuse(f"FP8 attention on sm{arch}: {family.title}'s FP8 kernels are sm100's (compute capability "
                    "10.x) at the pin; use bf16/fp16")
        if not (k.dtype == v.dtype == _E4M3):
            raise FlashAttnTypeError(f"FP8 q needs FP8 (float8_e4m3fn) k and v, got {k.dtype} / {v.dtype}")
    elif kv_fp8:
        if generation != "sm90":
            _refuse(f"FP8 KV with a {q.dtype} q is {family.title}'s sm90 path only; on {generation} quantize q too "
                    "(float8_e4m3fn q, k, v)")
        if not (k.dtype == v.dtype == _E4M3):
            raise FlashAttnTypeError(f"FP8 KV needs float8_e4m3fn k and v, got {k.dtype} / {v.dtype}")
        if block_table is None:
            _refuse(f"FP8 KV with a bf16/fp16 q needs a paged KV cache (block_table) in {family.title}; {with_all_fp8}")
        if head_size != head_size_v:
            _refuse(f"FP8 KV with a bf16/fp16 q needs equal q/k and v head sizes in {family.title}")
        allowed = family.call.fp8_kv_head_dims
        if allowed is not None and head_size not in allowed:
            _refuse(f"FP8 KV with a bf16/fp16 q at head size {head_size}: {family.title} takes it at head size "
                    f"{', '.join(map(str, allowed))} only ({family.call.fp8_kv_why}). "
                    f"Use {(f'FP8 q, k and v with {all_fp8}, or ') if all_fp8 else ''}a bf16/fp16 KV cache")
        fp8_kv_dequant = True
    if generation == "sm100" and head_size == head_size_v == 256:
        # Blackwell's dedicated hd256 kernel (sm100_hd256_2cta_fmha_forward.py) asserts each of these.
        for asked, what in ((softcap > 0, "softcap"), (s_aux is not None, "attention sinks (s_aux)"),
                            (seqused_k is not None, "seqused_k (a paged or batched KV cache)"),
                            (_is_local(window, causal), "a sliding window"), (q.dtype == _E4M3, "FP8"),
                            (num_splits > 1, f"num_splits={num_splits}")):
            if asked:
                _refuse(f"{family.title}'s head-size-256 kernel on {generation} does not take {what} at the pin"
                        f"{_or_fallback(family)}")
    if single_split(generation, head_size, head_size_v) and num_splits > 1:
        # flash_fwd_sm100.py: no split-KV with a V head size of 192 or more
        _refuse(f"num_splits={num_splits} at V head size {head_size_v}: {family.title} on {generation} has no "
                "split-KV there at the pin; pass 0")
    return fp8_kv_dequant


def single_split(generation: Optional[str], head_size: int, head_size_v: int) -> bool:
    """Shapes whose kernel takes no split-KV, so upstream's split heuristic (num_splits < 1)
    must not pick one either: on sm100, equal Q/K and V head sizes with V padded to 192 or more
    (flash_fwd_sm100.py asserts it; the hd256 kernel has no split at all). Upstream itself
    forces one split for unequal head sizes with V 512 (interface.py)."""
    return generation == "sm100" and head_size == head_size_v and -(-head_size_v // 16) * 16 >= 192


class Target(NamedTuple):
    """What ``run`` hands ``launch`` for ``resolved``: the family, and the arch to compile
    for instead of q's device's."""

    family: Family
    arch: int


def run(arch: int, *args, **kwargs):
    """vLLM's ``flash_attn_varlen_func`` call (its arguments, call.VARLEN) for a given ``arch``
    (90, 100, 110), FA4's own rules included and the shared checks not: the one mapping of a
    call onto upstream's kernels, as ``launch`` makes it. The build's precompile step
    (cmake/vfa_build/fa4/precompile.py) calls this on fake tensors with the target's arch, so the kernels
    it ships have the very compile keys these calls reach at run time. Returns ``out``, or
    ``(out, softmax_lse)`` with ``return_softmax_lse=True``."""
    call = VarlenCall(*args, **kwargs)
    out, lse = launch(Target(FAMILY, arch),
                      *launch_arguments(call, window_tuple(call.window_size), call.q.dtype == _E4M3))
    return (out, lse) if call.return_softmax_lse else out


def launch(resolved, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table, out,
           scheduler_metadata, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right,
           softcap, num_splits, return_softmax_lse, fp8, q_v, alibi_slopes, s_aux, cp_world_size, cp_rank,
           cp_tot_seqused_k):
    """FA4's kernels for a call the interface's shared checks (validation.py, against FA4's
    declaration) and debug checks passed, on q's GPU, in the launch contract (call.LAUNCH):
    (out, softmax_lse); LSE is (num_heads, total_q), float32, as FA3's, or None unless asked.
    What FA4 does not declare (scheduler_metadata, q_v, ALiBi, context parallelism) the shared
    checks refused when set; FA4 tells FP8 q from FP8 KV itself (check_call). ``resolved``:
    the interface's resolution (its ``family``; the arch is q's device's), or ``run``'s Target
    (the family and the arch to compile for)."""
    family = resolved.family
    arch = resolved.arch if type(resolved) is Target else device_arch(q)
    window = (window_left, window_right)
    fp8_kv_dequant = check_call(family, arch, q, k, v, block_table, seqused_k, softcap, num_splits, s_aux, causal,
                                window)
    interface = load().interface
    left, right = _window(window)
    generation = family.generations.get(arch // 10)
    head_size, head_size_v = q.shape[-1], v.shape[-1]
    if block_table is not None and (fp8_kv_dequant or head_size % 16 or head_size_v % 16):
        _check_page_size(family, interface, arch, q, k, v, causal, left, right, fp8_kv_dequant)
    if not (fp8_kv_dequant or q.dtype == _E4M3):
        # vLLM passes descales on every call; FA4 asserts they are None for 16-bit data.
        q_descale = k_descale = v_descale = None
    if num_splits < 1 and single_split(generation, head_size, head_size_v):
        # on sm100 upstream's heuristic could pick a split that the kernel for these head sizes
        # asserts against.
        num_splits = 1
    try:
        result = interface._flash_attn_fwd(
            q, k, v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            seqused_k=seqused_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            page_table=block_table,
            softmax_scale=softmax_scale,
            causal=causal,
            softcap=softcap,
            window_size_left=left,
            window_size_right=right,
            learnable_sink=s_aux,
            num_splits=num_splits,  # < 1: upstream's heuristic, as 0 means for vLLM
            return_lse=return_softmax_lse,
            out=out,
            q_descale=q_descale,
            k_descale=k_descale,
            v_descale=v_descale,
            fp8_kv_dequant=fp8_kv_dequant,
            _arch=arch,
        )
    except AssertionError as exc:
        # Upstream checks shapes with assert, before compiling or launching: a clear error type.
        raise FA4Unsupported(f"{family.title} refused the call: {exc}") from exc
    return result[0], result[1]


def forward(resolved, call: VarlenCall, window: tuple[int, int], fp8: bool):
    """FA4's adapter (the declaration's ``adapter``): (out, softmax_lse) of a call the shared
    checks passed, through ``launch``."""
    return launch(resolved, *launch_arguments(call, window, fp8))


forward.launch = launch  # the interface's quick path calls it with a quick call's own arguments


def _check_page_size(family: Family, interface, arch: int, q, k, v, causal: bool,
                     left: Optional[int], right: Optional[int], fp8_kv_dequant: bool) -> None:
    """A page size other than the kernel's tile reads K/V without TMA, which neither the FP8
    KV path nor head sizes off a multiple of 16 have (upstream asserts both): its own rules
    say which tile."""
    generation = family.generations.get(arch // 10)
    head_size, head_size_v = q.shape[-1], v.shape[-1]
    page_size = k.shape[1]
    if generation == "sm90":
        is_causal, is_local, _, _ = interface._resolve_causal_local_window(causal, left, right)
        tile_n = interface._tile_size_fwd_sm90(head_size, head_size_v, is_causal, is_local).n_block_size
    else:
        tile_n = 128  # sm100's, unless a split with unequal head sizes halves it: refused below
        if head_size != head_size_v:
            _refuse(f"a paged KV cache at head sizes {head_size} x {head_size_v} (not multiples of 16) "
                    f"on {generation}: {family.title} needs equal head sizes there at the pin; pad them to a "
                    "multiple of 16")
    if page_size != tile_n:
        all_fp8 = _those_that(family, arch, "fp8")
        what = ("FP8 KV with a bf16/fp16 q" if fp8_kv_dequant
                else f"a paged KV cache at head size {head_size if head_size % 16 else head_size_v} "
                     "(not a multiple of 16)")
        alternative = ((f"or FP8 q, k and v with {all_fp8}" if all_fp8 else "or a bf16/fp16 KV cache")
                       if fp8_kv_dequant else "or pad the head size to a multiple of 16")
        _refuse(f"{what} needs a page size of {tile_n} ({family.title}'s tile for head size {head_size}) on "
                f"{generation}, got {page_size}; {alternative}")
