"""FA2's adapter: a call the shared checks (validation.py) passed, onto the compiled
module's ``varlen_fwd`` in the argument order of its schema (op_schemas.FA2_VARLEN_FWD).

The family declaration (cmake/knobs.json, ``families.fa2``) names ``forward`` as its
adapter; what FA2 takes and refuses (dtypes, features, block sizes divisible by 16, no
batched K/V) is declared there and checked by the shared validation before this runs.
"""

from __future__ import annotations


def forward(op, comp, q, k, v, q_v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
            max_seqlen_k, block_table, alibi_slopes, softmax_scale, causal, window, softcap, fp8,
            num_splits, scheduler_metadata, q_descale, k_descale, v_descale, s_aux, cp_world_size,
            cp_rank, cp_tot_seqused_k):
    """(out, softmax_lse) of FA2's forward op ``op``. The arguments FA2 has no use for
    (q_v, FP8 descales, sinks, scheduler metadata, context parallelism) were refused by the
    shared checks when set, or are the descales vLLM passes on every call: ignored."""
    del comp, q_v, fp8, scheduler_metadata, q_descale, k_descale, v_descale, s_aux
    del cp_world_size, cp_rank, cp_tot_seqused_k
    return op(
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
        float(softmax_scale),
        False,             # zero_tensors
        bool(causal),
        window[0],
        window[1],
        float(softcap),
        False,             # return_softmax: only meaningful with dropout
        num_splits,
        None,              # gen: must be None
    )[:2]
