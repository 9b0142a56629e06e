"""Runtime choice between FA3 and FA2.

Rules (docs/runtime.md): FA3 by default on compute capability 9.x when this wheel
built FA3 and its module imports, else FA2 on 8.0+; ``VLLM_FLASH_ATTN_VERSION``
("2" or "3") overrides; a request FA3 cannot serve (non-Hopper GPU, ALiBi, a head size
or dtype not built, a feature such as softcap this wheel's FA3 lacks and FA2 has) falls
back to FA2 with one warning per distinct reason; ``None`` with a reason when nothing
is usable. Plain queries never raise, except for an invalid ``VLLM_FLASH_ATTN_VERSION``,
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

from .build_info import BuildInfoMissing
from .environment import current_environment, environment_generation, on_environment_change
from .errors import FlashAttnFallbackWarning
from .kernels import FEATURE_WORDS, dtype_name, dtype_problem, head_size_problem

ENV_VAR = "VLLM_FLASH_ATTN_VERSION"
VERSIONS = (2, 3)
FA4_REASON = "FA4 is not part of vendored-flash-attn, which ships FA2 and FA3 only"
# FA3 kernel features (build info names) a call can need that FA2 serves as well; FA2
# has no split-KV beyond one split (validation._check_fa2_only).
FA2_ALSO_SERVES = frozenset({"paged", "softcap", "local"})


@dataclass(frozen=True)
class Selection:
    """A selector answer: the version (None: nothing usable), why, and any fallbacks taken."""

    version: Optional[int]
    reason: str
    fallbacks: tuple[str, ...] = ()


def requested_version() -> Optional[int]:
    """The version forced by VLLM_FLASH_ATTN_VERSION, None when unset or empty."""
    raw = current_environment().getenv(ENV_VAR)
    if raw is None or not raw.strip():
        return None
    if raw.strip() in ("2", "3"):
        return int(raw.strip())
    raise ValueError(
        f"{ENV_VAR}={raw!r} is not a valid FlashAttention version: set it to 2 or 3, "
        "or unset it to let the selector choose"
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


def version_problem(version: int, index: int) -> Optional[str]:
    """Why ``version`` cannot run on device ``index`` at all; None when it can."""
    env = current_environment()
    try:
        comp = env.build_info().component(version)
    except BuildInfoMissing as exc:
        return str(exc)
    if not comp.built:
        why = f": {comp.reason}" if comp.reason else ""
        return f"this wheel was built without FA{version}{why}"
    major, minor = env.capability(index)
    if major < 8:
        return (f"GPU {index} has compute capability {major}.{minor}; FlashAttention needs 8.0 "
                "(Ampere) or newer")
    if version == 3 and major != 9:
        return (f"FA3 kernels are built for sm_90a only (Hopper, compute capability 9.x); "
                f"GPU {index} has compute capability {major}.{minor}")
    error = env.load_module(version)
    if error is not None:
        return f"the FA{version} module {comp.module or ''} failed to import: {error}".replace("  ", " ")
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


def _fa2_problem(index, info, dtype, head_size, head_size_v, has_sinks) -> Optional[str]:
    """Why FA2 cannot serve this request on device ``index``; None when it can."""
    if has_sinks:
        return "attention sinks (s_aux) need FA3"
    problem = version_problem(2, index)
    if problem is None and dtype is not None:
        problem = dtype_problem(2, info.fa2, dtype)
    if problem is None and head_size is not None:
        problem = head_size_problem(2, info.fa2, head_size, head_size_v, dtype)
    return problem


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
    if major < 8:
        return Selection(None, f"GPU {index} has compute capability {major}.{minor}; "
                               "FlashAttention needs 8.0 (Ampere) or newer")
    fallbacks: list[str] = []
    fa3_problem = version_problem(3, index)

    def fall_back(message: str) -> None:
        fallbacks.append(message)
        _warn_once(message)

    if override is not None:
        version, reason = override, f"{ENV_VAR}={override}"
        if version == 3 and fa3_problem:
            fall_back(f"{ENV_VAR}=3 asks for FA3, but {fa3_problem}; using FA2")
            version = 2
    elif fa3_problem is None:
        version, reason = 3, f"default for compute capability {major}.{minor} (Hopper): FA3 is built and loads"
    else:
        version, reason = 2, f"default for compute capability {major}.{minor}: FA3 unusable ({fa3_problem})"
        if major == 9 and info.fa3.built:
            # Hopper with FA3 in the wheel that fails to import: worth a warning.
            fall_back(f"FA3 is built but unusable on GPU {index}: {fa3_problem}; using FA2")

    if version == 3 and requires_alibi:
        fall_back("ALiBi is not supported by FA3; using FA2")
        version = 2
    if version == 3:
        problem = None
        if dtype is not None:
            problem = dtype_problem(3, info.fa3, dtype)
        if problem is None and head_size is not None:
            problem = head_size_problem(3, info.fa3, head_size, head_size_v, dtype)
        if problem is not None:
            fall_back(f"FA3 cannot serve this model: {problem}; using FA2")
            version = 2
    if (version == 3 and has_sinks and head_size is not None and head_size_v is not None
            and head_size_v != head_size):
        return Selection(None, "FA3 does not support attention sinks (s_aux) with different Q/K "
                               f"and V head sizes ({head_size} and {head_size_v}), and FA2 has no "
                               "sinks", tuple(fallbacks))
    if version == 3:
        missing = [f for f in features if f not in info.fa3.features]
        # FA2 instead only when it serves the whole call; otherwise the call stays on FA3,
        # whose refusal names the kernels to build.
        if missing and set(features) <= FA2_ALSO_SERVES and _fa2_problem(
                index, info, dtype, head_size, head_size_v, has_sinks) is None:
            words = ", ".join(f"{FEATURE_WORDS.get(f, f)} ('{f}')" for f in missing)
            fall_back(f"this wheel's FA3 was built without the kernels for {words}; using FA2 "
                      "for these calls (rebuild with VFA_PRESET=full to run them on FA3)")
            version = 2
    if version == 2:
        problem = _fa2_problem(index, info, dtype, head_size, head_size_v, has_sinks)
        if problem is not None:
            if has_sinks:
                return Selection(None, "attention sinks (s_aux) need FA3, which is not usable here",
                                 tuple(fallbacks))
            return Selection(None, f"FA2 cannot be used: {problem}", tuple(fallbacks))
    return Selection(version, reason, tuple(fallbacks))


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
    """2, 3, or None when nothing usable (see ``flash_attn_version_reason``). Positional
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
    if fa_version == 4:  # vLLM probes FA4 on Hopper and Blackwell; answer, don't fail
        return FA4_REASON
    if fa_version not in VERSIONS:
        raise ValueError(f"FlashAttention version must be 2 or 3, got {fa_version!r}")
    index, problem = resolve_device_index(device)
    if problem is not None:
        return problem
    return version_problem(fa_version, index)


def is_fa_version_supported(fa_version: int, device=None) -> bool:
    return fa_version_unsupported_reason(fa_version, device) is None


def flash_attn_supports_fp8(device=None) -> bool:
    """True when the selector picks FA3 on ``device`` and the wheel has its e4m3 kernels."""
    selection = select_flash_attn_version(device=device)
    if selection.version != 3:
        return False
    return "e4m3" in current_environment().build_info().fa3.dtypes


def flash_attn_supports_quant_query_input(device=None) -> bool:
    """Whether a caller may hand over an FP8 (e4m3) query: FA3 takes FP8 q (with FP8 k
    and v), FA2 none; so the same answer as ``flash_attn_supports_fp8``."""
    return flash_attn_supports_fp8(device)


def flash_attn_supports_sinks(device=None) -> bool:
    """True when calls with attention sinks (``s_aux``) run here: the selector picks FA3."""
    return select_flash_attn_version(has_sinks=True, device=device).version == 3


# The shapes vLLM's FlashAttention MLA backend hands to FA3 (head size, V head size):
# prefill with Q/K = nope 128 + rope 64 and V 128; decode with Q/K = the rope part (64),
# V = the latent (512), q_v = the nope query, over a paged cache.
MLA_SHAPES = ((192, 128), (64, 512))


def flash_attn_mla_unsupported_reason(device=None) -> Optional[str]:
    """Why this wheel cannot run vLLM's MLA calls on ``device``; None when it can. MLA
    calls pass fa_version=3, so VLLM_FLASH_ATTN_VERSION does not enter."""
    index, problem = resolve_device_index(device)
    if problem is not None:
        return problem
    problem = version_problem(3, index)
    if problem is not None:
        return f"MLA needs FA3: {problem}"
    fa3 = current_environment().build_info().fa3
    if "paged" not in fa3.features:
        return ("MLA decode reads a paged KV cache; this wheel's FA3 was built without the "
                "'paged' kernels")
    for dtype in ("bf16", "fp16"):
        if dtype in fa3.dtypes and not any(head_size_problem(3, fa3, d, dv, dtype)
                                           for d, dv in MLA_SHAPES):
            return None
    problems = [head_size_problem(3, fa3, d, dv, "bf16") for d, dv in MLA_SHAPES]
    return "MLA needs FA3 head sizes 192/128 and 64/512: " + "; ".join(p for p in problems if p)


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
