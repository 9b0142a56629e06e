# What the build trusts of objects from an sccache-dist cluster (cmake/dist_trust.py,
# dist-compile/README.md "Trust model"): VFA_DIST_VERIFY=N compiles one unit in N of those
# sent to the cluster again here and stops the build when an object differs. The number
# goes into <build>/vfa-dist-verify.json, which the compiler launcher reads per unit
# (cmake/sccache_launcher.py -> dist_trust.verify_unit). The shared cache's read-only mode
# for such builds is set where the build's sccache servers are (cmake/compiler_cache_probe.py).

include_guard(GLOBAL)

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
  if(VFA_DIST_VERIFY GREATER 0 AND VFA_DIST_REMOTE_JOBS GREATER 0)
    message(STATUS "vendored-flash-attn: VFA_DIST_VERIFY=${VFA_DIST_VERIFY}: one unit in ${VFA_DIST_VERIFY} of "
      "those sent to the sccache-dist cluster is compiled again here and must give the same object")
  endif()
endfunction()
