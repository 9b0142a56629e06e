# Parallelism: a memory-aware job pool for the compiles of our modules.
# FA2/FA3 translation units take several GB each (measured peaks: FA2 4.4 GB per
# unit and gencode thread, FA3 hdim-128 instantiations 8.1 GB in cicc), so running
# one per core can exhaust a build machine. Ninja honours the pool whatever -j it
# is given.
#
#   MAX_JOBS            compile jobs (default: min(cores, memory / per-job))
#   NVCC_THREADS        nvcc --threads per unit (parallel gencode targets)
#   VFA_JOB_MEMORY_MB   memory budget per job and nvcc thread (default 8192)

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(VFA_JOB_POOL vfa_compile)

function(vfa_setup_job_pool)
  vfa_option(MAX_JOBS "" "parallel compile jobs")
  vfa_option(NVCC_THREADS "1" "nvcc --threads per translation unit")
  vfa_option(VFA_JOB_MEMORY_MB "8192" "memory per compile job and nvcc thread")
  foreach(knob NVCC_THREADS VFA_JOB_MEMORY_MB)
    if(NOT "${${knob}}" MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "${knob} must be a positive integer, got '${${knob}}'.")
    endif()
  endforeach()

  cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
  cmake_host_system_information(RESULT avail_mb QUERY AVAILABLE_PHYSICAL_MEMORY)
  math(EXPR per_job_mb "${VFA_JOB_MEMORY_MB} * ${NVCC_THREADS}")
  math(EXPR by_memory "${avail_mb} / ${per_job_mb}")
  if(by_memory LESS 1)
    set(by_memory 1)
  endif()
  set(by_cores ${cores})
  if(NVCC_THREADS GREATER 1)
    math(EXPR by_cores "(${cores} + ${NVCC_THREADS} - 1) / ${NVCC_THREADS}")
  endif()

  if(NOT "${MAX_JOBS}" STREQUAL "")
    if(NOT "${MAX_JOBS}" MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "MAX_JOBS must be a positive integer, got '${MAX_JOBS}'.")
    endif()
    set(jobs ${MAX_JOBS})
    set(why "MAX_JOBS")
    if(jobs GREATER by_memory)
      message(WARNING
        "MAX_JOBS=${MAX_JOBS} may need about ${per_job_mb} MB each, more than the "
        "${avail_mb} MB available (room for ${by_memory}). Lower MAX_JOBS if the build is killed.")
    endif()
  else()
    set(jobs ${by_cores})
    set(why "cores")
    if(by_memory LESS jobs)
      set(jobs ${by_memory})
      set(why "memory: ${avail_mb} MB available, ~${per_job_mb} MB per job")
    endif()
  endif()

  set_property(GLOBAL APPEND PROPERTY JOB_POOLS ${VFA_JOB_POOL}=${jobs})
  set(VFA_JOBS ${jobs} PARENT_SCOPE)
  set(VFA_JOBS_REASON "${why}" PARENT_SCOPE)
  set(VFA_NVCC_THREADS ${NVCC_THREADS} PARENT_SCOPE)
  message(STATUS "vendored-flash-attn: ${jobs} compile jobs (${why}), nvcc --threads ${NVCC_THREADS}")
endfunction()
