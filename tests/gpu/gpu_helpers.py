"""Shared pieces of the GPU tests: what the wheel holds, availability, inputs, calls, checks.

Parametrisation reads the installed build info at collection time (``BUILD``); where
there is none (a machine without the built wheel) placeholder values keep collection
working and every test is skipped by conftest.py with the reason.
"""

from __future__ import annotations

# One file over 500 lines, on purpose: what every GPU test imports (the wheel's contents, inputs,
# references, calls); split, each test would import several.

import functools
import math
import random
import zlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import pytest
import torch

from reference import attention_ref, relative_l2

# ---------------------------------------------------------------------------------------
# Tolerances (relative L2 error of the output against the float32 reference).
#
# bf16: q/k/v are exact in the reference, but the kernel rounds P to bf16 before the PV
#   matmul and rounds the output to bf16 (8 significant bits: 2^-9 relative rounding,
#   ~1e-3 RMS each). Measured on the H200 with the upstream build: 1.9e-3 - 2.2e-3.
#   1e-2 leaves ~5x margin and still catches any real bug (a wrong mask, head mapping,
#   page or scale gives errors of 1e-1 and more).
# fp16: 11 significant bits, 8x finer than bf16: same reasoning, 3e-3.
# e4m3: q/k/v are exact in the reference (it dequantises the same FP8 values), but FA3
#   rounds P to e4m3 (4 significant bits: up to 6% per element, ~2-3% RMS) before the PV
#   matmul; only the row maximum (P = 2^8 after FA3's max offset) is exact. With zero-mean
#   random V that is ~1-3% relative L2 by construction; measured 1.7e-2 with non-unit
#   descales. 6e-2 keeps margin; a descale applied to the wrong head or sequence is off
#   by the ratio of two descales (log-uniform in [0.25, 4]), i.e. errors of order 1
#   (test_fp8_descales_are_applied_per_head_and_sequence checks that this is so).
# softcap: the kernels use the hardware tanh approximation (tanh.approx.f32, ~2^-11
#   relative), which moves capped scores by up to ~1e-2 at softcap 20: tolerance x2.
# LSE: scores are accumulated in fp32 from exact operands; the error is that of fp32
#   accumulation and exp2/log approximations (~1e-5 .. 1e-4 absolute). Max absolute
#   error 5e-3 (3e-2 for FP8: Hopper's FP8 tensor cores accumulate with fewer mantissa
#   bits than fp32, ~1e-3 of a score; 5e-2 with softcap, see above). A wrong LSE layout
#   (head/token order) is off by O(1).
# ---------------------------------------------------------------------------------------
OUT_TOL = {"bf16": 1e-2, "fp16": 3e-3, "e4m3": 6e-2}
LSE_TOL = {"bf16": 5e-3, "fp16": 5e-3, "e4m3": 3e-2}
SOFTCAP_OUT_FACTOR = 2.0
SOFTCAP_LSE_TOL = 5e-2

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn}
SIXTEEN_BIT = ("bf16", "fp16")
FA2_BUCKETS = (32, 64, 96, 128, 192, 256)
FA3_BUCKETS = (64, 96, 128, 192, 256)


# --- what the installed wheel holds (collection time) -----------------------------------

def _load_build():
    try:
        from vendored_flash_attn.declaration.build_info import load_build_info

        return load_build_info()
    except Exception:  # BuildInfoMissing, import problems: conftest reports the reason
        return None


BUILD = _load_build()


def component(version: int, build=None):
    """FA``version`` of ``build`` (default: the installed wheel's build info, ``BUILD``)."""
    build = BUILD if build is None else build
    return build.component(version) if build is not None else None


def built_dtypes(version: int, candidates: Sequence[str] = SIXTEEN_BIT, build=None) -> List[str]:
    comp = component(version, build)
    if comp is None:
        return [candidates[0]]  # placeholder: skipped anyway
    return [d for d in candidates if d in comp.dtypes]


def unbuilt_dtypes(version: int, candidates: Sequence[str] = SIXTEEN_BIT) -> List[str]:
    comp = component(version)
    if comp is None:
        return []
    return [d for d in candidates if d not in comp.dtypes]


def built_head_dims(version: int, build=None) -> List[int]:
    comp = component(version, build)
    if comp is None:
        return [128]
    return sorted(comp.head_dims)


def primary_head_dim(version: int, build=None) -> int:
    """128 (Llama's head dim) where built, else the smallest built (a slice of `full`)."""
    dims = built_head_dims(version, build)
    return 128 if 128 in dims else (dims[0] if dims else 128)


def smoke_calls(build=None) -> List[Tuple[int, int, str]]:
    """(version, head dim, dtype) of the smoke check's calls: one per FA version the wheel
    built, at a head dim and 16-bit dtype that version built (smoke_check.py)."""
    calls = []
    for version in (2, 3):
        comp = component(version, build)
        if comp is None or not comp.built:
            continue
        dtypes = built_dtypes(version, build=build)
        if not dtypes or not comp.head_dims:
            continue  # nothing 16-bit to call (the build refuses such a selection anyway)
        calls.append((version, primary_head_dim(version, build), dtypes[0]))
    return calls


# FA2's sparse kernels exist for head dim 128 only (upstream instantiates no other).
SPARSE_HEAD_DIM = 128


def sparse_refusal_fragments(build=None) -> List[str]:
    """What the refusal of a sparse call must say on a wheel without usable sparse kernels:
    the cause this wheel has (the 'sparse' feature left out, or head dim 128 left out of
    the FA2 selection) and the knob that fixes it. Empty when the wheel has them."""
    comp = component(2, build)
    if comp is None:
        return []
    if "sparse" not in comp.features:
        return ["'sparse' kernels", "VFA_FA2_FEATURES=sparse"]
    if SPARSE_HEAD_DIM not in comp.head_dims:
        built = ", ".join(str(d) for d in sorted(comp.head_dims)) or "none"
        return [f"head dim {SPARSE_HEAD_DIM} only", f"FA2 head dims built: {built}",
                f"{SPARSE_HEAD_DIM} in VFA_FA2_HEAD_DIMS"]
    return []


# FA3's kernels for a V head dim different from the Q/K one, as upstream instantiates them
# (hopper/instantiations/flash_fwd_hdim{64_256,64_512,192_128}_*_sm90.cu; no FP8 for the
# 64 ones): (Q/K head dim, V head dim) -> dtypes. The build compiles a pair with its Q/K
# head dim when 'hdimdiff' is among the FA3 features (cmake/KernelSelection.cmake);
# tests/unit/test_gpu_expectations.py holds this table against that rule for every slice.
HDIMDIFF_KERNELS = {(192, 128): ("bf16", "fp16", "e4m3"), (64, 256): SIXTEEN_BIT, (64, 512): SIXTEEN_BIT}


def hdimdiff_unbuilt(head_dim: int, head_dim_v: int, dtype: str, build=None) -> Optional[Tuple[str, str]]:
    """(why, what the refusal says) when this wheel's build info has no FA3 kernel for Q/K
    ``head_dim`` with V ``head_dim_v`` in ``dtype``; None when it lists that kernel."""
    comp = component(3, build)
    if comp is None:
        return "no build info", ""
    if not comp.built:
        return f"this wheel was built without FA3: {comp.reason}", ""
    if dtype not in HDIMDIFF_KERNELS[(head_dim, head_dim_v)]:
        return f"upstream has no {dtype} kernel for Q/K {head_dim} with V {head_dim_v}", "head size"
    if dtype not in comp.dtypes:
        return (f"the build info lists FA3 dtypes {', '.join(comp.dtypes)}, not {dtype}",
                "no FA3 kernels for")
    if head_dim not in comp.head_dims:
        dims = ", ".join(str(d) for d in sorted(comp.head_dims))
        return (f"the build info lists FA3 head dims {dims}: the {head_dim}/{head_dim_v} kernels "
                f"come with head dim {head_dim}", "head size")
    if "hdimdiff" not in comp.features:
        return (f"the build info lists FA3 features {', '.join(comp.features) or 'none'}, "
                "not 'hdimdiff'", "'hdimdiff'")
    return None


# --- one call per compiled kernel file (test_kernel_files_gpu.py) -----------------------
# Upstream compiles a (head dims, dtype) pair's kernels into several files and picks one from
# the call. The other suites test scenarios at one head dim (128, else the smallest built);
# these calls reach every file of every head dim and dtype the build info lists, so that each
# translation unit runs in a passing test (tests/gpu/kernel_coverage.py checks it per unit
# from the kernels the tests launched).

@dataclass(frozen=True)
class CallShape:
    """A call that upstream's dispatch sends to one kernel file of a (head dims, dtype)."""

    name: str
    heads: Tuple[int, int]  # (q heads, KV heads)
    page_size: Optional[int]  # None: packed K/V
    num_splits: int  # 0: upstream's heuristic
    softcap: float
    causal: bool


# FA3 (hopper/flash_api.cpp): the file is chosen by paged K/V without TMA (page 16: not a
# multiple of the 128-wide K block), split-KV (num_splits > 1), softcap and PackGQA. PackGQA
# is forced by paged-without-TMA and by split; otherwise a varlen call packs when q heads
# differ from KV heads. With FLASHATTENTION_PACKGQA_ONLY (what the build defines) equal head
# dims have only PackGQA files; the hdimdiff pairs also have files without it.
FA3_CALL_SHAPES = (
    CallShape("mha", (8, 8), None, 1, 0.0, False),
    CallShape("gqa", (16, 4), None, 1, 0.0, True),
    CallShape("mha-softcap", (8, 8), None, 1, 15.0, True),
    CallShape("gqa-softcap", (16, 4), None, 1, 15.0, False),
    CallShape("split", (16, 4), None, 3, 0.0, True),
    CallShape("split-softcap", (16, 4), None, 3, 15.0, False),
    CallShape("paged", (16, 4), 16, 1, 0.0, True),
    CallShape("paged-softcap", (16, 4), 16, 1, 15.0, True),
    CallShape("paged-split", (16, 4), 16, 3, 0.0, False),
    CallShape("paged-split-softcap", (16, 4), 16, 3, 15.0, True),
)
# FA2 (csrc/flash_attn/flash_api.cpp, mha_varlen_fwd): packed K/V runs the flash_fwd files;
# paged K/V always runs a split-KV kernel: with num_splits=1 the split_align files (the
# unsplit kernel's block size, for the same numerics), else the split ones (FA2 takes no
# num_splits > 1 on a varlen paged call: upstream refuses it, and so does the package).
# Causal has files of its own (a chunked batch has more than one query token per call;
# upstream drops causal when every sequence has one).
FA2_CALL_SHAPES = (
    CallShape("packed", (16, 4), None, 0, 0.0, False),
    CallShape("packed-causal", (16, 4), None, 0, 0.0, True),
    CallShape("paged-split", (16, 4), 16, 0, 0.0, False),
    CallShape("paged-split-causal", (16, 4), 16, 0, 0.0, True),
    CallShape("paged-align", (16, 4), 16, 1, 0.0, False),
    CallShape("paged-align-causal", (16, 4), 16, 1, 0.0, True),
)
CALL_SHAPES = {2: FA2_CALL_SHAPES, 3: FA3_CALL_SHAPES}


def kernel_sets(version: int, build=None) -> List[Tuple[int, int, str]]:
    """(Q/K head dim, V head dim, dtype) of each kernel set the build info lists for
    FA``version``: every built head dim with itself and, for FA3, the hdimdiff pairs."""
    comp = component(version, build)
    if comp is None or not comp.built:
        return []
    dtypes = [d for d in TORCH_DTYPES if d in comp.dtypes]
    sets = [(d, d, t) for d in sorted(comp.head_dims) for t in dtypes]
    if version == 3:
        sets += [(d, dv, t) for (d, dv), allowed in HDIMDIFF_KERNELS.items() for t in allowed
                 if hdimdiff_unbuilt(d, dv, t, build) is None]
    return sets


def kernel_file(version: int, head_dim: int, head_dim_v: int, dtype: str, shape: CallShape) -> str:
    """The upstream file whose kernel a call of this shape runs (see the rules above)."""
    if version == 2:
        kind = ("split_align_" if shape.num_splits == 1 else "split_") if shape.page_size else ""
        return f"flash_fwd_{kind}hdim{head_dim}_{dtype}{'_causal' if shape.causal else ''}_sm80.cu"
    parts = [name for name, on in (("paged", shape.page_size), ("split", shape.num_splits > 1),
                                   ("softcap", shape.softcap > 0)) if on]
    # PackGQA forced by paged or split is not in those files' names.
    if shape.page_size is None and shape.num_splits <= 1 and (
            shape.heads[0] != shape.heads[1] or head_dim == head_dim_v):
        parts.append("packgqa")
    dims = f"{head_dim}" if head_dim == head_dim_v else f"{head_dim}_{head_dim_v}"
    return f"flash_fwd_hdim{dims}_{dtype}_{''.join(p + '_' for p in parts)}sm90.cu"


def has_feature(feature: str, build=None) -> bool:
    comp = component(3, build)
    return comp is not None and feature in comp.features


def fa3_has_fp8() -> bool:
    comp = component(3)
    return comp is not None and comp.built and "e4m3" in comp.dtypes


# --- availability (run time) ------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def gpu_skip_reason() -> Optional[str]:
    """Why no GPU test can run here; None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU: torch.cuda.is_available() is False"
    try:
        import vendored_flash_attn
        from vendored_flash_attn.declaration.build_info import load_build_info
    except Exception as exc:  # pragma: no cover - package broken
        return f"vendored_flash_attn does not import: {type(exc).__name__}: {exc}"
    try:
        load_build_info()
    except Exception as exc:
        where = getattr(vendored_flash_attn, "__file__", "?")
        return (f"vendored_flash_attn imported from {where} has no build info ({exc}); install the "
                "built wheel and run pytest with `-o pythonpath=` so the source tree does not "
                "shadow it")
    reasons = [version_skip_reason(v, check_gpu=False) for v in (2, 3)]
    if all(reasons):
        return "neither compiled module is usable: " + "; ".join(reasons)
    return None


@functools.lru_cache(maxsize=None)
def version_skip_reason(version: int, check_gpu: bool = True) -> Optional[str]:
    """Why FA``version`` cannot run here; None when it can."""
    if check_gpu:
        reason = gpu_skip_reason()
        if reason:
            return reason
    from vendored_flash_attn.selection.environment import current_environment

    comp = component(version)
    if comp is None:
        return "no build info"
    if not comp.built:
        return f"this wheel was built without FA{version}" + (f": {comp.reason}" if comp.reason else "")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"FlashAttention needs compute capability 8.0+, this GPU is {major}.{minor}"
    if version == 3 and major != 9:
        return f"FA3 needs a Hopper GPU (sm_90), this GPU is {major}.{minor}"
    error = current_environment().load_module(version)
    if error is not None:
        return f"the FA{version} module {comp.module} failed to import: {error}"
    return None


def require(version: int) -> None:
    reason = version_skip_reason(version)
    if reason:
        pytest.skip(f"FA{version} not usable: {reason}")


def require_fp8() -> None:
    require(3)
    if not fa3_has_fp8():
        pytest.skip("this wheel has no FA3 e4m3 kernels")


# --- random inputs ----------------------------------------------------------------------

class Rand:
    """Fresh random numbers for one test, seeded from its node id (reproducible per test)."""

    def __init__(self, key: str):
        self.seed = zlib.crc32(key.encode())
        self.py = random.Random(self.seed)
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(self.seed)

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device="cuda", dtype=torch.float32)

    def rand(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen, device="cuda", dtype=torch.float32)

    def loguniform(self, lo: float, hi: float, *shape) -> torch.Tensor:
        return torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * self.rand(*shape))

    def randperm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen, device="cuda")

    def activations(self, tokens: int, heads: int, dim: int, bias: bool = False,
                    scale: float = 1.0) -> torch.Tensor:
        """Not N(0, 1): every head has its own scale (0.5x - 2x), optionally its own mean."""
        x = self.randn(tokens, heads, dim) * self.loguniform(0.5, 2.0, 1, heads, 1) * scale
        if bias:
            x = x + (self.rand(1, heads, dim) - 0.5)
        return x


# Sequence length mixes; every one has a length-1 sequence and odd lengths.
def prefill_lengths(r: Rand) -> Tuple[List[int], List[int]]:
    """Self-attention prefill: q and k lengths equal."""
    lens = [1, r.py.randint(2, 63), r.py.randint(100, 400), r.py.randint(500, 1100),
            r.py.randint(1, 1100)]
    r.py.shuffle(lens)
    return lens, list(lens)


def chunked_lengths(r: Rand, batch: int = 6, max_k: int = 1200) -> Tuple[List[int], List[int]]:
    """Chunked prefill mixed with decode: 1 <= q_len <= k_len."""
    q_lens = [1, 1, r.py.randint(2, 16), r.py.randint(17, 200), r.py.randint(200, 600)]
    q_lens += [r.py.randint(1, 300) for _ in range(batch - len(q_lens))]
    q_lens = q_lens[:batch]
    r.py.shuffle(q_lens)
    k_lens = [q + r.py.randint(0, max_k - q) for q in q_lens]
    return q_lens, k_lens


def decode_lengths(r: Rand, batch: int = 8, max_k: int = 1500) -> Tuple[List[int], List[int]]:
    k_lens = [1, r.py.randint(2, 40)] + [r.py.randint(1, max_k) for _ in range(batch - 2)]
    r.py.shuffle(k_lens)
    return [1] * batch, k_lens


def cu_seqlens(lens: Sequence[int]) -> torch.Tensor:
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device="cuda")


# --- problems -------------------------------------------------------------------------

GARBAGE_K = 8.0   # K/V values in cache slots no sequence uses: a leak shows as a large error
GARBAGE_V = 50.0


@dataclass
class Problem:
    """One batch: kernel inputs plus the per-sequence float32 values the reference uses."""

    dtype: str
    num_heads: int
    num_heads_k: int
    head_dim: int
    q_lens: List[int]
    k_lens: List[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: Optional[torch.Tensor]
    seqused_k: Optional[torch.Tensor]
    block_table: Optional[torch.Tensor]
    q_ref: List[torch.Tensor]
    k_ref: List[torch.Tensor]
    v_ref: List[torch.Tensor]
    page_size: Optional[int] = None
    descales: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    notes: dict = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_seqlen_k(self) -> int:
        return max(self.k_lens)

    @property
    def out_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "e4m3" else TORCH_DTYPES[self.dtype]

    def kwargs(self) -> dict:
        """The arguments of flash_attn_varlen_func for this problem (no options)."""
        kw = dict(q=self.q, k=self.k, v=self.v, max_seqlen_q=self.max_seqlen_q,
                  cu_seqlens_q=self.cu_seqlens_q, max_seqlen_k=self.max_seqlen_k,
                  cu_seqlens_k=self.cu_seqlens_k, seqused_k=self.seqused_k,
                  block_table=self.block_table)
        if self.descales is not None:
            kw.update(q_descale=self.descales[0], k_descale=self.descales[1],
                      v_descale=self.descales[2])
        return kw


def descale_tensors(r: Rand, batch: int, heads_k: int, kind: str):
    """(q, k, v) descales of shape (batch, heads_k) in the layout ``kind`` names.

    Values are log-uniform in [0.25, 4], so two (sequence, head) entries typically differ by
    a factor of 2 or more and a descale applied to the wrong head or sequence is an error
    of order 1.

    per_seq_head: contiguous, every (sequence, KV head) its own value;
    strided: the same kind of values through a non-contiguous view (strides (2, 2*batch));
    scalar: one value each, expanded with stride 0 (what make_fp8_descales gives);
    reuse_k: per-KV-head k/v scales expanded over sequences, q reusing k's (no q scale in
      the checkpoint), through make_fp8_descales.
    """
    lo, hi = 0.25, 4.0
    if kind == "per_seq_head":
        return tuple(r.loguniform(lo, hi, batch, heads_k) for _ in range(3))
    if kind == "strided":
        out = []
        for _ in range(3):
            base = r.loguniform(lo, hi, heads_k, 2 * batch)
            view = base[:, ::2].t()
            assert view.shape == (batch, heads_k) and not view.is_contiguous()
            out.append(view)
        return tuple(out)
    if kind == "scalar":
        out = tuple(r.loguniform(lo, hi, 1, 1).expand(batch, heads_k) for _ in range(3))
        assert all(d.stride(0) == 0 and (heads_k == 1 or d.stride(1) == 0) for d in out)
        return out
    if kind == "reuse_k":
        from vendored_flash_attn import make_fp8_descales

        k_scale = r.loguniform(lo, hi, heads_k)
        v_scale = r.loguniform(lo, hi, heads_k)
        return make_fp8_descales(None, k_scale, v_scale, batch, heads_k)
    raise ValueError(kind)


def _to_kernel(dtype: str, real: torch.Tensor, descale_row: Optional[torch.Tensor]):
    """(kernel tensor, float32 values the kernel computes with).

    16-bit: the real values rounded to the dtype. FP8: quantised with the per-head descale
    (``real / descale`` to e4m3, as a checkpoint's scale does); the reference then uses
    ``fp8.float() * descale``, exactly what FA3 computes with."""
    if dtype != "e4m3":
        x = real.to(TORCH_DTYPES[dtype])
        return x, x.float()
    d = descale_row.view(1, -1, 1)
    raw = (real / d).to(torch.float8_e4m3fn)
    return raw, raw.float() * d


def make_problem(r: Rand, *, dtype: str, num_heads: int, num_heads_k: int, head_dim: int,
                 q_lens: Sequence[int], k_lens: Sequence[int], page_size: Optional[int] = None,
                 descale_kind: str = "per_seq_head", q_scale: float = 1.0,
                 head_dim_v: Optional[int] = None) -> Problem:
    """Packed K/V with cu_seqlens_k (page_size None) or a paged cache with a shuffled
    block_table + seqused_k. K/V slots no sequence uses hold large finite garbage.
    ``head_dim_v``: V's head dim where it differs from Q/K's (FA3's hdimdiff kernels)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    q_lens, k_lens = list(q_lens), list(k_lens)
    batch = len(q_lens)
    assert len(k_lens) == batch and all(1 <= q <= k for q, k in zip(q_lens, k_lens, strict=True))
    assert num_heads % num_heads_k == 0
    group = num_heads // num_heads_k
    descales = None
    if dtype == "e4m3":
        descales = descale_tensors(r, batch, num_heads_k, descale_kind)
    qs, q_ref, ks, k_ref, vs, v_ref = [], [], [], [], [], []
    for b in range(batch):
        def row(i, g=1, b=b):
            return descales[i][b].repeat_interleave(g) if descales else None

        t, ref = _to_kernel(dtype, r.activations(q_lens[b], num_heads, head_dim, scale=q_scale),
                            row(0, group))
        qs.append(t)
        q_ref.append(ref)
        t, ref = _to_kernel(dtype, r.activations(k_lens[b], num_heads_k, head_dim), row(1))
        ks.append(t)
        k_ref.append(ref)
        t, ref = _to_kernel(dtype, r.activations(k_lens[b], num_heads_k, head_dim_v, bias=True), row(2))
        vs.append(t)
        v_ref.append(ref)
    torch_dtype = TORCH_DTYPES[dtype]

    def garbage(shape, value):
        return torch.full(shape, value, dtype=torch.float32, device="cuda").to(torch_dtype)

    if page_size is None:
        pad = 16  # rows after the last sequence: inside k, outside every sequence
        k = torch.cat(ks + [garbage((pad, num_heads_k, head_dim), GARBAGE_K)])
        v = torch.cat(vs + [garbage((pad, num_heads_k, head_dim_v), GARBAGE_V)])
        cu_k, seqused_k, block_table = cu_seqlens(k_lens), None, None
    else:
        blocks_per_seq = [math.ceil(n / page_size) for n in k_lens]
        max_blocks = max(blocks_per_seq) + 1  # one spare column, like a cache sized for more
        num_blocks = sum(blocks_per_seq) + 7  # spare blocks no sequence owns
        k = garbage((num_blocks, page_size, num_heads_k, head_dim), GARBAGE_K)
        v = garbage((num_blocks, page_size, num_heads_k, head_dim_v), GARBAGE_V)
        perm = r.randperm(num_blocks).tolist()
        rows = []
        used = 0
        for b, nb in enumerate(blocks_per_seq):
            ids = perm[used:used + nb]
            used += nb
            # Columns past the sequence's last block: valid ids of blocks it does not own.
            rows.append(ids + [perm[(used + j) % num_blocks] for j in range(max_blocks - nb)])
            for j, block in enumerate(ids):
                lo, hi = j * page_size, min((j + 1) * page_size, k_lens[b])
                k[block, :hi - lo] = ks[b][lo:hi]  # the tail of a last page keeps its garbage
                v[block, :hi - lo] = vs[b][lo:hi]
        block_table = torch.tensor(rows, dtype=torch.int32, device="cuda")
        cu_k, seqused_k = None, torch.tensor(k_lens, dtype=torch.int32, device="cuda")
    return Problem(dtype=dtype, num_heads=num_heads, num_heads_k=num_heads_k, head_dim=head_dim,
                   q_lens=q_lens, k_lens=k_lens, q=torch.cat(qs), k=k, v=v,
                   cu_seqlens_q=cu_seqlens(q_lens), cu_seqlens_k=cu_k, seqused_k=seqused_k,
                   block_table=block_table, q_ref=q_ref, k_ref=k_ref, v_ref=v_ref,
                   page_size=page_size, descales=descales)


# --- calls and checks -------------------------------------------------------------------

def poison_allocator(*shapes_dtypes) -> None:
    """Hand the caching allocator NaN-filled blocks of the sizes the call will allocate, so
    an output the kernel leaves unwritten shows up as NaN instead of as stale zeros."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda")
              for shape, dtype in shapes_dtypes]
    del blocks


def run_attention(p: Problem, *, version: Optional[int], causal: bool = False,
                  window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                  num_splits: int = 0, use_out: bool = True, lse: bool = True, **extra):
    """Call flash_attn_varlen_func with a NaN-poisoned out= buffer (or a poisoned allocator)
    and check that every output element was written. Returns (out, lse or None)."""
    from vendored_flash_attn import flash_attn_varlen_func

    shape = (p.total_q, p.num_heads, p.v.shape[-1])
    out = None
    if use_out:
        out = torch.full(shape, float("nan"), dtype=p.out_dtype, device="cuda")
    else:
        poison_allocator((shape, p.out_dtype), ((p.num_heads, p.total_q), torch.float32))
    result = flash_attn_varlen_func(
        **p.kwargs(), causal=causal, window_size=window, softcap=softcap, num_splits=num_splits,
        out=out, return_softmax_lse=lse, fa_version=version, **extra)
    got, got_lse = result if lse else (result, None)
    assert got.shape == shape and got.dtype == p.out_dtype, (got.shape, got.dtype)
    if use_out:
        assert got.data_ptr() == out.data_ptr(), "the result is not the out= buffer"
    assert torch.isfinite(got).all(), (
        f"{int((~torch.isfinite(got)).sum())} output elements are NaN/Inf: not written")
    if got_lse is not None:
        assert got_lse.shape == (p.num_heads, p.total_q), (
            f"LSE shape {tuple(got_lse.shape)}, expected (num_heads, total_q) = "
            f"{(p.num_heads, p.total_q)}")
        assert got_lse.dtype == torch.float32
    torch.cuda.synchronize()
    return got, got_lse


def reference(p: Problem, *, causal: bool = False, window=None, softcap: float = 0.0):
    return attention_ref(p.q_ref, p.k_ref, p.v_ref, causal=causal, window=window, softcap=softcap)


# Errors measured in this session, printed at the end by conftest.py.
MEASURED: List[Tuple[str, str, float, Optional[float]]] = []


def check(p: Problem, out: torch.Tensor, lse: Optional[torch.Tensor], ref_out: torch.Tensor,
          ref_lse: torch.Tensor, *, label: str, softcap: bool = False) -> float:
    tol = OUT_TOL[p.dtype] * (SOFTCAP_OUT_FACTOR if softcap else 1.0)
    err = relative_l2(out, ref_out)
    lse_err = None
    if lse is not None:
        seen = torch.isfinite(ref_lse)  # rows that see at least one key
        assert torch.isfinite(lse[seen]).all(), "LSE is not finite on rows that see keys"
        lse_err = (lse[seen] - ref_lse[seen]).abs().max().item() if seen.any() else 0.0
    MEASURED.append((label, p.dtype, err, lse_err))
    assert err <= tol, f"{label}: relative L2 error {err:.3e} > tolerance {tol:.0e} ({p.dtype})"
    if lse_err is not None:
        lse_tol = SOFTCAP_LSE_TOL if softcap else LSE_TOL[p.dtype]
        assert lse_err <= lse_tol, f"{label}: LSE max abs error {lse_err:.3e} > {lse_tol:.0e}"
    return err


def expect_refused(call, fragment: str):
    """Run ``call``; it must raise a FlashAttention input error whose message has ``fragment``."""
    from vendored_flash_attn import FlashAttnInputError

    with pytest.raises(FlashAttnInputError) as info:
        call()
    assert fragment.lower() in str(info.value).lower(), str(info.value)
    torch.cuda.synchronize()
    return str(info.value)


def fa3_missing_feature(version: int, opts: dict, build=None):
    """The FA3 feature this call needs and the wheel (or ``build``) lacks (None: nothing missing)."""
    if version != 3:
        return None
    # Same order as validation.py checks them, so the refusal names the same feature.
    if opts.get("paged") and not has_feature("paged", build):
        return "paged"
    if opts.get("softcap", 0.0) > 0 and not has_feature("softcap", build):
        return "softcap"
    window = opts.get("window") or (-1, -1)
    left, right = window
    if opts.get("causal"):
        right = 0
    if (left >= 0 or right >= 0) and not (left < 0 and right == 0) and not has_feature("local", build):
        return "local"
    if opts.get("num_splits", 0) > 1 and not has_feature("split", build):
        return "split"
    return None


def run_checked(p, version, label, **opts):
    """Run and compare with the reference, or, when FA3 lacks a needed feature, check the
    call is refused and skip with that reason."""
    missing = fa3_missing_feature(version, dict(opts, paged=p.block_table is not None))
    if missing:
        message = expect_refused(lambda: run_attention(p, version=version, **opts), f"'{missing}'")
        pytest.skip(f"this wheel has no FA3 '{missing}' kernels; checked that the call is "
                    f"refused: {message}")
    out, lse = run_attention(p, version=version, **opts)
    ref_out, ref_lse = reference(p, causal=opts.get("causal", False), window=opts.get("window"),
                                 softcap=opts.get("softcap", 0.0))
    check(p, out, lse, ref_out, ref_lse, label=label, softcap=opts.get("softcap", 0.0) > 0)
    return out, lse
