"""FA2's adapter: a call the shared checks (validation.py) passed (call.VarlenCall), onto the
compiled module's ``varlen_fwd`` in the argument order of its schema (op_schemas.FA2_VARLEN_FWD).

The family declaration (cmake/knobs.json, ``families.fa2``) names ``forward`` as its
adapter; what FA2 takes and refuses (dtypes, features, block sizes divisible by 16, no
batched K/V) is declared there and checked by the shared validation before this runs.
"""

from __future__ import annotations

from .call import VarlenCall, scale_of


def forward(resolved, call: VarlenCall, window: tuple[int, int], fp8: bool):
    """(out, softmax_lse) of FA2's forward op (``resolved.op``) for a checked call. What FA2
    has no use for (q_v, FP8 descales, sinks, scheduler metadata, context parallelism) was
    refused by the shared checks when set, or is the descales vLLM passes on every call:
    not read."""
    del fp8  # FA2 declares no FP8: the shared checks refused it
    cu_seqlens_q, cu_seqlens_k = call.cu_seqlens_q, call.cu_seqlens_k
    return resolved.op(
        call.q, call.k, call.v,
        call.out,
        cu_seqlens_q,
        # Paged cache: FA2's schema still wants cu_seqlens_k and its kernels read
        # entries b and b+1, but with a block_table the values never reach an
        # address or a length (block_info.h: K offsets come from the table,
        # lengths from seqused_k). Any initialised int32 tensor of batch + 1
        # entries keeps that read well-defined; cu_seqlens_q is one, and costs no
        # allocation or kernel launch per call. (Upstream passes uninitialised
        # memory here.)
        cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k,
        call.seqused_k,
        None,              # leftpad_k
        call.block_table,
        call.alibi_slopes,
        call.max_seqlen_q,
        call.max_seqlen_k,
        0.0,               # p_dropout: built without dropout
        float(scale_of(call)),
        False,             # zero_tensors
        bool(call.causal),
        window[0],
        window[1],
        float(call.softcap),
        False,             # return_softmax: only meaningful with dropout
        call.num_splits,
        None,              # gen: must be None
    )[:2]
