# How long a unit may take on an sccache-dist cluster before the build compiles it here
# (cmake/vfa_build/cluster/dist_bound.py): VFA_DIST_UNIT_TIMEOUT seconds, or (0, the default) 4 times the
# unit's expected time and at least 120 s. The expected times are the kinds of units each
# module declares (vfa_unit_kind, cmake/BuildProgress.cmake), the table the progress
# monitor reads. Written into <build>/vfa-dist-bounds.json, which the compiler launcher
# reads per unit (cmake/vfa_build/compiler_cache/sccache_launcher.py).

include_guard(GLOBAL)

#   vfa_write_dist_bounds(_vendored_fa2_C _vendored_fa3_C)
#     ->  <build>/vfa-dist-bounds.json = {"timeout": 0, "kinds": ["_vendored_fa3_C|FA3 CUDA|153|/instantiations/", ...]}
function(vfa_write_dist_bounds)
  vfa_option(VFA_DIST_UNIT_TIMEOUT)
  set(json "{}")
  string(JSON json SET "${json}" timeout ${VFA_DIST_UNIT_TIMEOUT})
  string(JSON json SET "${json}" kinds "[]")
  set(i 0)
  foreach(target IN LISTS ARGN)
    get_target_property(kinds ${target} VFA_UNIT_KINDS)
    if(NOT kinds)
      continue()
    endif()
    foreach(kind IN LISTS kinds)
      vfa_json_set_text(json "${kind}" kinds ${i})
      math(EXPR i "${i} + 1")
    endforeach()
  endforeach()
  set(file "${CMAKE_BINARY_DIR}/vfa-dist-bounds.json")
  set(written "")
  if(EXISTS "${file}")
    file(READ "${file}" written)
  endif()
  if(NOT written STREQUAL "${json}\n")
    file(WRITE "${file}" "${json}\n")
  endif()
endfunction()
