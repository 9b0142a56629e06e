# FA2's module (_vendored_fa2_C, declared in cmake/knobs.json): upstream's FA2 forward kernels (csrc/flash_attn) for sm80+.

include_guard(GLOBAL)

function(vfa_add_fa2_target)
  set(root "${VFA_flash_attention_SOURCE_DIR}")
  vfa_fa2_selection("${VFA_FA2_HEAD_DIMS}" "${VFA_FA2_DTYPES}" "${VFA_FA2_FEATURES}")
  vfa_check_instantiations(FA2 "${root}" ${VFA_FA2_INSTANTIATIONS})
  set(sources
    "${root}/csrc/flash_attn/flash_api.cpp"
    "${root}/csrc/flash_attn/flash_api_sparse.cpp"
    "${root}/csrc/flash_attn/flash_api_torch_lib.cpp")
  foreach(rel IN LISTS VFA_FA2_INSTANTIATIONS)
    list(APPEND sources "${root}/${rel}")
  endforeach()
  if(VFA_FA2_MISSING)
    vfa_write_fa2_stubs(stubs "${CMAKE_BINARY_DIR}/generated")
    list(APPEND sources "${stubs}")
    # Its error messages name it (__FILE__, in STD_TORCH_CHECK): by a path that is the
    # same in every build dir, or two builds of one selection differ in their bytes.
    set_source_files_properties("${stubs}" PROPERTIES COMPILE_OPTIONS
      "$<$<CXX_COMPILER_ID:GNU,Clang>:-fmacro-prefix-map=${CMAKE_BINARY_DIR}/generated=vendored-flash-attn-generated>")
  endif()
  # As upstream's CMakeLists.txt, and only verified folders (never csrc/ itself).
  vfa_verified_include_dirs(fa_includes flash_attention csrc/flash_attn csrc/flash_attn/src csrc/common)
  vfa_verified_include_dirs(cutlass_includes cutlass include)
  vfa_family_field(module fa2 module "")  # cmake/knobs.json
  vfa_add_torch_extension(${module}
    SOURCES ${sources}
    GENCODE ${VFA_FA2_GENCODE}
    DEFINES ${VFA_FA2_DEFINES}
    INCLUDE_DIRS ${fa_includes} ${cutlass_includes})
  # Measured peaks (docs/PERFORMANCE.md): FA2 CUDA units 4.4 GB in cicc, FA3's 8.1 GB, so
  # cmake/Parallelism.cmake budgets this module's CUDA units at 9/16 of VFA_JOB_MEMORY_MB.
  set_property(TARGET ${module} PROPERTY VFA_CUDA_UNIT_MEMORY_SIXTEENTHS 9)
  # Progress estimate (cmake/build_monitor.py), cold, one unit per core on the 16-core H200
  # build machine (docs/PERFORMANCE.md, "Build"): instantiations 189 s on average; the split-KV
  # ones are their own kind (one ran 6:17 there while the estimate, from the other FA2 units,
  # said "about 10 s left"), at the longest of them, 311 s.
  # The last figure: seconds when the compiler cache answers, on an idle machine (2-core CPU
  # machine, 2026-12-02, a warm `minimal` rebuild, each unit's time over the machine's slowdown
  # while it ran: 4.7-7.4 s).
  vfa_unit_kind(${module} "FA2 CUDA, split-KV" 311 "flash_fwd_split_" 5.9)
  vfa_unit_kind(${module} "FA2 CUDA" 189 "" 5.0)
  list(LENGTH VFA_FA2_INSTANTIATIONS n)
  set(VFA_FA2_SOURCE_COUNT ${n} PARENT_SCOPE)
  set(VFA_FA2_INSTANTIATIONS "${VFA_FA2_INSTANTIATIONS}" PARENT_SCOPE)
endfunction()
