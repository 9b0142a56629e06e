# What the build trusts of objects from an sccache-dist cluster (cmake/vfa_build/cluster/dist_trust.py,
# dist-compile/README.md "Trust model"): VFA_DIST_VERIFY=N compiles one unit in N of those
# the cluster builds again here (drawn with a secret of each build; at least one per build and
# per build server) and stops the build when an object differs. The number
# goes into <build>/vfa-dist-verify.json, which the compiler launcher reads per unit
# (cmake/vfa_build/compiler_cache/sccache_launcher.py -> dist_trust.verify_unit). The shared cache's read-only mode
# for such builds is set where the build's sccache servers are (cmake/vfa_build/compiler_cache/compiler_cache_probe.py).

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

#   vfa_write_dist_trust()  ->  <build>/vfa-dist-verify.json = {"every": 10} with VFA_DIST_VERIFY=10
function(vfa_write_dist_trust)
  vfa_option(VFA_DIST_VERIFY)
  set(content "{\"every\": ${VFA_DIST_VERIFY}}\n")
  set(file "${CMAKE_BINARY_DIR}/vfa-dist-verify.json")
  set(written "")
  if(EXISTS "${file}")
    file(READ "${file}" written)
  endif()
  if(NOT written STREQUAL content)
    file(WRITE "${file}" "${content}")
  endif()
  # The objects a cluster built in this build dir stay only for a build that takes them on the
  # same terms (dist_trust.py reconcile): otherwise removed here, and compiled again before linking.
  if(VFA_COMPILER_CACHE_ENABLED)
    set(enabled 1)
  else()
    set(enabled 0)
  endif()
  execute_process(COMMAND "${Python_EXECUTABLE}" "${VFA_BUILD_PY}" cluster.dist_trust reconcile
                          "${CMAKE_BINARY_DIR}" ${enabled}
                  OUTPUT_VARIABLE removed RESULT_VARIABLE failed)
  if(failed)
    message(FATAL_ERROR "vendored-flash-attn: cluster.dist_trust reconcile failed (${failed}): the objects an "
      "sccache-dist cluster built in ${CMAKE_BINARY_DIR} could not be checked; remove that build dir")
  elseif(removed)
    message(STATUS "vendored-flash-attn: ${removed}")
  endif()
  # VFA_DIST_STATE comes from the compiler cache's probe (CompilerCache.cmake), which runs first.
  if(NOT VFA_DIST_VERIFY GREATER 0)
    if(VFA_DIST_STATE STREQUAL "connected")
      message(STATUS "vendored-flash-attn: VFA_DIST_VERIFY=0: nothing the sccache-dist cluster builds is "
        "compiled again here (release builds set 10)")
    endif()
  elseif(VFA_DIST_STATE STREQUAL "connected" OR VFA_DIST_STATE STREQUAL "failed")
    message(STATUS "vendored-flash-attn: VFA_DIST_VERIFY=${VFA_DIST_VERIFY}: units the sccache-dist cluster "
      "builds are compiled again here and must give the same object: one in ${VFA_DIST_VERIFY}, drawn with a "
      "secret of each build, and at least the first of the build and one of each build server")
  else()
    message(STATUS "vendored-flash-attn: VFA_DIST_VERIFY=${VFA_DIST_VERIFY}: no sccache-dist cluster in this "
      "build (${VFA_DIST_STATE}): nothing to check")
  endif()
endfunction()
