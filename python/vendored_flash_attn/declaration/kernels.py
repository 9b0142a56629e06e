"""Which kernels this wheel holds: head-dim routing, dtypes and features per family.

The dtypes and features a family can have come from its declaration (families.py); the
head-dim routing of a compiled family is its ``head_size_rule`` here. These mirror how upstream's C++ picks a kernel (FA2 ``HEADDIM_SWITCH``, FA3
``round_up_headdim`` and the hdim-diff rules of ``mha_fwd``), checked against the
build info instead of compile-time defines, so a call the wheel cannot serve is
refused in Python with a message, never at dispatch. Every function returns ``None``
when fine, or a message saying what is missing and how to get it.
"""

from __future__ import annotations

from typing import Optional

from .build_info import ComponentInfo
from .knob_values import FA2_HEAD_DIMS, FA3_HEAD_DIMS
from .families import Family, registry, titles_text

# The head dims upstream instantiates, as cmake/knobs.json declares them. Named per family on
# purpose: FA2's and FA3's C++ route a head size to a kernel in different ways (HEADDIM_SWITCH,
# round_up_headdim), and each routing below is that family's declared head_size_rule.
FA2_HEAD_DIM_BUCKETS = FA2_HEAD_DIMS
FA3_HEAD_DIM_BUCKETS = FA3_HEAD_DIMS
# Feature names in build_info.json (and the family declaration), and what a user calls them.
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


def _rebuild_hint(what: str, knob: Optional[str] = None) -> str:
    hint = "rebuild the wheel with VFA_PRESET=full"
    if knob:
        hint += f" (or list the {what} you need in {knob})"
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
    family: Family, info: Optional[ComponentInfo], head_size: int, head_size_v: Optional[int] = None,
    dtype: Optional[str] = None, generation: Optional[str] = None,
) -> Optional[str]:
    """Why this wheel cannot run ``head_size`` (and ``head_size_v``) with ``family``: its
    declared head-size rule (``head_size_rule``: the head-dim routing of a compiled family)
    and its declared head sizes per GPU generation (``call.head_sizes``); None when fine or
    when it declares neither. ``dtype``: the K/V dtype's build-info name, for the alignment;
    ``generation``: the GPU's (None: any generation the family runs on will do)."""
    head_size_v = head_size if head_size_v is None else head_size_v
    rule = family.head_size_function()
    problem = rule(family, info, head_size, head_size_v, dtype) if rule is not None else None
    if problem is None and family.call.head_sizes:
        problem = declared_head_size_problem(family, head_size, head_size_v, dtype, generation)
    return problem


_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1}
# (id of a family's call rules, head sizes, dtype, generation) -> (those rules, verdict): asked
# on every call of a family that declares head sizes (FA4), the same few questions each time.
# The entry holds the rules so that their id is not reused while it is in the table.
_HEAD_SIZE_VERDICTS: dict = {}


def declared_head_size_problem(family: Family, head_size: int, head_size_v: int, dtype: Optional[str],
                               generation: Optional[str]) -> Optional[str]:
    """The family's ``call.head_sizes`` for ``generation`` (None: the union of its
    generations; one without an entry: no rule, as upstream validates no head size there): a
    (Q/K, V) pair inside one of the declared ranges, both multiples of
    ``head_size_alignment_bytes`` of the K/V element."""
    rules = family.call
    key = (id(rules), head_size, head_size_v, dtype, generation)
    known = _HEAD_SIZE_VERDICTS.get(key)
    if known is not None and known[0] is rules:
        return known[1]
    verdict = _declared_head_size_verdict(family, head_size, head_size_v, dtype, generation)
    if len(_HEAD_SIZE_VERDICTS) > 4096:  # odd head sizes asked by a fuzzer: no unbounded growth
        _HEAD_SIZE_VERDICTS.clear()
    _HEAD_SIZE_VERDICTS[key] = (rules, verdict)
    return verdict


def _declared_head_size_verdict(family: Family, head_size: int, head_size_v: int, dtype: Optional[str],
                                generation: Optional[str]) -> Optional[str]:
    rules = family.call
    if generation is not None and generation not in rules.head_sizes:
        return None
    alignment = max(1, rules.head_size_alignment_bytes // _ELEMENT_BYTES.get(dtype or "", 2))
    tables = {generation: rules.head_sizes[generation]} if generation is not None else rules.head_sizes
    if not head_size % alignment and not head_size_v % alignment and any(
            lo <= head_size <= hi and lo_v <= head_size_v <= hi_v
            for entries in tables.values() for lo, hi, lo_v, hi_v in entries):
        return None

    def sizes(entries) -> str:
        return ", ".join((f"{lo}-{hi}" if lo < hi else f"{lo}") + " x " + (f"{lo_v}-{hi_v}" if lo_v < hi_v else f"{lo_v}")
                         for lo, hi, lo_v, hi_v in entries) or "none"

    where = "; ".join(f"on {gen}: {sizes(entries)}" for gen, entries in tables.items())
    got = f"{head_size}" if head_size == head_size_v else f"{head_size} x {head_size_v}"
    why = f" ({rules.head_sizes_why})" if rules.head_sizes_why else ""
    return (f"{family.title} takes head sizes (Q/K x V) {where}, multiples of {alignment}"
            f"{' for FP8' if alignment > 8 else ''}{why}; got {got}")


def fa2_head_size_problem(family: Family, info: ComponentInfo, head_size: int, head_size_v: int,
                          dtype: Optional[str]) -> Optional[str]:
    """FA2's head-dim routing (HEADDIM_SWITCH): one head size for Q/K and V, multiples of 8
    up to 256, each served by the next instantiated bucket."""
    del dtype  # every FA2 dtype has the same head dims
    built = tuple(sorted(info.head_dims))
    if head_size_v != head_size:
        return (f"{family.title} needs the same head size for V as for Q/K (got {head_size} and "
                f"{head_size_v}); different V head sizes need {titles_text(registry().having('hdimdiff'))} "
                "on Hopper")
    if head_size <= 0 or head_size % 8 or head_size > 256:
        return (f"{family.title} supports head sizes that are multiples of 8 up to 256, got {head_size}; "
                "pad the head dimension to a multiple of 8")
    bucket = fa2_bucket(head_size)
    if bucket not in built:
        return (f"head size {head_size} needs the {family.title} hdim{bucket} kernels, which this wheel "
                f"does not contain ({family.title} head dims built: {_dims(built)}); "
                + _rebuild_hint("head dims", family.head_dims_knob))
    return None


def fa3_head_size_problem(family: Family, info: ComponentInfo, head_size: int, head_size_v: int,
                          dtype: Optional[str]) -> Optional[str]:
    """FA3's head-dim routing (round_up_headdim, and mha_fwd's rules for a V head size
    other than Q/K's)."""
    built = tuple(sorted(info.head_dims))
    alignment = 16 if dtype == "e4m3" else 8
    if head_size <= 0 or head_size % alignment or head_size_v <= 0 or head_size_v % alignment:
        return (f"{family.title} supports head sizes that are multiples of {alignment}"
                f"{' for FP8' if alignment == 16 else ''}, got {head_size}"
                + (f" (V: {head_size_v})" if head_size_v != head_size else ""))
    if not built or head_size > max(built):
        return (f"head size {head_size} is larger than the largest {family.title} head dim in this wheel "
                f"({_dims(built)}); " + _rebuild_hint("head dims"))
    bucket = fa3_bucket(head_size, built)
    if head_size_v == head_size:
        return None
    # Different V head size: upstream's rules in mha_fwd, plus the kernels that exist
    # (64x256, 64x512, 192x128 for 16-bit; only 192x128 for FP8).
    if "hdimdiff" not in info.features:
        return (f"V head size {head_size_v} differs from Q/K head size {head_size}, which needs "
                f"the {family.title} 'hdimdiff' kernels; this wheel was built without them; "
                + _rebuild_hint("features"))
    if bucket == 192 and 128 < head_size <= 192 and 96 < head_size_v <= 128:
        return None
    if bucket == 64 and head_size <= 64 and 64 < head_size_v <= 512 and dtype != "e4m3":
        return None
    return (f"{family.title} supports a V head size different from Q/K only for Q/K in (128, 192] with V in "
            f"(96, 128], or (16-bit only) Q/K <= 64 with V in (64, 512]; got Q/K {head_size}, "
            f"V {head_size_v}")


def dtype_problem(family: Family, info: Optional[ComponentInfo], dtype: Optional[str],
                  shown: str = "") -> Optional[str]:
    """Why this wheel cannot run ``dtype`` (a build-info name) with ``family``: not one of
    its declared dtypes, or (a family whose build selects dtypes) not built."""
    shown = shown or _torch_names([str(dtype)])[0]
    if dtype not in family.dtypes:
        extra = ""
        if dtype == "e4m3":
            extra = f"; FP8 (float8_e4m3fn) needs {titles_text(registry().having('fp8'))} on a Hopper GPU"
        return (f"{family.title} supports dtypes {', '.join(_torch_names(family.dtypes))}, got {shown}{extra}")
    if family.dtypes_knob is not None and dtype not in info.dtypes:
        return (f"this wheel has no {family.title} kernels for {shown} ({family.title} dtypes built: "
                f"{', '.join(_torch_names(info.dtypes)) or 'none'}); " + _rebuild_hint("dtypes"))
    return None


def feature_problem(family: Family, info: Optional[ComponentInfo], feature: str) -> Optional[str]:
    """Why this wheel's ``family`` cannot do ``feature`` (a build-info feature name): a
    feature its build selects (``features_knob``) and this build left out."""
    if feature not in family.selectable_features or feature in info.features:
        return None
    fallback = registry().by_name(family.fallback) if family.fallback else None
    return (f"{FEATURE_WORDS.get(feature, feature)} needs the {family.title} '{feature}' kernels, which this "
            f"wheel was built without ({family.title} features built: {', '.join(info.features) or 'none'}); "
            + _rebuild_hint("features") + (f", or pass fa_version={fallback.version}" if fallback else ""))


# The sparse kernels (FA2's at the pin) exist for head dim 128 only (run_mha_fwd_sparse checks
# params.d == 128; upstream ships no other instantiation), in the dtypes built.
SPARSE_HEAD_DIM = 128


def sparse_problem(family: Family, info: ComponentInfo, head_size: Optional[int] = None) -> Optional[str]:
    """Why this wheel's ``family`` (the one declaring the sparse kernels) cannot run sparse
    attention (with ``head_size``, when given)."""
    title = family.title
    if "sparse" not in info.features:
        return (f"sparse attention needs the {title} 'sparse' kernels, which this wheel was built "
                f"without ({title} features built: {', '.join(info.features) or 'none'}); rebuild "
                f"with {family.features_knob}=sparse and head dim {SPARSE_HEAD_DIM} in {family.head_dims_knob}")
    if SPARSE_HEAD_DIM not in info.head_dims:
        return (f"the {title} sparse kernels are built for head dim {SPARSE_HEAD_DIM} only, which this "
                f"wheel's {title} selection left out ({title} head dims built: {_dims(sorted(info.head_dims))}); "
                f"rebuild with {SPARSE_HEAD_DIM} in {family.head_dims_knob}")
    if head_size is not None and head_size != SPARSE_HEAD_DIM:
        return (f"the {title} sparse kernels take head size {SPARSE_HEAD_DIM} only (upstream builds no "
                f"other), got {head_size}; use flash_attn_varlen_func for other head sizes")
    return None


def _dims(dims) -> str:
    return ", ".join(str(d) for d in dims) or "none"


def _torch_names(names) -> list[str]:
    table = {"bf16": "bfloat16", "fp16": "float16", "e4m3": "float8_e4m3fn"}
    return [table.get(n, n) for n in names]
