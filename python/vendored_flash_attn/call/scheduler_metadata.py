"""Scheduler metadata: what ``get_scheduler_metadata`` computed it for, and whether a
``flash_attn_varlen_func`` call may use it.

FA3's ``get_scheduler_metadata`` precomputes the tile schedule the forward kernel would
otherwise work out itself for one call shape (upstream ``hopper/flash_api.cpp``,
``mha_fwd_get_scheduler_metadata``: query tiles per sequence, split counts, head
swizzle, the tile semaphore). A call given that tensor skips its own computation and
trusts it. Metadata computed for another shape fails upstream's size check
(``scheduler_metadata must have shape (metadata_size)``) or, when the sizes happen to
agree, is used as it is: the kernel then runs another call's schedule (rows never
computed, or more splits than the call's partial-output buffer holds).

``get_scheduler_metadata`` records, for the tensor it returns, the arguments it was
computed with (``record``); a call that passes that tensor is checked against them
(``check_call``) before any kernel runs. The comparison is of what upstream *derives*
from the arguments, not of the raw arguments: upstream's own test computes decode
metadata without ``page_size`` for a paged call, and vLLM computes it without
``has_softcap`` for a softcap model; both omissions are harmless wherever they do not
change the schedule FA3 derives (tile size, mask kind, splits, PackGQA), and are refused
where they do. What is compared, from ``mha_fwd`` and ``mha_fwd_get_scheduler_metadata``
at the pin:

* batch size, max_seqlen_q, max_seqlen_k, query and KV heads, head dims: as given;
* FP8 or 16-bit (the element size is all the schedule reads of the dtype);
* the mask after upstream's normalisation (windows clamped to the sequence lengths,
  causal dropped for one-token queries unless paged with head dim in (64, 128]):
  causal, local with its window, or none;
* num_splits (0 or less: FA3's heuristic);
* the tile size FA3 picks (``tile_size_fwd_sm90`` in ``hopper/tile_size.h``, which reads
  the page size and softcap only in some head-dim branches);
* PackGQA, where it is not forced on (it is for equal head dims in this build);
* what a call of this package always has: no appended KV, no left padding, sm_margin 0.

The *contents* of ``cache_seqlens`` and ``cu_seqlens_q`` at the time the metadata was
computed are part of it too; they are not compared (reading them would synchronise the
device on every call).

A tensor that was not returned by ``get_scheduler_metadata`` (vLLM copies the metadata
into a persistent CUDA-graph buffer and passes a view of that) cannot be checked this
way; the op's own check then raises, and ``op_error`` turns that into the same advice.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple, Optional

import torch

from ..declaration.build_info import ComponentInfo
from ..selection.environment import on_environment_change
from ..errors import FlashAttnInputError
from ..declaration.kernels import FA3_HEAD_DIM_BUCKETS, fa3_bucket

_E4M3 = torch.float8_e4m3fn


class MetadataArgs(NamedTuple):
    """The arguments of one get_scheduler_metadata call (or the ones a call implies)."""

    batch_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_heads_q: int
    num_heads_kv: int
    headdim: int
    headdim_v: int
    qkv_dtype: torch.dtype
    cu_seqlens_q: bool  # given (its values are not kept)
    page_size: Optional[int]
    causal: bool
    window_size: tuple
    has_softcap: bool
    num_splits: int
    pack_gqa: Optional[bool] = None
    sm_margin: int = 0
    max_seqlen_k_new: int = 0
    cu_seqlens_k_new: bool = False
    cache_leftpad: bool = False

    def as_call(self) -> str:
        """The get_scheduler_metadata call that computes these, as Python source."""
        parts = [f"batch_size={self.batch_size}", f"max_seqlen_q={self.max_seqlen_q}",
                 f"max_seqlen_k={self.max_seqlen_k}", f"num_heads_q={self.num_heads_q}",
                 f"num_heads_kv={self.num_heads_kv}", f"headdim={self.headdim}",
                 "cache_seqlens=seqused_k", f"qkv_dtype={self.qkv_dtype}"]
        if self.headdim_v != self.headdim:
            parts.append(f"headdim_v={self.headdim_v}")
        if self.cu_seqlens_q:
            parts.append("cu_seqlens_q=cu_seqlens_q")
        if self.page_size is not None:
            parts.append(f"page_size={self.page_size}")
        parts += [f"causal={self.causal}", f"window_size={tuple(self.window_size)}",
                  f"has_softcap={self.has_softcap}", f"num_splits={self.num_splits}"]
        if self.pack_gqa is not None:
            parts.append(f"pack_gqa={self.pack_gqa}")
        if self.sm_margin:
            parts.append(f"sm_margin={self.sm_margin}")
        if self.max_seqlen_k_new:
            parts.append(f"max_seqlen_k_new={self.max_seqlen_k_new}")
        if self.cu_seqlens_k_new:
            parts.append("cu_seqlens_k_new=...")
        if self.cache_leftpad:
            parts.append("cache_leftpad=...")
        return f"get_scheduler_metadata({', '.join(parts)})"


# --- what upstream derives (hopper/flash_api.cpp, tile_size.h, heuristics.h) ----------

def _mask(max_q: int, max_k: int, causal: bool, window, headdim: int, paged: bool):
    """(is_causal, is_local, window or None), normalised like mha_fwd and
    mha_fwd_get_scheduler_metadata do (and set_params_fprop after them)."""
    left, right = int(window[0]), int(window[1])
    if left >= max_k - 1:
        left = -1
    if right >= max_q - 1:
        right = -1
    if max_q == 1 and left == -1 and right == -1:
        # Upstream keeps causal for hdim 128 paged decode (its tile choice), else drops it.
        if headdim <= 64 or headdim > 128 or not paged:
            causal = False
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    is_local = (left >= 0 or right >= 0) and not is_causal
    if left < 0 and right >= 0:
        left = max_k - 1
    if left >= 0 and right < 0:
        right = max_q - 1
    return is_causal, is_local, ((left, right) if is_local else None)


def _round_up_headdim_v(dv: int) -> int:
    for bucket in FA3_HEAD_DIM_BUCKETS:
        if dv <= bucket:
            return bucket
    return 512


def tile_size_sm90(d_rounded: int, dv_rounded: int, is_causal: bool, is_local: bool, fp8: bool,
                   paged_kv_non_tma: bool, softcap: bool, one_mma_wg: bool,
                   fp8_two_level: bool) -> tuple:
    """(kBlockM, kBlockN) of upstream's tile_size_fwd_sm90 at the pin (v_colmajor false)."""
    if not fp8:
        if d_rounded <= 64:
            if dv_rounded == 512:
                return 64, 64
            if dv_rounded == 256:
                return 128, 96
            if one_mma_wg:
                return 64, 192
            return 192, (128 if is_causal else 160 if (is_local or paged_kv_non_tma) else 192)
        if d_rounded <= 96:
            return 192, (128 if (is_local or paged_kv_non_tma) else 144)
        if d_rounded <= 128:
            if is_causal or is_local or paged_kv_non_tma:
                return (64 if one_mma_wg else 128), 128
            return (64, 176) if one_mma_wg else (128, 160)
        if d_rounded <= 192:
            return 128, (96 if (paged_kv_non_tma or is_local) else (128 if dv_rounded <= 128 else 96))
        return 128, (64 if is_local else 80)
    if one_mma_wg:
        return 64, (128 if d_rounded <= 96 else 96)
    if fp8_two_level:
        if d_rounded <= 64:
            return 192, 128
        if d_rounded <= 96:
            return 128, 128
        if d_rounded <= 128:
            return 128, 192
        if d_rounded <= 192:
            return 128, 96
        return 128, (64 if is_local else 128)
    if d_rounded <= 64:
        return 192, 160
    if d_rounded <= 96:
        return 192, 128
    if d_rounded <= 128:
        return 128, (160 if paged_kv_non_tma else (192 if (softcap and is_local) else 224))
    if d_rounded <= 192:
        return 128, (128 if ((paged_kv_non_tma or softcap) and is_local) else 160)
    return 128, (64 if is_local else 128)


class Schedule(NamedTuple):
    """What FA3 derives from MetadataArgs; two arguments sets with equal Schedules give
    the same metadata. Field order = the order mismatches are reported in."""

    batch_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_heads_q: int
    num_heads_kv: int
    headdim: int
    headdim_v: int
    fp8: bool
    mask: tuple
    num_splits: int
    tile: tuple
    pack_gqa: tuple
    sm_margin: int
    appended_kv: bool
    cache_leftpad: bool


def derive(args: MetadataArgs, comp: ComponentInfo) -> Schedule:
    fp8 = args.qkv_dtype == _E4M3
    paged = args.page_size is not None
    is_causal, is_local, window = _mask(args.max_seqlen_q, args.max_seqlen_k, args.causal,
                                        args.window_size, args.headdim, paged)
    built = tuple(sorted(comp.head_dims))
    d_rounded = fa3_bucket(args.headdim, built) or 256  # round_up_headdim skips disabled dims
    dv_rounded = d_rounded if args.headdim_v == args.headdim else _round_up_headdim_v(args.headdim_v)
    qhead_per_khead = args.num_heads_q // max(args.num_heads_kv, 1)
    one_mma_wg = (args.headdim in (64, 128) and not is_local
                  and args.max_seqlen_q * qhead_per_khead <= 64)
    two_level = "FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION" not in comp.defines

    def tile(paged_kv_non_tma: bool) -> tuple:
        return tile_size_sm90(d_rounded, dv_rounded, is_causal, is_local, fp8, paged_kv_non_tma,
                              args.has_softcap, one_mma_wg, two_level)

    # get_pagedkv_tma: TMA for the paged cache only when pages hold whole kBlockN tiles
    # and the query side fills a kBlockM tile.
    paged_kv_non_tma = False
    if paged:
        block_m, block_n = tile(False)
        tma = (not is_local and args.page_size % block_n == 0
               and args.max_seqlen_q * qhead_per_khead > block_m)
        paged_kv_non_tma = not tma
    # PackGQA: forced on for equal head dims by FLASHATTENTION_PACKGQA_ONLY; otherwise
    # get_pack_gqa's inputs (an explicit value, the paged-KV path, and whether the
    # varlen shortcut applies).
    if args.headdim == args.headdim_v and "FLASHATTENTION_PACKGQA_ONLY" in comp.defines:
        pack = ("forced on",)
    else:
        pack = (args.pack_gqa, paged_kv_non_tma,
                args.cu_seqlens_q or args.num_heads_q == args.num_heads_kv)
    return Schedule(
        args.batch_size, args.max_seqlen_q, args.max_seqlen_k, args.num_heads_q, args.num_heads_kv,
        args.headdim, args.headdim_v, fp8,
        ("causal" if is_causal else f"local {window}" if is_local else "none",),
        max(args.num_splits, 0), tile(paged_kv_non_tma), pack, args.sm_margin,
        bool(args.max_seqlen_k_new or args.cu_seqlens_k_new), args.cache_leftpad)


_WHY = {
    "fp8": "FP8 and 16-bit inputs get different tiles",
    "mask": "the mask after FA3's normalisation (causal/window_size, clamped to the sequence "
            "lengths; causal is dropped for one-token queries unless paged with head dim in "
            "(64, 128])",
    "num_splits": "0 means FA3's heuristic",
    "tile": "FA3's tile size (kBlockM, kBlockN), which page_size, causal, window_size and "
            "has_softcap choose between",
    "pack_gqa": "PackGQA (explicit pack_gqa, the paged-KV path, cu_seqlens_q)",
    "sm_margin": "flash_attn_varlen_func runs with sm_margin=0",
    "appended_kv": "flash_attn_varlen_func appends no KV (max_seqlen_k_new=0, no cu_seqlens_k_new)",
    "cache_leftpad": "flash_attn_varlen_func takes no left padding",
}


def mismatches(metadata: Schedule, call: Schedule) -> list[str]:
    """One line per field in which the two schedules differ."""
    out = []
    for name, have, want in zip(Schedule._fields, metadata, call, strict=True):
        if have != want:
            if name == "mask":
                have, want = have[0], want[0]
            why = f" ({_WHY[name]})" if name in _WHY else ""
            out.append(f"{name}: {have} for the metadata, {want} for this call{why}")
    return out


# --- the record of what each returned tensor was computed for --------------------------
#
# id(tensor) -> [weakref to it, MetadataArgs, call keys found consistent, the last one
# (compared first: a tuple compare costs half a set lookup)]. Not a
# weakref.WeakKeyDictionary: it compares keys with ==, elementwise on tensors (an error);
# torch.utils.weak.WeakTensorKeyDictionary costs ~1 us per lookup, and vLLM passes the
# metadata on every layer of every step. The weakref's callback drops the entry when
# the tensor dies, before its id can be reused; lookups compare identity anyway.
_records: dict = {}
records = _records  # read by flash_attn_varlen_func


def record(tensor: torch.Tensor, args: MetadataArgs) -> None:
    key = id(tensor)

    def forget(_ref, key=key):
        entry = _records.get(key)
        if entry is not None and entry[0] is _ref:
            del _records[key]

    _records[key] = [weakref.ref(tensor, forget), args, set(), None]


def recorded_args(tensor) -> Optional[MetadataArgs]:
    entry = _records.get(id(tensor))
    return entry[1] if entry is not None and entry[0]() is tensor else None


def forget_verdicts() -> None:
    """Another environment (another build info, which the verdicts read): redo them."""
    for entry in _records.values():
        entry[2].clear()
        entry[3] = None


on_environment_change(forget_verdicts)


# The call's values a verdict depends on, in the order flash_attn_varlen_func builds
# them (inline, on the hot path): (batch, num_heads, num_heads_k, head_size, head_size_v,
# dtype, max_seqlen_q, max_seqlen_k, page_size or None, causal, (left, right) window,
# softcap, num_splits).


def check_call(entry: list, comp: ComponentInfo, key: tuple) -> None:
    """Raise FlashAttnInputError when the metadata of ``entry`` (``records[id(tensor)]``,
    its weakref checked by the caller to point at the tensor passed) was computed for a
    call FA3 schedules differently from the call ``key`` describes; else remember the
    key as consistent, so the next call of that shape costs a set lookup."""
    if key in entry[2]:
        entry[3] = key
        return
    (batch, num_heads, num_heads_k, head_size, head_size_v, dtype, max_seqlen_q, max_seqlen_k,
     page_size, causal, window, softcap, num_splits) = key
    args = entry[1]
    call = MetadataArgs(batch, max_seqlen_q, max_seqlen_k, num_heads, num_heads_k, head_size,
                        head_size_v, dtype, True, page_size, bool(causal), tuple(window),
                        softcap > 0, num_splits)
    problems = mismatches(derive(args, comp), derive(call, comp))
    if problems:
        raise FlashAttnInputError(
            f"scheduler_metadata was computed for another call: {args.as_call()}. FA3 would run "
            f"this call with that call's schedule; they differ in " + "; ".join(problems)
            + f". Compute it for this call, {call.as_call()}, or pass scheduler_metadata=None "
            "to let FA3 compute it.")
    entry[2].add(key)
    entry[3] = key


def op_error(exc: RuntimeError, call_hint: str) -> Optional[FlashAttnInputError]:
    """The op refused scheduler_metadata (a tensor we did not record, e.g. a copy in a
    CUDA-graph buffer): the same advice as check_call; None for other errors."""
    message = str(exc)
    if "scheduler_metadata" not in message:
        return None
    first = message.strip().splitlines()[0] if message.strip() else message
    return FlashAttnInputError(
        f"scheduler_metadata does not fit this call (FA3: {first}). It must be computed by "
        f"get_scheduler_metadata for exactly this call, {call_hint} (a copy of it, e.g. in a "
        "CUDA-graph buffer, must be of that same result), or pass scheduler_metadata=None to "
        "let FA3 compute it.")
