"""Expensive input checks, on only with ``VFA_DEBUG_CHECKS=1``.

These read index tensor *values* (copying them to the host, which syncs the device),
so they are far too slow for serving; they exist to turn an out-of-range block id or a
bad offset - which the kernel would turn into a wild memory read - into an exception
while debugging. The variable is read once per process (and again after the
environment is swapped, for tests).
"""

from __future__ import annotations

import functools
import warnings

import torch

from ..declaration.knob_values import BOOL_OFF, BOOL_ON, BOOL_WORDS_TEXT
from ..selection.environment import current_environment, on_environment_change
from ..errors import FlashAttnInputError

DEBUG_ENV = "VFA_DEBUG_CHECKS"


@functools.lru_cache(maxsize=1)
def debug_checks_enabled() -> bool:
    """The boolean words every knob takes (cmake/knobs.json); any other value is off,
    with one warning (an exception here would reach every attention call)."""
    value = (current_environment().getenv(DEBUG_ENV) or "").strip().lower()
    if value not in ("", *BOOL_ON, *BOOL_OFF):
        warnings.warn(f"{DEBUG_ENV}={value!r} is not a valid value; the debug checks stay off. "
                      f"Valid values: {BOOL_WORDS_TEXT}.", stacklevel=2)
    return value in BOOL_ON


on_environment_change(debug_checks_enabled.cache_clear)


def _host(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.int64)


def _check_offsets(name: str, offsets: torch.Tensor, total: int, rows: str,
                   max_name: str, max_value: int) -> None:
    cu = _host(offsets)
    if int(cu[0]) != 0:
        raise FlashAttnInputError(f"{name} must start at 0, starts at {int(cu[0])}")
    lengths = cu[1:] - cu[:-1]
    if bool((lengths < 0).any()):
        bad = int(torch.nonzero(lengths < 0)[0, 0])
        raise FlashAttnInputError(f"{name} must be non-decreasing; it decreases after entry {bad}")
    if int(cu[-1]) > total:
        raise FlashAttnInputError(f"{name} ends at {int(cu[-1])} but {rows} has only {total} rows")
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_value:
        raise FlashAttnInputError(f"{max_name}={max_value} is smaller than the longest sequence "
                                  f"in {name} ({longest})")


def run_debug_checks(*, q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                     max_seqlen_q: int, max_seqlen_k: int) -> None:
    """Raise FlashAttnInputError when index tensors point outside their tensors."""
    _check_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q", "max_seqlen_q", max_seqlen_q)
    if cu_seqlens_k is not None:
        _check_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k", "max_seqlen_k", max_seqlen_k)
    if seqused_k is None:
        return
    used = _host(seqused_k)
    if bool((used < 0).any()):
        raise FlashAttnInputError("seqused_k has negative entries")
    capacity = block_table.shape[1] * k.shape[1] if block_table is not None else k.shape[1]
    longest = int(used.max()) if used.numel() else 0
    if longest > capacity:
        where = ("block_table columns x block size" if block_table is not None
                 else "k's sequence dimension")
        raise FlashAttnInputError(f"seqused_k has an entry {longest} larger than the KV capacity "
                                  f"{capacity} ({where})")
    if longest > max_seqlen_k:
        raise FlashAttnInputError(f"max_seqlen_k={max_seqlen_k} is smaller than the longest "
                                  f"seqused_k entry ({longest})")
    if block_table is not None:
        table = _host(block_table)
        page = k.shape[1]
        blocks_used = (used + page - 1) // page
        mask = torch.arange(table.shape[1])[None, :] < blocks_used[:, None]
        bad = mask & ((table < 0) | (table >= k.shape[0]))
        if bool(bad.any()):
            row, col = (int(i) for i in torch.nonzero(bad)[0])
            raise FlashAttnInputError(
                f"block_table[{row}, {col}] = {int(table[row, col])} is outside the KV cache "
                f"(num_blocks = {k.shape[0]})")
