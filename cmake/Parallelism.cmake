# Parallelism: a memory-aware job pool for the compiles of our modules.
# Translation units take very different amounts of memory (measured peaks, see
# docs/PERFORMANCE.md: FA3 CUDA units up to 8.1 GB in cicc, FA2 CUDA units 4.4 GB,
# C++ units 0.3 GB), so running one per core can exhaust a build machine, while
# budgeting every unit like the heaviest one leaves cores idle. The pool admits as
# many jobs as the heaviest units of this build could run side by side in the
# memory available. Ninja honours the pool whatever -j it is given.
#
#   MAX_JOBS            compile jobs (default: min(cores, what memory allows))
#   NVCC_THREADS        nvcc --threads per unit (parallel gencode targets)
#   VFA_JOB_MEMORY_MB   memory budget of an FA3 CUDA unit per nvcc thread (default
#                       8192); FA2 CUDA units get 9/16 of it, C++ units 1/8 (the
#                       measured proportions, rounded up)
#   VFA_BUILD_MEMORY_MB memory the compiles may use (default: the available physical
#                       memory; set it where a container limit is lower)
#   VFA_DIST_JOBS       compile jobs for sccache-dist build servers, on top of the local
#                       ones (default: the build servers' cores, as the scheduler reports
#                       them, when it answers and a probe compile ran there; 0: none)
#
# With a scheduler (cmake/CompilerCache.cmake found one that works) the pool is the
# local jobs plus VFA_DIST_JOBS: the scheduler gives each build server about one
# job per core (dist-compile/README.md says how a server is held to what its memory
# allows), and compiles it has no room for run here, which the local share is sized
# for. The client-side steps of remote compiles (preprocessing, cudafe++) run inside
# the client's sccache server, which runs at most one process per client core
# whatever ninja's pool is. Example: 16 cores and 64 GB here, a cluster of 4 servers
# with 28 cores each: 7 + 112 = 119 jobs.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(VFA_JOB_POOL vfa_compile)

# Before the targets: nvcc --threads goes into their flags.
function(vfa_read_parallelism_options)
  # Types and ranges are checked by vfa_option (cmake/knobs.json).
  vfa_option(MAX_JOBS)
  vfa_option(NVCC_THREADS)
  vfa_option(VFA_JOB_MEMORY_MB)
  cmake_host_system_information(RESULT avail_mb QUERY AVAILABLE_PHYSICAL_MEMORY)
  vfa_option(VFA_BUILD_MEMORY_MB DEFAULT ${avail_mb})
  vfa_option(VFA_DIST_JOBS)
  set(VFA_DIST_JOBS "${VFA_DIST_JOBS}" PARENT_SCOPE)
  foreach(knob MAX_JOBS NVCC_THREADS VFA_JOB_MEMORY_MB VFA_BUILD_MEMORY_MB)
    set(${knob} "${${knob}}" PARENT_SCOPE)
  endforeach()
  set(VFA_NVCC_THREADS ${NVCC_THREADS} PARENT_SCOPE)
endfunction()

# vfa_unit_memory_budgets(<out> <target>...): one budget in MB per compiled source. A
# CUDA unit gets the share of VFA_JOB_MEMORY_MB (per nvcc thread) its target declares in
# sixteenths, VFA_CUDA_UNIT_MEMORY_SIXTEENTHS (each compiled family's build.memory_sixteenths in
# cmake/knobs.json, set by cmake/FamilyTarget.cmake: 16 and 9 today),
# or the whole of it when none is declared; a C++ unit 1/8.
function(vfa_unit_memory_budgets out)
  math(EXPR host "(${VFA_JOB_MEMORY_MB} + 7) / 8")
  set(budgets "")
  foreach(target IN LISTS ARGN)
    get_target_property(sixteenths ${target} VFA_CUDA_UNIT_MEMORY_SIXTEENTHS)
    if(NOT sixteenths)
      set(sixteenths 16)
    endif()
    math(EXPR cuda "(${VFA_JOB_MEMORY_MB} * ${sixteenths} + 15) / 16 * ${NVCC_THREADS}")
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.cu$")
        list(APPEND budgets ${cuda})
      elseif(source MATCHES "\\.(cpp|cc|cxx)$")
        list(APPEND budgets ${host})
      endif()
    endforeach()
  endforeach()
  set(${out} "${budgets}" PARENT_SCOPE)
endfunction()

# After the targets: vfa_setup_job_pool(<target>...) sizes the pool from their units.
function(vfa_setup_job_pool)
  cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
  set(avail_mb ${VFA_BUILD_MEMORY_MB})
  set(by_cores ${cores})
  if(NVCC_THREADS GREATER 1)
    math(EXPR by_cores "(${cores} + ${NVCC_THREADS} - 1) / ${NVCC_THREADS}")
  endif()

  # The largest n whose n heaviest units fit in memory together: no n units of this
  # build can then need more than is available.
  vfa_unit_memory_budgets(budgets ${ARGN})
  list(SORT budgets COMPARE NATURAL ORDER DESCENDING)
  set(by_memory 0)
  set(heaviest_mb 0)
  foreach(mb IN LISTS budgets)
    math(EXPR next "${heaviest_mb} + ${mb}")
    if(next GREATER avail_mb)
      break()
    endif()
    set(heaviest_mb ${next})
    math(EXPR by_memory "${by_memory} + 1")
  endforeach()
  if(by_memory LESS 1)
    set(by_memory 1)
  endif()

  # Build servers: only when a scheduler answered and a probe compile ran there.
  set(remote 0)
  if(VFA_DIST_STATE STREQUAL "connected")
    set(remote ${VFA_DIST_CPUS})
    if(NOT "${VFA_DIST_JOBS}" STREQUAL "")
      set(remote ${VFA_DIST_JOBS})
    endif()
  elseif(NOT "${VFA_DIST_JOBS}" STREQUAL "" AND VFA_DIST_JOBS GREATER 0)
    message(WARNING "VFA_DIST_JOBS=${VFA_DIST_JOBS} is ignored: no sccache-dist scheduler works for "
      "this build (compiler cache: ${VFA_COMPILER_CACHE_NOTE}, scheduler: ${VFA_DIST_STATE}).")
  endif()

  if(NOT "${MAX_JOBS}" STREQUAL "")
    set(jobs ${MAX_JOBS})
    set(why "MAX_JOBS")
    math(EXPR fit "${by_memory} + ${remote}")
    if(jobs GREATER fit)
      message(WARNING
        "MAX_JOBS=${MAX_JOBS} may need more than the ${avail_mb} MB available (the "
        "heaviest units of this build fit ${by_memory} at a time here, plus ${remote} on build "
        "servers). Lower MAX_JOBS if the build is killed.")
    endif()
  else()
    set(jobs ${by_cores})
    set(why "cores")
    if(by_memory LESS jobs)
      set(jobs ${by_memory})
      set(why "memory: ${avail_mb} MB available, the ${jobs} heaviest units need ~${heaviest_mb} MB")
    endif()
    if(remote GREATER 0)
      math(EXPR jobs "${jobs} + ${remote}")
      set(why "${why}; + ${remote} on sccache-dist build servers")
    endif()
  endif()

  set_property(GLOBAL APPEND PROPERTY JOB_POOLS ${VFA_JOB_POOL}=${jobs})
  set(VFA_JOBS ${jobs} PARENT_SCOPE)
  set(VFA_JOBS_REASON "${why}" PARENT_SCOPE)
  set(VFA_JOBS_BY_MEMORY ${by_memory} PARENT_SCOPE)
  set(VFA_DIST_REMOTE_JOBS ${remote} PARENT_SCOPE)
  message(STATUS "vendored-flash-attn: ${jobs} compile jobs (${why}), nvcc --threads ${NVCC_THREADS}")
endfunction()
