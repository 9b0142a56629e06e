"""The schemas of the compiled ops this package calls, as upstream registers them.

The ``ops.def`` strings of the pinned upstream (``REGISTRATION_SOURCES``:
``csrc/flash_attn/flash_api_torch_lib.cpp`` for FA2, ``hopper/flash_api_torch_lib.cpp``
for FA3). ``interface.py`` and ``sparse.py`` call these ops positionally, in this argument
order, and the CPU unit tests register fake ops from these strings and check every argument
of the interface's calls by name. That these are upstream's schemas is checked, not assumed:

* every configure reads upstream's registration sources (``cmake/vfa_build/knobs/op_schemas.py``, run by
  ``cmake/OpSchemas.cmake``) and stops when one of these ops has another schema there;
* ``CHECKED_AGAINST`` records, per upstream commit, the fingerprint of these schemas that
  check passed on; a CPU test fails when it does not name the pinned commit with today's
  schemas (a pin bump not checked yet, or an edit here not checked against upstream);
* a GPU test checks that the compiled modules register exactly these schemas.

Example: ``torch._C.parse_schema(f"{FA3_NAMESPACE}::{FA3_FWD}")`` equals
``torch.ops._vendored_fa3_C.fwd.default._schema`` of a wheel built from the pin.
"""

from __future__ import annotations

# The op namespaces the families declare (cmake/knobs.json ``op_namespace``), written out here
# because cmake/vfa_build/knobs/op_schemas.py loads this file by path, before the package can be imported;
# tests/unit/test_op_schemas.py holds them to the declaration.
FA2_NAMESPACE = "_vendored_fa2_C"
FA3_NAMESPACE = "_vendored_fa3_C"
#: namespace -> upstream's source (in the flash-attention checkout) that registers its ops.
REGISTRATION_SOURCES = {
    FA2_NAMESPACE: "csrc/flash_attn/flash_api_torch_lib.cpp",
    FA3_NAMESPACE: "hopper/flash_api_torch_lib.cpp",
}

FA2_VARLEN_FWD = (
    "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, "
    "int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, "
    "bool is_causal, int window_size_left, int window_size_right, float softcap, bool return_softmax, "
    "int num_splits, Tensor? gen) -> Tensor[]")

FA3_FWD = (
    "fwd(Tensor!  q, Tensor   k, Tensor   v, Tensor?  k_new, Tensor?  v_new, Tensor?  q_v, "
    "Tensor!? out, Tensor?  cu_seqlens_q, Tensor?  cu_seqlens_k, Tensor?  cu_seqlens_k_new, "
    "Tensor?  seqused_q, Tensor?  seqused_k, int?     max_seqlen_q, int?     max_seqlen_k, "
    "Tensor?  page_table, Tensor?  kv_batch_idx, Tensor?  leftpad_k, Tensor?  rotary_cos, "
    "Tensor?  rotary_sin, Tensor?  seqlens_rotary, Tensor?  q_descale, Tensor?  k_descale, "
    "Tensor?  v_descale, float    softmax_scale, bool     is_causal, int      window_size_left, "
    "int      window_size_right, float    softcap, bool     is_rotary_interleaved, "
    "Tensor?  scheduler_metadata, int      num_splits, bool?    pack_gqa, int      sm_margin, "
    "Tensor?  s_aux, int      cp_world_size, int      cp_rank, Tensor?  cp_tot_seqused_k) -> Tensor[]")

FA3_GET_SCHEDULER_METADATA = (
    "get_scheduler_metadata(int      batch_size, int      max_seqlen_q, int      max_seqlen_k, "
    "int      num_heads, int      num_heads_k, int      headdim, int      headdim_v, "
    "ScalarType qkv_dtype, Tensor   seqused_k, Tensor?  cu_seqlens_q, Tensor?  cu_seqlens_k, "
    "Tensor?  cu_seqlens_k_new, Tensor?  seqused_q, Tensor?  leftpad_k, int?     page_size, "
    "int      max_seqlen_k_new, bool     is_causal, int      window_size_left, "
    "int      window_size_right, bool     has_softcap, int      num_splits, bool?    pack_gqa, "
    "int      sm_margin) -> Tensor")

FA2_FWD_SPARSE = (
    "fwd_sparse(Tensor! q, Tensor k, Tensor v, "
    "Tensor block_count, Tensor block_offset, Tensor column_count, Tensor column_index, "
    "Tensor!? out, Tensor? alibi_slopes, "
    "float p_dropout, float softmax_scale, bool is_causal, "
    "float softcap, bool return_softmax, Tensor? gen)"
    "-> Tensor[]")

FA2_VARLEN_FWD_SPARSE = (
    "varlen_fwd_sparse(Tensor! q, Tensor k, Tensor v, "
    "Tensor block_count, Tensor block_offset, Tensor column_count, Tensor column_index, "
    "Tensor!? out, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? alibi_slopes, "
    "int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, "
    "bool is_causal, float softcap, bool return_softmax, Tensor? gen) -> Tensor[]")

#: (namespace, op name) -> schema, for every op interface.py and sparse.py call.
OP_SCHEMAS = {
    (FA2_NAMESPACE, "varlen_fwd"): FA2_VARLEN_FWD,
    (FA2_NAMESPACE, "fwd_sparse"): FA2_FWD_SPARSE,
    (FA2_NAMESPACE, "varlen_fwd_sparse"): FA2_VARLEN_FWD_SPARSE,
    (FA3_NAMESPACE, "fwd"): FA3_FWD,
    (FA3_NAMESPACE, "get_scheduler_metadata"): FA3_GET_SCHEDULER_METADATA,
}

#: upstream commit -> fingerprint of OP_SCHEMAS (cmake/vfa_build/knobs/op_schemas.py) that upstream's
#: registration sources at that commit were checked to register. After a pin bump, run
#: ``python cmake/vfa_build knobs.op_schemas check <the new commit's flash-attention folder> --commit
#: <commit>`` (a configure of the new pin runs the same check) and add the entry it prints.
CHECKED_AGAINST = {
    "617264c1c7955c9e84817654ebeedff069f3c5f1": "bf27458a8f34f397752a77b2628a0e6745f0edbf22fca68a997fce9f95f01010",
}
