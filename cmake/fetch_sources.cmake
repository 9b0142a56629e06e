# Script entry point: resolve (and fetch if needed) the pinned sources without
# configuring a build, then print one JSON line per component.
#   cmake [-DVFA_SOURCE_CACHE=...] [-DFLASH_ATTN_MIRROR=...] -P cmake/fetch_sources.cmake
# Useful to fill the source cache before an offline build, and used by the tests.
# Relative paths are taken from the project directory, as in a configure.
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamSources.cmake)
vfa_check_unknown_settings()
vfa_resolve_upstream_sources()
foreach(component IN LISTS VFA_COMPONENTS)
  set(fields "")
  foreach(key MATCHES_PIN VERIFIED DIRTY)
    string(TOLOWER "${key}" name)
    if("${VFA_${component}_${key}}" STREQUAL "")
      set(value null)
    elseif(VFA_${component}_${key})
      set(value true)
    else()
      set(value false)
    endif()
    string(APPEND fields ", \"${name}\": ${value}")
  endforeach()
  message(NOTICE "VFA_SOURCE {\"name\": \"${component}\", \"source_dir\": \"${VFA_${component}_SOURCE_DIR}\", "
    "\"commit\": \"${VFA_${component}_COMMIT}\"${fields}, "
    "\"origin\": \"${VFA_${component}_ORIGIN}\", \"url\": \"${VFA_${component}_URL}\"}")
endforeach()
