# Split compile: the units that set a cold build's floor, compiled with nvcc's --split-compile
# and started first (issue 46).
#
# A cold build's end is set by its longest units when they are longer than the build's whole
# work spread over its jobs: on the 16-core H100 (2026-12-07) `minimal` took 335 s, and one
# FA2 split-KV unit alone 305 s of it; the same unit with `nvcc --split-compile=0` took 177 s
# (issue 46). The split objects differ in their SASS, so the
# default is `off` until the GPU proof (issue 46, item 3) is done.
#
#   VFA_NVCC_SPLIT_COMPILE  off (default): today's compile lines and order, nothing changes.
#                           auto: the critical units (below) get --split-compile=N, N from the
#                           cores and the memory plan; none when N comes out below 2.
#                           <N> (0-64): the critical units get --split-compile=<N> (0: nvcc's own,
#                           as many threads as the machine has).
#
# The critical units: every CUDA unit of the built modules has a kind with reference seconds
# (vfa_unit_kind, cmake/BuildProgress.cmake; the families' build.unit_kinds in cmake/knobs.json).
# The ideal end of the build is the sum of those seconds over the compile jobs (VFA_JOBS,
# cmake/Parallelism.cmake); a unit whose kind's seconds reach it is one the build waits for. The
# threshold is that ideal end, or the heaviest kind's seconds where they are below it (a build
# with more work than jobs: then its heaviest kind alone), so the set is never empty:
#   minimal on 16 jobs: (4 x 311 + 2 x 189 + 2 x 330 + 6 x 153 + 2 x 54) / 16 = 206 s: the four FA2
#   split-KV units (311 s) and the two FA3 FP8 paged instantiations (330 s).
#
# N for auto: the critical units (H of them) share the cores and the memory when they run last:
#   N = min(8, cores / (H x NVCC_THREADS), VFA_BUILD_MEMORY_MB / (H x the heaviest one's budget))
# the budget being its memory per job in cmake/Parallelism.cmake (VFA_JOB_MEMORY_MB x its family's
# sixteenths x NVCC_THREADS); 8 because 8 threads measured as fast as nvcc's own count (182 s
# against 177 s). Each split thread is budgeted like the whole unit: a split part compiles less.
# On the 2-core CPU machine N = 0, so auto splits nothing there; on the 16-core H100 machine
# (about 120 GB free) `minimal`'s 6 critical units get N = min(8, 16 / 6, 120000 / (6 x 8192)) = 2.
#
# Where it goes: each chosen unit's own COMPILE_OPTIONS (never a target or global flag), so it is
# on that unit's compile line, and so in the compiler cache's key (sccache hashes the arguments).
# Longest first: with auto or a number, each module's sources are ordered by their kind's
# seconds, longest first (stable): ninja starts the ready compiles of a pool in the manifest's
# order, which is the sources' order. `off` keeps today's order.
# Recorded in build_info.json (both records: it decides the objects): split_compile =
#   {"knob": ..., "threads": N or null, "units": ["<module>:<file name>", ...], "reason": ...}
#
# Example: vfa_setup_split_compile(_vendored_fa2_C _vendored_fa3_C), after vfa_setup_job_pool.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(VFA_SPLIT_COMPILE_MAX_AUTO 8)

# The declared kind's reference seconds (whole) of <source> of <target>: the first kind whose
# path text it holds; 0 for a source no kind matches (C++ units).
function(_vfa_unit_seconds out target source)
  set(seconds 0)
  if(source MATCHES "\\.cu$")
    get_target_property(kinds ${target} VFA_UNIT_KINDS)
    foreach(kind IN LISTS kinds)
      if(NOT kind)
        continue()
      endif()
      string(REPLACE "|" ";" fields "${kind}")
      list(GET fields 2 s)
      list(GET fields 3 contains)
      string(FIND "${source}" "${contains}" at)
      if(contains STREQUAL "" OR at GREATER -1)
        string(REGEX REPLACE "\\..*$" "" seconds "${s}")
        break()
      endif()
    endforeach()
  endif()
  set(${out} ${seconds} PARENT_SCOPE)
endfunction()

function(vfa_setup_split_compile)
  vfa_option(VFA_NVCC_SPLIT_COMPILE)
  string(TOLOWER "${VFA_NVCC_SPLIT_COMPILE}" knob)
  if(NOT knob MATCHES "^(auto|off|[0-9]+)$" OR (knob MATCHES "^[0-9]+$" AND knob GREATER 64))
    vfa_option_origin(origin VFA_NVCC_SPLIT_COMPILE)
    vfa_knob_refuse(VFA_NVCC_SPLIT_COMPILE "${VFA_NVCC_SPLIT_COMPILE}" "${origin}"
      "auto, off, or a thread count from 0 to 64")
  endif()
  string(REGEX REPLACE "^0+([0-9])" "\\1" knob "${knob}")
  set(VFA_SPLIT_COMPILE_KNOB "${knob}" PARENT_SCOPE)
  set(VFA_SPLIT_COMPILE_THREADS "" PARENT_SCOPE)
  set(VFA_SPLIT_COMPILE_UNITS "" PARENT_SCOPE)
  if(knob STREQUAL "off")
    set(VFA_SPLIT_COMPILE_REASON "VFA_NVCC_SPLIT_COMPILE=off" PARENT_SCOPE)
    message(STATUS "vendored-flash-attn: nvcc --split-compile: off")
    return()
  endif()

  # Every CUDA unit's seconds; the ideal end of the build.
  set(total 0)
  set(heaviest 0)
  foreach(target IN LISTS ARGN)
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      _vfa_unit_seconds(s ${target} "${source}")
      math(EXPR total "${total} + ${s}")
      if(s GREATER heaviest)
        set(heaviest ${s})
      endif()
    endforeach()
  endforeach()
  math(EXPR ideal "${total} / ${VFA_JOBS}")
  set(threshold ${ideal})
  if(heaviest LESS threshold)
    set(threshold ${heaviest})
  endif()

  # The critical units, their count and the heaviest one's memory budget; each module's sources
  # longest first (a stable sort: equal seconds keep their order).
  set(chosen "")
  set(count 0)
  set(budget 0)
  foreach(target IN LISTS ARGN)
    get_target_property(sources ${target} SOURCES)
    get_target_property(sixteenths ${target} VFA_CUDA_UNIT_MEMORY_SIXTEENTHS)
    if(NOT sixteenths)
      set(sixteenths 16)
    endif()
    math(EXPR unit_mb "(${VFA_JOB_MEMORY_MB} * ${sixteenths} + 15) / 16 * ${NVCC_THREADS}")
    set(keyed "")
    set(i 0)
    foreach(source IN LISTS sources)
      _vfa_unit_seconds(s ${target} "${source}")
      if(s GREATER 0 AND NOT s LESS threshold)
        list(APPEND chosen_${target} "${source}")
        get_filename_component(name "${source}" NAME)
        list(APPEND chosen "${target}:${name}")
        math(EXPR count "${count} + 1")
        if(unit_mb GREATER budget)
          set(budget ${unit_mb})
        endif()
      endif()
      # Sort key: (99999 - seconds, position), zero-padded, so NATURAL order is longest first.
      math(EXPR key "99999 - ${s}")
      string(LENGTH "${key}" n)
      math(EXPR pad_n "5 - ${n}")
      string(REPEAT "0" ${pad_n} pad)
      string(LENGTH "${i}" n)
      math(EXPR pad_i "6 - ${n}")
      string(REPEAT "0" ${pad_i} pad2)
      list(APPEND keyed "${pad}${key}|${pad2}${i}|${source}")
      math(EXPR i "${i} + 1")
    endforeach()
    list(SORT keyed)
    set(ordered "")
    foreach(entry IN LISTS keyed)
      string(REGEX REPLACE "^[0-9]+\\|[0-9]+\\|" "" source "${entry}")
      list(APPEND ordered "${source}")
    endforeach()
    set_property(TARGET ${target} PROPERTY SOURCES "${ordered}")
  endforeach()

  if(count EQUAL 0)
    set(VFA_SPLIT_COMPILE_REASON "${knob}: no CUDA unit in this build" PARENT_SCOPE)
    message(STATUS "vendored-flash-attn: nvcc --split-compile: no CUDA unit to split")
    return()
  endif()
  if(knob STREQUAL "auto")
    cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
    math(EXPR by_cores "${cores} / (${count} * ${NVCC_THREADS})")
    math(EXPR by_memory "${VFA_BUILD_MEMORY_MB} / (${count} * ${budget})")
    set(threads ${VFA_SPLIT_COMPILE_MAX_AUTO})
    foreach(n ${by_cores} ${by_memory})
      if(n LESS threads)
        set(threads ${n})
      endif()
    endforeach()
    string(CONCAT reason "auto: ${count} units at or above ${threshold} s (the build's ${total} s over ${VFA_JOBS} jobs: "
               "${ideal} s); ${cores} cores give ${by_cores} threads each, ${VFA_BUILD_MEMORY_MB} MB at "
               "${budget} MB a thread ${by_memory}, at most ${VFA_SPLIT_COMPILE_MAX_AUTO}")
    if(threads LESS 2)
      set(VFA_SPLIT_COMPILE_REASON "${reason}: ${threads}, so no unit is split" PARENT_SCOPE)
      message(STATUS "vendored-flash-attn: nvcc --split-compile: none (${reason}: ${threads}); longest units first")
      return()
    endif()
  else()
    set(threads ${knob})
    string(CONCAT reason "VFA_NVCC_SPLIT_COMPILE=${knob}: ${count} units at or above ${threshold} s (the build's ${total} s "
               "over ${VFA_JOBS} jobs: ${ideal} s)")
  endif()

  foreach(target IN LISTS ARGN)
    foreach(source IN LISTS chosen_${target})
      set_property(SOURCE "${source}" APPEND PROPERTY COMPILE_OPTIONS "--split-compile=${threads}")
    endforeach()
  endforeach()
  string(REPLACE ";" ", " named "${chosen}")
  message(STATUS "vendored-flash-attn: nvcc --split-compile=${threads} for ${named} (${reason}); longest units first")
  set(VFA_SPLIT_COMPILE_THREADS ${threads} PARENT_SCOPE)
  set(VFA_SPLIT_COMPILE_UNITS "${chosen}" PARENT_SCOPE)
  set(VFA_SPLIT_COMPILE_REASON "${reason}" PARENT_SCOPE)
endfunction()
