# Script entry point: resolve (and fetch if needed) the pinned sources without
# configuring a build, then print one JSON line per component.
#   cmake [-DVFA_SOURCE_CACHE=...] [-DFLASH_ATTN_MIRROR=...] -P cmake/fetch_sources.cmake
# Useful to fill the source cache before an offline build, and used by the tests.
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamSources.cmake)
vfa_warn_unknown_settings()
vfa_resolve_upstream_sources()
foreach(component IN LISTS VFA_COMPONENTS)
  if(VFA_${component}_MATCHES_PIN)
    set(matches true)
  else()
    set(matches false)
  endif()
  message(NOTICE "VFA_SOURCE {\"name\": \"${component}\", \"source_dir\": \"${VFA_${component}_SOURCE_DIR}\", "
    "\"commit\": \"${VFA_${component}_COMMIT}\", \"matches_pin\": ${matches}, "
    "\"origin\": \"${VFA_${component}_ORIGIN}\", \"url\": \"${VFA_${component}_URL}\"}")
endforeach()
