"""Test adapter, not part of the package: upstream's ``vllm_flash_attn`` module names over
``vendored_flash_attn``, so that upstream's tests/test_vllm_flash_attn.py runs unchanged
against this wheel (tests/upstream/run_upstream_tests.py puts this folder on sys.path).

Exports what upstream's package exports at the pin, plus ``flash_attn_with_kvcache``,
which upstream's test file imports but upstream removed before the pin (see
flash_attn_interface.py).
"""

from .flash_attn_interface import (  # noqa: F401
    fa_version_unsupported_reason,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    get_scheduler_metadata,
    is_fa_version_supported,
    sparse_attn_func,
    sparse_attn_varlen_func,
)
