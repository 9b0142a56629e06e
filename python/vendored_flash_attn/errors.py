"""Exception and warning types of the runtime.

Bad input raises ``FlashAttnInputError`` (a ``ValueError``) or ``FlashAttnTypeError``
(both a ``TypeError`` and a ``FlashAttnInputError``) before any kernel runs, so a serving
process can catch one type and keep its CUDA context.
"""

from __future__ import annotations


class FlashAttnInputError(ValueError):
    """An argument of a call is wrong; the message names it and says how to fix it."""


class FlashAttnTypeError(FlashAttnInputError, TypeError):
    """An argument has the wrong type or dtype."""


class FlashAttnUnavailableError(RuntimeError):
    """No usable FlashAttention version for this call (no GPU, module missing, ...)."""


class FlashAttnFallbackWarning(UserWarning):
    """The selector picked another version than the one asked for or preferred."""


class FlashAttnCaptureError(FlashAttnUnavailableError):
    """A call that cannot be part of the CUDA graph being captured on the current stream,
    refused before anything is enqueued (the capture itself is not disturbed)."""
