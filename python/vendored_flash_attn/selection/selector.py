"""Runtime choice of a kernel family (FA2, FA3, FA4: families.py, declared in cmake/knobs.json).

Rules (docs/runtime.md), all read from the family declaration: by default the first
family of ``default_order`` that is the default on the GPU's generation and is usable
(FA3 on Hopper when built and loadable, FA4 on Blackwell when installed, FA2 on 8.0+);
``VLLM_FLASH_ATTN_VERSION`` (one of the declared versions) overrides; a request a family
cannot serve (a GPU it does not run on, ALiBi, a head size or dtype not built, a feature
its kernels lack) falls back to its declared fallback with one warning per distinct
reason; ``None`` with a reason when nothing is usable. Plain queries never raise, except for an invalid ``VLLM_FLASH_ATTN_VERSION``,
which is a configuration error.

The helpers vLLM's attention backends call (``flash_attn_supports_sinks``,
``flash_attn_supports_mla``, ``flash_attn_supports_quant_query_input``,
``is_flash_attn_varlen_func_available``) answer from the same rules: what this wheel
and this GPU can run, not what the platform could in general.
"""

from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass
from typing import Iterable, Optional

from ..declaration.build_info import BuildInfoMissing
from .environment import current_environment, environment_generation, on_environment_change
from ..errors import FlashAttnFallbackWarning
from ..declaration.families import Family, registry, titles_text
from ..declaration.kernels import FEATURE_WORDS, dtype_name, dtype_problem, head_size_problem

ENV_VAR = "VLLM_FLASH_ATTN_VERSION"


@dataclass(frozen=True)
class Selection:
    """A selector answer: the version (None: nothing usable), why, and any fallbacks taken."""

    version: Optional[int]
    reason: str
    fallbacks: tuple[str, ...] = ()
    # The reason's notes on the families passed over (each also in ``reason``, after its
    # headline): why one that runs here is not the default, why one is unusable.
    notes: tuple[str, ...] = ()

    @property
    def headline(self) -> str:
        """The reason without its notes: which family, and why, in a few words."""
        suffix = "; " + "; ".join(self.notes)
        return self.reason[:-len(suffix)] if self.notes and self.reason.endswith(suffix) else self.reason


def requested_version() -> Optional[int]:
    """The version forced by VLLM_FLASH_ATTN_VERSION, None when unset or empty."""
    raw = current_environment().getenv(ENV_VAR)
    if raw is None or not raw.strip():
        return None
    families = registry()
    if raw.strip() in tuple(str(v) for v in families.versions):
        return int(raw.strip())
    raise ValueError(
        f"{ENV_VAR}={raw!r} is not a valid FlashAttention version: set it to "
        f"{families.versions_text()}, or unset it to let the selector choose"
    )


def resolve_device_index(device=None) -> tuple[Optional[int], Optional[str]]:
    """(CUDA device index, None) or (None, why there is no usable device)."""
    env = current_environment()
    count = env.device_count()
    if count == 0:
        return None, "no CUDA GPU is visible to this process"
    if device is None:
        index = env.current_device()
    elif isinstance(device, int):
        index = device
    else:
        import torch

        dev = torch.device(device)
        if dev.type not in ("cuda", env.device_type):  # device_type differs only in tests
            return None, f"device {dev} is not a CUDA device"
        index = env.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        return None, f"there is no CUDA device {index} ({count} visible)"
    return index, None


def lowest_capability() -> tuple[int, int]:
    """The oldest GPU any declared family runs on."""
    return min(f.min_capability for f in registry())


def _capability_problem(major: int, minor: int, index: int) -> Optional[str]:
    lowest = lowest_capability()
    if (major, minor) < lowest:
        return (f"GPU {index} has compute capability {major}.{minor}; FlashAttention needs "
                f"{lowest[0]}.{lowest[1]} (Ampere) or newer")
    return None


def version_problem(version: int, index: int) -> Optional[str]:
    """Why ``version`` cannot run on device ``index`` at all; None when it can."""
    env = current_environment()
    family = registry()[version]
    try:
        comp = env.build_info().component(version)
    except BuildInfoMissing as exc:
        return str(exc)
    if not comp.built:
        why = f": {comp.reason}" if comp.reason else ""
        return f"this wheel was built without {family.title}{why}"
    major, minor = env.capability(index)
    problem = _capability_problem(major, minor, index) or family.capability_problem(major, minor, index)
    if problem is not None:
        return problem
    # The code this wheel compiled (its record's gencode) against the arch table: a GPU
    # newer than the arch list gets nothing from SASS alone (FA2 with VFA_FA2_PTX=OFF).
    if family.compiled and registry().cuda_archs.runs_on(comp.gencode, major, minor) is False:
        return (f"this wheel's {family.title} is {' + '.join(comp.gencode)} code, which does not run on compute "
                f"capability {major}.{minor} (GPU {index}): rebuild it with {major}.{minor} in TORCH_CUDA_ARCH_LIST")
    error = env.load_module(version)
    if error is not None:
        if family.compiled:
            return f"the {family.title} module {comp.module or ''} failed to import: {error}".replace("  ", " ")
        return f"{family.title} ({family.probe}) cannot be used: {error}"
    return None


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, FlashAttnFallbackWarning, stacklevel=4)


def _dtype_key(dtype) -> Optional[str]:
    if dtype is None or isinstance(dtype, str):
        aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "e4m3",
                   "fp8_e4m3": "e4m3", "float8_e4m3fn": "e4m3"}
        return aliases.get(dtype, dtype) if dtype is not None else None
    return dtype_name(dtype) or str(dtype).replace("torch.", "")


def _sinks_families() -> str:
    """"FA3 or FA4": the families that declare attention sinks."""
    return titles_text(registry().having("sinks"))


def _model_problem(family: Family, comp, major: int, dtype, head_size, head_size_v) -> Optional[str]:
    """Why ``family``'s kernels in this wheel cannot take this model's dtype and head sizes on
    a GPU of generation ``major``, by its declared rules (dtypes; head-size rule and head sizes
    per generation); None when they can."""
    problem = dtype_problem(family, comp, dtype) if dtype is not None else None
    if problem is None and head_size is not None:
        problem = head_size_problem(family, comp, head_size, head_size_v, dtype,
                                    generation=family.generations.get(major))
    return problem


def _sinks_problem(family: Family, head_size, head_size_v) -> Optional[str]:
    """Why ``family`` cannot take attention sinks with these head sizes, by its declaration."""
    if "sinks" not in family.features:
        return f"attention sinks (s_aux) need {_sinks_families()}"
    if (family.call.sinks_same_head_sizes and head_size is not None and head_size_v is not None
            and head_size_v != head_size):
        return (f"{family.title} does not support attention sinks (s_aux) with different Q/K and V head sizes "
                f"({head_size} and {head_size_v})")
    return None


def _serve_problem(family: Family, index, major: int, info, dtype, head_size, head_size_v, has_sinks,
                   features=(), usable: bool = False) -> Optional[str]:
    """Why ``family`` cannot serve this request on device ``index`` (of generation ``major``);
    None when it can. ``usable``: version_problem said None already (each question probes the
    machine once)."""
    if has_sinks and "sinks" not in family.features:
        return f"attention sinks (s_aux) need {_sinks_families()}"
    problem = None if usable else version_problem(family.version, index)
    comp = info.component(family.version)
    if problem is None:
        problem = _model_problem(family, comp, major, dtype, head_size, head_size_v)
    if problem is None and has_sinks:
        problem = _sinks_problem(family, head_size, head_size_v)
    if problem is None and family.features_missing(comp.features, features):
        problem = "it cannot run " + ", ".join(family.features_missing(comp.features, features))
    return problem


def _default_family(info, major: int, minor: int, index: int,
                    fall_back) -> tuple[Family, str, bool, tuple[str, ...]]:
    """The first family of the declared default order that is the default on this GPU
    generation and usable; the reason says why those before it were passed over and why a
    family that runs here is not the default (FA4 on Hopper), which are also its notes."""
    families = registry()
    skipped: list[str] = []
    unusable_built: list[tuple[Family, str]] = []
    picked: Optional[Family] = None
    for family in families.in_default_order():
        if picked is not None:
            # After the pick: say why a family that runs here is not the default (FA4 on Hopper).
            if (family.capability_problem(major, minor, index) is None and family.not_default.get(major)
                    and version_problem(family.version, index) is None):
                skipped.append(f"{family.title} is not the default here: {family.not_default[major]}")
            continue
        if not family.is_default_on(major):
            problem = family.capability_problem(major, minor, index)
            if problem is not None:
                skipped.append(f"{family.title} unusable ({problem})")
            elif family.not_default.get(major):
                skipped.append(f"{family.title} is not the default here: {family.not_default[major]}")
            continue
        problem = version_problem(family.version, index)
        if problem is None:
            picked = family
            continue
        skipped.append(f"{family.title} unusable ({problem})")
        if family.capability_problem(major, minor, index) is None and info.component(family.version).built:
            unusable_built.append((family, problem))
    usable = picked is not None
    if picked is None:  # nothing usable: the last family's refusal is the answer's
        picked = families.in_default_order()[-1]
        for family in reversed(families.in_default_order()):
            if family.is_default_on(major) and family.capability_problem(major, minor, index) is None:
                picked = family
                break
    for family, problem in unusable_built:
        if family is not picked:
            # Built for this GPU but failing (a module that does not import, FA4 without its
            # dependencies): worth a warning that names the cause.
            fall_back(f"{family.title} is built but unusable on GPU {index}: {problem}; using {picked.title}")
    generation = " (Hopper)" if major == 9 else ""
    reason = f"default for compute capability {major}.{minor}{generation}: {picked.title} is built and loads"
    notes = tuple(s for s in skipped if not s.startswith(f"{picked.title} "))
    if notes:
        reason += "; " + "; ".join(notes)
    return picked, reason, usable, notes


@functools.lru_cache(maxsize=512)
def _select(generation, override, requires_alibi, head_size, head_size_v, dtype, index, has_sinks,
            features):
    del generation  # only part of the cache key
    env = current_environment()
    try:
        info = env.build_info()
    except BuildInfoMissing as exc:
        return Selection(None, str(exc))
    major, minor = env.capability(index)
    problem = _capability_problem(major, minor, index)
    if problem is not None:
        return Selection(None, problem)
    families = registry()
    fallbacks: list[str] = []

    def fall_back(message: str) -> None:
        fallbacks.append(message)
        _warn_once(message)

    notes: tuple[str, ...] = ()
    if override is not None:
        family, reason = families[override], f"{ENV_VAR}={override}"
        problem = version_problem(override, index)
        usable = problem is None
        if problem and family.fallback:
            target = families.by_name(family.fallback)
            fall_back(f"{ENV_VAR}={override} asks for {family.title}, but {problem}; using {target.title}")
            family, usable = target, False
    else:
        family, reason, usable, notes = _default_family(info, major, minor, index, fall_back)

    # The request itself: what the picked family cannot serve goes to its fallback (once).
    if family.fallback is not None:
        target = families.by_name(family.fallback)
        comp = info.component(family.version)
        message = None
        if requires_alibi and "alibi" not in family.features:
            message = f"ALiBi is not supported by {family.title}; using {target.title}"
        else:
            problem = _model_problem(family, comp, major, dtype, head_size, head_size_v)
            if problem is not None:
                message = f"{family.title} cannot serve this model: {problem}; using {target.title}"
        sinks = _sinks_problem(family, head_size, head_size_v) if has_sinks and message is None else None
        if sinks is not None and "sinks" in family.features:
            # A sinks rule of the family's declaration (FA3: equal head sizes) that its fallback
            # cannot meet either, having no sinks.
            if "sinks" not in target.features:
                return Selection(None, f"{sinks}, and {target.title} has no sinks", tuple(fallbacks))
            message = f"{sinks}; using {target.title}"
        if message is None:
            missing = family.features_missing(comp.features, features)
            # The fallback only when it serves the whole call; otherwise the call stays,
            # and the family's refusal names the kernels to build.
            if missing and _serve_problem(target, index, major, info, dtype, head_size, head_size_v,
                                          has_sinks, features) is None:
                words = ", ".join(f"{FEATURE_WORDS.get(f, f)} ('{f}')" for f in missing)
                message = (f"this wheel's {family.title} was built without the kernels for {words}; "
                           f"using {target.title} for these calls (rebuild with VFA_PRESET=full to run "
                           f"them on {family.title})")
        if message is not None:
            fall_back(message)
            family, usable = target, False
    if family.fallback is None:
        problem = _serve_problem(family, index, major, info, dtype, head_size, head_size_v, has_sinks,
                                 usable=usable)
        if problem is not None:
            if has_sinks and "sinks" not in family.features:
                having = registry().having("sinks")
                return Selection(None, f"attention sinks (s_aux) need {titles_text(having)}, "
                                       f"{'which is not' if len(having) == 1 else 'none of which is'} usable here",
                                 tuple(fallbacks))
            return Selection(None, f"{family.title} cannot be used: {problem}", tuple(fallbacks))
    return Selection(family.version, reason, tuple(fallbacks), notes)


def select_flash_attn_version(
    requires_alibi: bool = False,
    head_size: Optional[int] = None,
    head_size_v: Optional[int] = None,
    has_sinks: bool = False,
    requires_local_attention: bool = False,
    *,
    dtype=None,
    device=None,
    features: Iterable[str] = (),
) -> Selection:
    """The version for a model with these properties on ``device``, with the reason.

    ``features``: FA3 kernel features (build-info names: "paged", "split", "softcap",
    "local", "hdimdiff") the calls will need; ``requires_local_attention`` (vLLM's
    name) adds "local". When this wheel's FA3 lacks one and FA2 serves them all, FA2."""
    override = requested_version()  # raises on an invalid value, GPU or not
    index, problem = resolve_device_index(device)
    if problem is not None:
        return Selection(None, problem)
    if head_size is not None:
        head_size = int(head_size)
    if head_size_v is not None:
        head_size_v = int(head_size_v)
    # One name given as a string is that name, not its letters.
    needed = {features} if isinstance(features, str) else set(features)
    if requires_local_attention:
        needed.add("local")
    return _select(environment_generation(), override, bool(requires_alibi), head_size,
                   head_size_v, _dtype_key(dtype), index, bool(has_sinks), tuple(sorted(needed)))


def get_flash_attn_version(
    requires_alibi: bool = False,
    head_size: Optional[int] = None,
    head_size_v: Optional[int] = None,
    has_sinks: bool = False,
    requires_local_attention: bool = False,
    *,
    dtype=None,
    device=None,
    features: Iterable[str] = (),
) -> Optional[int]:
    """A declared version (2, 3, 4), or None when nothing usable (see
    ``flash_attn_version_reason``). Positional
    arguments as vLLM's fa_utils.get_flash_attn_version takes them."""
    return select_flash_attn_version(requires_alibi, head_size, head_size_v, has_sinks,
                                     requires_local_attention, dtype=dtype, device=device,
                                     features=features).version


def flash_attn_version_reason(
    requires_alibi: bool = False,
    head_size: Optional[int] = None,
    head_size_v: Optional[int] = None,
    has_sinks: bool = False,
    requires_local_attention: bool = False,
    *,
    dtype=None,
    device=None,
    features: Iterable[str] = (),
) -> str:
    """Why ``get_flash_attn_version`` with the same arguments answers what it does."""
    return select_flash_attn_version(requires_alibi, head_size, head_size_v, has_sinks,
                                     requires_local_attention, dtype=dtype, device=device,
                                     features=features).reason


def fa_version_unsupported_reason(fa_version: int, device=None) -> Optional[str]:
    """Why ``fa_version`` cannot run on ``device``; None when it can."""
    registry()[fa_version]  # ValueError naming the declared versions
    index, problem = resolve_device_index(device)
    if problem is not None:
        return problem
    return version_problem(fa_version, index)


def is_fa_version_supported(fa_version: int, device=None) -> bool:
    return fa_version_unsupported_reason(fa_version, device) is None


def flash_attn_supports_fp8(device=None) -> bool:
    """True when the family the selector picks on ``device`` takes FP8 q, k and v (FA3) and
    the wheel has its e4m3 kernels."""
    selection = select_flash_attn_version(device=device)
    if selection.version is None or "fp8" not in registry()[selection.version].features:
        return False
    return "e4m3" in current_environment().build_info().component(selection.version).dtypes


def flash_attn_supports_quant_query_input(device=None) -> bool:
    """Whether a caller may hand over an FP8 (e4m3) query: FA3 takes FP8 q (with FP8 k
    and v), FA2 none; so the same answer as ``flash_attn_supports_fp8``."""
    return flash_attn_supports_fp8(device)


def flash_attn_supports_sinks(device=None) -> bool:
    """True when calls with attention sinks (``s_aux``) run here: the selector picks a family
    with sinks (FA3; FA4)."""
    return select_flash_attn_version(has_sinks=True, device=device).version is not None


# The family vLLM's FlashAttention MLA backend calls: its calls pass fa_version=3 themselves
# (VLLM_FLASH_ATTN_VERSION and the selector do not enter), so the number is vLLM's, and what
# it may do is read from the declaration of the family with that version.
MLA_FA_VERSION = 3
# The shapes vLLM's FlashAttention MLA backend hands to FA3 (head size, V head size):
# prefill with Q/K = nope 128 + rope 64 and V 128; decode with Q/K = the rope part (64),
# V = the latent (512), q_v = the nope query, over a paged cache.
MLA_SHAPES = ((192, 128), (64, 512))


def flash_attn_mla_unsupported_reason(device=None) -> Optional[str]:
    """Why this wheel cannot run vLLM's MLA calls on ``device``; None when it can. MLA
    calls pass fa_version=3 (MLA_FA_VERSION), so VLLM_FLASH_ATTN_VERSION does not enter."""
    index, problem = resolve_device_index(device)
    if problem is not None:
        return problem
    family = registry()[MLA_FA_VERSION]
    problem = version_problem(MLA_FA_VERSION, index)
    if problem is not None:
        return f"MLA needs {family.title}: {problem}"
    built = current_environment().build_info().component(MLA_FA_VERSION)
    if "paged" not in built.features:
        return (f"MLA decode reads a paged KV cache; this wheel's {family.title} was built without the "
                "'paged' kernels")
    for dtype in ("bf16", "fp16"):
        if dtype in built.dtypes and not any(head_size_problem(family, built, d, dv, dtype)
                                             for d, dv in MLA_SHAPES):
            return None
    problems = [head_size_problem(family, built, d, dv, "bf16") for d, dv in MLA_SHAPES]
    return f"MLA needs {family.title} head sizes 192/128 and 64/512: " + "; ".join(p for p in problems if p)


def flash_attn_supports_mla(device=None) -> bool:
    """True when vLLM's FlashAttention MLA backend can run here (see MLA_SHAPES)."""
    return flash_attn_mla_unsupported_reason(device) is None


def is_flash_attn_varlen_func_available(device=None) -> bool:
    """True when ``flash_attn_varlen_func`` can run here with some version."""
    return select_flash_attn_version(device=device).version is not None


def _reset() -> None:
    _select.cache_clear()
    with _warn_lock:
        _warned.clear()


on_environment_change(_reset)
