"""vendored_flash_attn: FlashAttention forward kernels for vLLM-style callers: FA2 (sm80+), FA3
(Hopper, with FP8) and FA4 (upstream's CuTe DSL kernels, with the ``[fa4]`` extra), behind one
call signature and a runtime selector.

Importing the package is cheap and never fails for lack of a GPU or of the compiled
modules: names are resolved on first use, and the compiled modules are imported (and
the result cached) the first time a kernel or the selector needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "flash_attn_varlen_func": "interface",
    "get_scheduler_metadata": "interface",
    "sparse_attn_func": "sparse",
    "sparse_attn_varlen_func": "sparse",
    "get_flash_attn_version": "selection.selector",
    "select_flash_attn_version": "selection.selector",
    "flash_attn_version_reason": "selection.selector",
    "is_fa_version_supported": "selection.selector",
    "fa_version_unsupported_reason": "selection.selector",
    "flash_attn_supports_fp8": "selection.selector",
    "flash_attn_supports_quant_query_input": "selection.selector",
    "flash_attn_supports_sinks": "selection.selector",
    "flash_attn_supports_mla": "selection.selector",
    "flash_attn_mla_unsupported_reason": "selection.selector",
    "is_flash_attn_varlen_func_available": "selection.selector",
    "Selection": "selection.selector",
    "make_fp8_descales": "fp8",
    "FlashAttnInputError": "errors",
    "FlashAttnTypeError": "errors",
    "FlashAttnUnavailableError": "errors",
    "FlashAttnFallbackWarning": "errors",
    "FlashAttnCaptureError": "errors",
    "load_build_info": "declaration.build_info",
    "BuildInfo": "declaration.build_info",
    "BuildInfoMissing": "declaration.build_info",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib import metadata

        try:
            value = metadata.version("vendored-flash-attn")
        except metadata.PackageNotFoundError:
            value = "0+unknown"
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
