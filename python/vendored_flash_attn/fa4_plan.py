"""The plan of FA4's precompiled kernels: which calls a wheel's selection reaches on an arch.

One call per kernel (compile key) that vLLM's calls reach through FA4's adapter
(``vendored_flash_attn.fa4.run``) for a selection (the wheel's head dims, dtypes and
features, the GQA ratios, LSE), and the CUDA tensors that make each call. The build
compiles them (``cmake/fa4_precompile.py compile``, on fake tensors); the installed wheel's
GPU check (``wheel_check_fa4``) makes them again on real data, from the selection each run
recorded in FA4's build record, to see that every one loads without a compile: both read
this one plan, so what is checked is what was shipped. Standard library only (the tensor
maker is handed torch and upstream's interface by its caller).
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from .families import registry

# The family this plan is for: its arch exclusions and FP8 head dims are read from its
# declaration. A literal because the plan follows FA4's adapter (fa4.run) and upstream's
# CuTe interface, which no other family has.
FAMILY = "fa4"

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
    if gen in registry().by_name(FAMILY).excluded:
        return False
    if call.dtype == "e4m3":
        if gen == 12:
            return False
        if gen == 9:  # FP8 KV: paged with page size == tile_n, at the head dims FA4 is declared for
            allowed = registry().by_name(FAMILY).call.fp8_kv_head_dims
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


def make_call(interface, torch, call: KernelCall, gen: int, real: bool = False) -> tuple[tuple, dict]:
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

