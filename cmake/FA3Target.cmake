# FA3's module (_vendored_fa3_C, declared in cmake/knobs.json): upstream's FA3 forward kernels (hopper/) for sm_90a,
# including FP8 (e4m3).

include_guard(GLOBAL)

function(vfa_add_fa3_target)
  set(root "${VFA_flash_attention_SOURCE_DIR}")
  vfa_fa3_selection("${VFA_FA3_HEAD_DIMS}" "${VFA_FA3_DTYPES}" "${VFA_FA3_FEATURES}")
  vfa_check_instantiations(FA3 "${root}" ${VFA_FA3_INSTANTIATIONS})
  set(sources
    "${root}/hopper/flash_api.cpp"
    "${root}/hopper/flash_api_torch_lib.cpp"
    "${root}/hopper/flash_fwd_combine.cu"
    "${root}/hopper/flash_prepare_scheduler.cu")
  foreach(rel IN LISTS VFA_FA3_INSTANTIATIONS)
    list(APPEND sources "${root}/${rel}")
  endforeach()
  # As upstream's CMakeLists.txt, and only verified folders (never csrc/ itself).
  vfa_verified_include_dirs(fa_includes flash_attention hopper csrc/common)
  vfa_verified_include_dirs(cutlass_includes cutlass include)
  vfa_family_field(module fa3 module "")  # cmake/knobs.json
  vfa_add_torch_extension(${module}
    SOURCES ${sources}
    GENCODE ${VFA_FA3_GENCODE}
    DEFINES ${VFA_FA3_DEFINES}
    INCLUDE_DIRS ${fa_includes} ${cutlass_includes})
  # Measured peaks (docs/PERFORMANCE.md): FA3 CUDA units up to 8.1 GB in cicc, the heaviest of
  # the build, so cmake/Parallelism.cmake budgets them at the whole VFA_JOB_MEMORY_MB.
  set_property(TARGET ${module} PROPERTY VFA_CUDA_UNIT_MEMORY_SIXTEENTHS 16)
  # Progress estimate (cmake/build_monitor.py), cold, one unit per core on the 16-core H200
  # build machine (docs/PERFORMANCE.md, "Build"): instantiations 153 s on average; the combine
  # and scheduler units (89 s and 18 s there) are their own kind, so a quick one finishing
  # first does not set the expected time of the instantiations. The FP8 paged instantiations
  # are a kind of their own: 5.5-6.5 min on the 2-core CPU machine against 2-3.5 min for the
  # other FA3 units (issue 29), where the H200 machine took 158-255 s for them against 111-264 s:
  # their reference is the other instantiations' times that machine's ratio, so that a small
  # machine expects them before one has finished (the estimate then takes their own time).
  # The last figure: seconds when the compiler cache answers, on an idle machine (2-core CPU
  # machine, 2026-12-02, a warm `minimal` rebuild, each unit's time over the machine's slowdown
  # while it ran: instantiations 5.7-6.8 s, FP8 paged 4.8-5.4 s, combine and scheduler 5.4-5.6 s).
  vfa_unit_kind(${module} "FA3 CUDA, FP8 paged" 330 "_e4m3_paged" 5.1)
  vfa_unit_kind(${module} "FA3 CUDA" 153 "/instantiations/" 6.2)
  vfa_unit_kind(${module} "FA3 CUDA, other" 54 "" 5.5)
  list(LENGTH VFA_FA3_INSTANTIATIONS n)
  set(VFA_FA3_SOURCE_COUNT ${n} PARENT_SCOPE)
  set(VFA_FA3_INSTANTIATIONS "${VFA_FA3_INSTANTIATIONS}" PARENT_SCOPE)
  set(VFA_FA3_DEFINES "${VFA_FA3_DEFINES}" PARENT_SCOPE)
endfunction()
