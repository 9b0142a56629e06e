# Script entry point: resolve (and fetch if needed) the pinned sources without
# configuring a build, then print one JSON line per component.
#   .venv/bin/cmake [-DVFA_SOURCE_CACHE=...] [-DFLASH_ATTN_MIRROR=...] -P cmake/fetch_sources.cmake
# (CMake >= 3.26: the one .ci/bootstrap installs; a system cmake may be older).
# Useful to fill the source cache before an offline build, and used by the tests.
# Relative paths are taken from the project directory, as in a configure.
if(CMAKE_VERSION VERSION_LESS 3.26)
  # Said before cmake_minimum_required, whose message names neither the cmake run nor a fix.
  message(FATAL_ERROR "This script needs CMake 3.26 or newer; ${CMAKE_COMMAND} is ${CMAKE_VERSION}. "
    "Run it with the cmake that .ci/bootstrap installs: .venv/bin/cmake -P cmake/fetch_sources.cmake "
    "(or pip install 'cmake>=3.26').")
endif()
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamSources.cmake)
vfa_check_unknown_settings()
vfa_resolve_upstream_sources()
# One JSON line per component, written by CMake's JSON writer (a path or URL with '\\' or
# '"' stays readable).
foreach(component IN LISTS VFA_COMPONENTS)
  set(record "{}")
  vfa_json_set_text(record "${component}" name)
  # source_dir: where it came from (the cache entry, a source dir); staged_dir: what a build reads.
  vfa_json_set_text(record "${VFA_${component}_FROM_DIR}" source_dir)
  vfa_json_set_text(record "${VFA_${component}_SOURCE_DIR}" staged_dir)
  vfa_json_set_text(record "${VFA_${component}_COMMIT}" commit)
  foreach(key MATCHES_PIN VERIFIED DIRTY)
    string(TOLOWER "${key}" name)
    if("${VFA_${component}_${key}}" STREQUAL "")
      set(value null)
    elseif(VFA_${component}_${key})
      set(value true)
    else()
      set(value false)
    endif()
    string(JSON record SET "${record}" ${name} ${value})
  endforeach()
  vfa_json_set_text(record "${VFA_${component}_ORIGIN}" origin)
  vfa_json_set_text(record "${VFA_${component}_URL}" url)
  string(REPLACE "\n" " " record "${record}")
  message(NOTICE "VFA_SOURCE ${record}")
endforeach()
