# The source check again at build time: the configure verified the sources
# (cmake/UpstreamVerify.cmake), but a build dir is rebuilt by `ninja` / `cmake --build`
# without a configure, so a file edited after the configure would be compiled (and
# FA4's files staged) under a build info that says matches_pin: true. The target
# vfa_verified_sources runs the same comparison (cmake/verify_sources.cmake) on every
# build, before anything reads the sources: every compiled module depends on it, and
# FA4's staging does too (cmake/FA4Package.cmake, `if(TARGET vfa_verified_sources)`).
#
# What it checks: each repository whose configure found it matching the pin (a cache
# entry, or a clean source dir at the pin); one the build info already records as
# matches_pin: false (a dirty or unverifiable source dir) claims nothing to hold to.
# When one differs the build stops before any compile, naming the files and the fix.
# It always runs (a check keyed on file times would miss an edit that keeps them); it
# rewrites its stamp, <build>/vfa_verified_sources.stamp (what was verified: each
# repository's name, folder and commit), only when that changes, and ninja restats it,
# so a no-op build rebuilds nothing because of it. What it costs on the real pin:
# README, "Where the upstream comes from".
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

set(VFA_VERIFIED_SOURCES_TARGET vfa_verified_sources)

# Adds the target vfa_verified_sources and makes each of <targets> depend on it.
# Call it after the sources are resolved, before FA4's package is added.
#   vfa_add_source_verification_target(_vendored_fa2_C _vendored_fa3_C)
#     ->  <build>/vfa_verified_sources.json; target vfa_verified_sources; stamp
#         <build>/vfa_verified_sources.stamp
function(vfa_add_source_verification_target)
  set(spec_file "${CMAKE_BINARY_DIR}/vfa_verified_sources.json")
  set(stamp "${CMAKE_BINARY_DIR}/vfa_verified_sources.stamp")
  vfa_find_git()
  set(spec "{}")
  vfa_json_set_text(spec "${GIT_EXECUTABLE}" git)
  string(JSON spec SET "${spec}" timeout ${VFA_FETCH_TIMEOUT})
  vfa_json_set_text(spec "${stamp}" stamp)
  string(JSON spec SET "${spec}" components "[]")
  set(i 0)
  foreach(component IN LISTS VFA_COMPONENTS)
    if(NOT VFA_${component}_MATCHES_PIN)
      continue()
    endif()
    set(entry "{}")
    vfa_json_set_text(entry "${component}" name)
    vfa_json_set_text(entry "${VFA_${component}_SOURCE_DIR}" dir)
    vfa_json_set_text(entry "${VFA_${component}_COMMIT}" commit)
    vfa_json_set_text(entry "${VFA_${component}_ORIGIN}" origin)
    string(JSON entry SET "${entry}" paths "[]")
    set(j 0)
    foreach(path IN LISTS VFA_PIN_${component}_PATHS)
      vfa_json_set_text(entry "${path}" paths ${j})
      math(EXPR j "${j} + 1")
    endforeach()
    string(JSON spec SET "${spec}" components ${i} "${entry}")
    math(EXPR i "${i} + 1")
  endforeach()
  set(written "")
  if(EXISTS "${spec_file}")
    file(READ "${spec_file}" written)
  endif()
  if(NOT written STREQUAL "${spec}\n")
    file(WRITE "${spec_file}" "${spec}\n")
  endif()
  add_custom_target(${VFA_VERIFIED_SOURCES_TARGET}
    COMMAND "${CMAKE_COMMAND}" "-DVFA_VERIFY_SPEC=${spec_file}" -P "${VFA_PROJECT_DIR}/cmake/verify_sources.cmake"
    BYPRODUCTS "${stamp}"
    COMMENT "Verifying the upstream sources against the pin"
    VERBATIM)
  foreach(target IN LISTS ARGN)
    add_dependencies(${target} ${VFA_VERIFIED_SOURCES_TARGET})
  endforeach()
endfunction()
