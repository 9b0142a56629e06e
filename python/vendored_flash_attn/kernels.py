"""Which kernels this wheel holds: head-dim routing, dtypes and features per version.

These mirror how upstream's C++ picks a kernel (FA2 ``HEADDIM_SWITCH``, FA3
``round_up_headdim`` and the hdim-diff rules of ``mha_fwd``), checked against the
build info instead of compile-time defines, so a call the wheel cannot serve is
refused in Python with a message, never at dispatch. Every function returns ``None``
when fine, or a message saying what is missing and how to get it.
"""

from __future__ import annotations

from typing import Optional

from .build_info import ComponentInfo
from .declaration import FA2_HEAD_DIMS, FA3_HEAD_DIMS

# The head dims upstream instantiates, as cmake/knobs.json declares them.
FA2_HEAD_DIM_BUCKETS = FA2_HEAD_DIMS
FA3_HEAD_DIM_BUCKETS = FA3_HEAD_DIMS
FA2_DTYPES = ("bf16", "fp16")
FA3_DTYPES = ("bf16", "fp16", "e4m3")

# FA3 feature names in build_info.json, and what a user calls them.
FEATURE_WORDS = {
    "paged": "a paged KV cache (block_table)",
    "split": "split-KV (num_splits > 1)",
    "softcap": "softcap > 0",
    "local": "sliding-window (local) attention",
    "hdimdiff": "a V head size different from the Q/K head size",
}


def dtype_name(dtype) -> Optional[str]:
    """The build-info name of a torch dtype ("bf16", "fp16", "e4m3"), or None."""
    import torch

    return {
        torch.bfloat16: "bf16",
        torch.float16: "fp16",
        torch.float8_e4m3fn: "e4m3",
    }.get(dtype)


def _rebuild_hint(version: int, what: str) -> str:
    knob = "VFA_FA2_HEAD_DIMS" if (version == 2 and what == "head dims") else None
    hint = "rebuild the wheel with VFA_PRESET=full"
    if knob:
        hint += f" (or list the head dims you need in {knob})"
    return hint


def fa2_bucket(head_size: int) -> Optional[int]:
    """The FA2 kernel head dim that serves ``head_size`` (upstream HEADDIM_SWITCH)."""
    for bucket in FA2_HEAD_DIM_BUCKETS:
        if head_size <= bucket:
            return bucket
    return None


def fa3_bucket(head_size: int, built: tuple[int, ...]) -> Optional[int]:
    """The FA3 kernel head dim for ``head_size``; disabled dims are skipped like upstream."""
    for bucket in FA3_HEAD_DIM_BUCKETS:
        if bucket in built and head_size <= bucket:
            return bucket
    return None


def head_size_problem(
    version: int, info: ComponentInfo, head_size: int, head_size_v: Optional[int] = None,
    dtype: Optional[str] = None,
) -> Optional[str]:
    """Why this wheel cannot run ``head_size`` (and ``head_size_v``) with ``version``."""
    head_size_v = head_size if head_size_v is None else head_size_v
    built = tuple(sorted(info.head_dims))
    if version == 2:
        if head_size_v != head_size:
            return (f"FA2 needs the same head size for V as for Q/K (got {head_size} and "
                    f"{head_size_v}); different V head sizes need FA3 on Hopper")
        if head_size <= 0 or head_size % 8 or head_size > 256:
            return (f"FA2 supports head sizes that are multiples of 8 up to 256, got {head_size}; "
                    "pad the head dimension to a multiple of 8")
        bucket = fa2_bucket(head_size)
        if bucket not in built:
            return (f"head size {head_size} needs the FA2 hdim{bucket} kernels, which this wheel "
                    f"does not contain (FA2 head dims built: {_dims(built)}); "
                    + _rebuild_hint(2, "head dims"))
        return None
    if version != 3:
        raise ValueError(f"FlashAttention version must be 2 or 3, got {version!r}")
    alignment = 16 if dtype == "e4m3" else 8
    if head_size <= 0 or head_size % alignment or head_size_v <= 0 or head_size_v % alignment:
        return (f"FA3 supports head sizes that are multiples of {alignment}"
                f"{' for FP8' if alignment == 16 else ''}, got {head_size}"
                + (f" (V: {head_size_v})" if head_size_v != head_size else ""))
    if not built or head_size > max(built):
        return (f"head size {head_size} is larger than the largest FA3 head dim in this wheel "
                f"({_dims(built)}); " + _rebuild_hint(3, "head dims"))
    bucket = fa3_bucket(head_size, built)
    if head_size_v == head_size:
        return None
    # Different V head size: upstream's rules in mha_fwd, plus the kernels that exist
    # (64x256, 64x512, 192x128 for 16-bit; only 192x128 for FP8).
    if "hdimdiff" not in info.features:
        return (f"V head size {head_size_v} differs from Q/K head size {head_size}, which needs "
                "the FA3 'hdimdiff' kernels; this wheel was built without them; "
                + _rebuild_hint(3, "features"))
    if bucket == 192 and 128 < head_size <= 192 and 96 < head_size_v <= 128:
        return None
    if bucket == 64 and head_size <= 64 and 64 < head_size_v <= 512 and dtype != "e4m3":
        return None
    return (f"FA3 supports a V head size different from Q/K only for Q/K in (128, 192] with V in "
            f"(96, 128], or (16-bit only) Q/K <= 64 with V in (64, 512]; got Q/K {head_size}, "
            f"V {head_size_v}")


def dtype_problem(version: int, info: ComponentInfo, dtype: Optional[str], shown: str = "") -> Optional[str]:
    """Why this wheel cannot run ``dtype`` (a build-info name) with ``version``."""
    shown = shown or _torch_names([str(dtype)])[0]
    supported = FA2_DTYPES if version == 2 else FA3_DTYPES
    if dtype not in supported:
        extra = "; FP8 (float8_e4m3fn) needs FA3 on a Hopper GPU" if (version == 2 and dtype == "e4m3") else ""
        return (f"FA{version} supports dtypes {', '.join(_torch_names(supported))}, got {shown}{extra}")
    if dtype not in info.dtypes:
        return (f"this wheel has no FA{version} kernels for {shown} (FA{version} dtypes built: "
                f"{', '.join(_torch_names(info.dtypes)) or 'none'}); " + _rebuild_hint(version, "dtypes"))
    return None


def feature_problem(info: ComponentInfo, feature: str) -> Optional[str]:
    """Why this wheel's FA3 cannot do ``feature`` (a build-info feature name)."""
    if feature in info.features:
        return None
    return (f"{FEATURE_WORDS.get(feature, feature)} needs the FA3 '{feature}' kernels, which this "
            f"wheel was built without (FA3 features built: {', '.join(info.features) or 'none'}); "
            + _rebuild_hint(3, "features") + ", or pass fa_version=2")


# FA2's sparse kernels exist for head dim 128 only (run_mha_fwd_sparse checks
# params.d == 128; upstream ships no other instantiation), in the FA2 dtypes built.
SPARSE_HEAD_DIM = 128


def sparse_problem(info: ComponentInfo, head_size: Optional[int] = None) -> Optional[str]:
    """Why this wheel's FA2 cannot run sparse attention (with ``head_size``, when given)."""
    if "sparse" not in info.features:
        return ("sparse attention needs the FA2 'sparse' kernels, which this wheel was built "
                f"without (FA2 features built: {', '.join(info.features) or 'none'}); rebuild "
                f"with VFA_FA2_FEATURES=sparse and head dim {SPARSE_HEAD_DIM} in VFA_FA2_HEAD_DIMS")
    if SPARSE_HEAD_DIM not in info.head_dims:
        return (f"the FA2 sparse kernels are built for head dim {SPARSE_HEAD_DIM} only, which this "
                f"wheel's FA2 selection left out (FA2 head dims built: {_dims(sorted(info.head_dims))}); "
                f"rebuild with {SPARSE_HEAD_DIM} in VFA_FA2_HEAD_DIMS")
    if head_size is not None and head_size != SPARSE_HEAD_DIM:
        return (f"the FA2 sparse kernels take head size {SPARSE_HEAD_DIM} only (upstream builds no "
                f"other), got {head_size}; use flash_attn_varlen_func for other head sizes")
    return None


def _dims(dims) -> str:
    return ", ".join(str(d) for d in dims) or "none"


def _torch_names(names) -> list[str]:
    table = {"bf16": "bfloat16", "fp16": "float16", "e4m3": "float8_e4m3fn"}
    return [table.get(n, n) for n in names]
