"""The plan of FA4's precompiled kernels: which calls a wheel's selection reaches on an arch.

One call per kernel (compile key) that vLLM's calls reach through FA4's adapter
(``vendored_flash_attn.families.fa4.adapter.run``) for FA4's own selection (cmake/knobs.json:
``VFA_FA4_PRECOMPILE_HEAD_DIMS``, ``_DTYPES``, ``_FEATURES``, ``_GQA_RATIOS``; LSE both ways),
and the CUDA tensors that make each call. Which calls FA4 takes is not restated here: each
candidate goes through the adapter itself (``fa4.run``) on fake tensors, with a stand-in for
upstream's interface that compiles nothing, and the calls it refuses (``FA4Unsupported``: an
excluded generation, FP8 where FA4 has none, a head size or page size it does not take, ...)
are not planned. The build compiles the plan (``cmake/vfa_build/fa4/precompile.py compile``, on fake
tensors); the installed wheel's GPU check (``release/fa4_kernels.py``) makes the calls again on real
data, from the selection each run recorded in FA4's build record, to see that every one loads
without a compile: both read this one plan, so what is checked is what was shipped.
Importing this module needs the standard library only; ``plan`` imports torch and the adapter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import threading

from ...declaration import knob_values
from ...declaration.families import registry

# The family this plan is for: its arch exclusions and FP8 head dims are read from its
# declaration. A literal because the plan follows FA4's adapter (fa4.run) and upstream's
# CuTe interface, which no other family has.
FAMILY = "fa4"

# The knob of each axis of the selection (cmake/knobs.json declares their choices and presets;
# cmake/FA4Package.cmake hands the build's values to `fa4/precompile.py compile`).
KNOBS = {"head_dims": "VFA_FA4_PRECOMPILE_HEAD_DIMS", "dtypes": "VFA_FA4_PRECOMPILE_DTYPES",
         "features": "VFA_FA4_PRECOMPILE_FEATURES", "gqa_ratios": "VFA_FA4_PRECOMPILE_GQA_RATIOS"}
NUMERIC = ("head_dims", "gqa_ratios")

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


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in re.split(r"[,;\s]+", text.strip()) if w)


def _typed(axis: str, values) -> tuple:
    return tuple(int(v) for v in values) if axis in NUMERIC else tuple(values)


def choices(axis: str) -> tuple:
    """What the axis's knob allows (its declaration's choices)."""
    return _typed(axis, knob_values.load()["knobs"][KNOBS[axis]]["choices"])


def preset_values(axis: str, preset: str) -> tuple:
    """What the axis's knob holds when not set, as the build reads it (cmake/Options.cmake,
    cmake/KernelSelection.cmake's vfa_selection_knob): its default, else the preset's values,
    else (a preset it does not name) every choice."""
    knob = knob_values.load()["knobs"][KNOBS[axis]]
    values = _words(knob["default"]) or knob.get("presets", {}).get(preset) or knob["choices"]
    return _typed(axis, values)


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
    """FA4's precompile selection; each axis among its knob's choices. ``Selection()`` is the
    ``minimal`` preset's; ``Selection.preset(name)`` any preset's."""
    head_dims: tuple[int, ...] = dataclasses.field(default_factory=lambda: preset_values("head_dims", "minimal"))
    dtypes: tuple[str, ...] = dataclasses.field(default_factory=lambda: preset_values("dtypes", "minimal"))
    features: tuple[str, ...] = dataclasses.field(default_factory=lambda: preset_values("features", "minimal"))
    gqa_ratios: tuple[int, ...] = dataclasses.field(default_factory=lambda: preset_values("gqa_ratios", "minimal"))
    return_lse: tuple[bool, ...] = (False, True)

    @classmethod
    def preset(cls, name: str) -> "Selection":
        return cls(**{axis: preset_values(axis, name) for axis in KNOBS})

    def __post_init__(self):
        for axis in KNOBS:
            allowed = choices(axis)
            bad = [v for v in getattr(self, axis) if v not in allowed]
            if bad:
                raise ValueError(f"FA4 selection: {axis.replace('_', ' ')} {bad} are not among {KNOBS[axis]}'s "
                                 f"choices: {', '.join(map(str, allowed))}")

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


class _StandInInterface:
    """Upstream's interface as far as FA4's adapter asks it while it decides on a call: a tile
    (its page-size rules compare the page with it; ``make_call``'s ``paged`` layout uses the same
    one, ``paged_cpasync`` another size), and a forward that compiles and launches nothing."""

    TILE_N = 128

    @staticmethod
    def _resolve_causal_local_window(causal, left, right):
        return causal, left is not None or right is not None, left, right

    @classmethod
    def _tile_size_fwd_sm90(cls, *args):
        return type("Tile", (), {"n_block_size": cls.TILE_N})

    @staticmethod
    def _flash_attn_fwd(*args, **kwargs):
        return None, None


_STAND_IN_LOCK = threading.Lock()


@contextlib.contextmanager
def _adapter_without_kernels(fa4):
    """FA4's adapter with the stand-in interface in place of upstream's (``fa4.load``), so that
    ``fa4.run`` makes every decision of a real call and compiles nothing. For the plan only:
    never in a process that is calling FA4 meanwhile."""
    with _STAND_IN_LOCK:
        real = fa4.load
        fa4.load = lambda: fa4.Loaded(_StandInInterface(), {})
        try:
            yield
        finally:
            fa4.load = real


def plan(selection: Selection, arch: str = "sm_90a") -> list[KernelCall]:
    """One call per kernel the selection can reach on ``arch``, in a stable order, no duplicates:
    each candidate is made through FA4's adapter (``fa4.run``) on fake tensors, and those it
    refuses are left out."""
    gen = generation(arch)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import adapter as fa4

    calls = []
    with _adapter_without_kernels(fa4), FakeTensorMode():
        for layout, dim, dtype, mask, gqa, split, lse in itertools.product(
                selection.layouts, selection.head_dims, selection.dtypes, selection.masks,
                selection.gqa_ratios, selection.splits, selection.return_lse):
            call = KernelCall(layout, dim, dtype, mask, gqa, split, lse)
            if call in calls:
                continue
            args, kwargs = make_call(_StandInInterface, torch, call, gen)
            try:
                fa4.run(gen * 10, *args, **kwargs)
            except fa4.FA4Unsupported:
                continue
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

