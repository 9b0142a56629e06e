"""FA2's adapter: a call the shared checks (validation.py) passed, onto the compiled module's
``varlen_fwd`` in the argument order of its schema (op_schemas.FA2_VARLEN_FWD): ``launch``,
in the launch contract of call.LAUNCH; ``forward``, the declared adapter, for a call object.

The family declaration (cmake/knobs.json, ``families.fa2``) names ``forward`` as its
adapter; what FA2 takes and refuses (dtypes, features, block sizes divisible by 16, no
batched K/V) is declared there and checked by the shared validation before this runs.
"""

from __future__ import annotations

from ..call.arguments import VarlenCall, launch_arguments


def launch(resolved, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table, out,
           scheduler_metadata, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right,
           softcap, num_splits, return_softmax_lse, fp8, q_v, alibi_slopes, s_aux, cp_world_size, cp_rank,
           cp_tot_seqused_k):
    """FA2's forward op (``resolved.op``) for a call the shared checks passed, in the launch
    contract (call.LAUNCH); its result (out, softmax_lse, ...). What FA2 has no use for (q_v,
    FP8, sinks, scheduler metadata, context parallelism) was refused by the shared checks when
    set, or is the descales vLLM passes on every call: not read. The op returns LSE either way."""
    return resolved.op(
        q, k, v,
        out,
        cu_seqlens_q,
        # Paged cache: FA2's schema still wants cu_seqlens_k and its kernels read
        # entries b and b+1, but with a block_table the values never reach an
        # address or a length (block_info.h: K offsets come from the table,
        # lengths from seqused_k). Any initialised int32 tensor of batch + 1
        # entries keeps that read well-defined; cu_seqlens_q is one, and costs no
        # allocation or kernel launch per call. (Upstream passes uninitialised
        # memory here.)
        cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k,
        seqused_k,
        None,              # leftpad_k
        block_table,
        alibi_slopes,
        max_seqlen_q,
        max_seqlen_k,
        0.0,               # p_dropout: built without dropout
        softmax_scale,
        False,             # zero_tensors
        causal,
        window_left,
        window_right,
        softcap,
        False,             # return_softmax: only meaningful with dropout
        num_splits,
        None,              # gen: must be None
    )


def forward(resolved, call: VarlenCall, window: tuple[int, int], fp8: bool):
    """FA2's adapter (the declaration's ``adapter``): (out, softmax_lse) of a call the shared
    checks passed, through ``launch``."""
    return launch(resolved, *launch_arguments(call, window, fp8))[:2]


forward.launch = launch  # the interface's quick path calls it with a quick call's own arguments
