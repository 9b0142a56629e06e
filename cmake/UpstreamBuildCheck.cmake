# The source check at build time, tied to the bytes each object is compiled from. The configure
# staged every repository that matches the pin (a copy of the anchored files in the user's own
# staged store, cmake/UpstreamVerify.cmake: vfa_stage_sources), but a build dir is rebuilt by
# `ninja` / `cmake --build` without a configure, and a file may change while the units compile.
# So (cmake/vfa_build/sources/source_anchor.py, each step standard-library Python):
#
#   * before anything reads the sources, the target vfa_verified_sources (every compiled module
#     and FA4's staging depend on it) hashes each staged copy against the pin's anchor again, a
#     clean source dir's folder too, checks the generated files (the FA2 stub) and its own spec
#     against the digests this configure wrote (the spec's digest is on its command line, in the
#     build file), and records a snapshot (inode, ctime: no user can set a ctime back) of every
#     staged entry in <build>/vfa_verified_sources.snapshot, rewritten only when it changes, so a
#     no-op build reruns nothing after it;
#   * before each module is linked (PRE_LINK) and before the wheel is packed (the first install
#     step), the snapshot proves the staged copies unchanged since then. An edit during a unit's
#     compile, undone before it ends, fails THIS build; its objects are removed so that none of
#     them outlives it (the next build compiles them again from the verified bytes).
#
# What it costs on the real pin: docs/PERFORMANCE.md (benchmarks/source_check.py).
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

set(VFA_VERIFIED_SOURCES_TARGET vfa_verified_sources)

# Adds the target vfa_verified_sources, makes each of <targets> depend on it and prove the
# sources unchanged before it links, and adds the same proof as the first install step.
# Call it after the sources are resolved and the family targets added (their generated files
# exist), before FA4's package is added.
#   vfa_add_source_verification_target(_vendored_fa2_C _vendored_fa3_C)
#     ->  <build>/vfa_verified_sources.json; target vfa_verified_sources; snapshot
#         <build>/vfa_verified_sources.snapshot
function(vfa_add_source_verification_target)
  set(spec_file "${CMAKE_BINARY_DIR}/vfa_verified_sources.json")
  set(snapshot "${CMAKE_BINARY_DIR}/vfa_verified_sources.snapshot")
  set(spec "{}")
  vfa_json_set_text(spec "${VFA_PIN_FILE}" pin)
  vfa_json_set_text(spec "${snapshot}" snapshot)
  string(JSON spec SET "${spec}" components "[]")
  set(i 0)
  foreach(component IN LISTS VFA_COMPONENTS)
    if(NOT VFA_${component}_MATCHES_PIN)
      continue()
    endif()
    set(entry "{}")
    vfa_json_set_text(entry "${component}" name)
    vfa_json_set_text(entry "${VFA_${component}_SOURCE_DIR}" staged)
    vfa_json_set_text(entry "${VFA_${component}_FROM_DIR}" source)
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
  string(JSON spec SET "${spec}" generated "[]")
  get_property(generated GLOBAL PROPERTY VFA_GENERATED_SOURCES)
  set(i 0)
  foreach(file IN LISTS generated)
    file(SHA256 "${file}" sha)
    set(entry "{}")
    vfa_json_set_text(entry "${file}" path)
    vfa_json_set_text(entry "${sha}" sha256)
    string(JSON spec SET "${spec}" generated ${i} "${entry}")
    math(EXPR i "${i} + 1")
  endforeach()
  # Where each module's objects are: removed when the sources cannot be proven unchanged.
  string(JSON spec SET "${spec}" objects "[]")
  set(i 0)
  foreach(target IN LISTS ARGN)
    vfa_json_set_text(spec "${CMAKE_BINARY_DIR}/CMakeFiles/${target}.dir" objects ${i})
    math(EXPR i "${i} + 1")
  endforeach()
  set(written "")
  if(EXISTS "${spec_file}")
    file(READ "${spec_file}" written)
  endif()
  if(NOT written STREQUAL "${spec}\n")
    file(WRITE "${spec_file}" "${spec}\n")
  endif()
  file(SHA256 "${spec_file}" spec_sha)
  vfa_anchor_command(anchor)
  set(check ${anchor} verify --spec "${spec_file}" --spec-sha256 ${spec_sha})
  add_custom_target(${VFA_VERIFIED_SOURCES_TARGET}
    COMMAND ${check}
    BYPRODUCTS "${snapshot}"
    COMMENT "Verifying the upstream sources against the pin's anchor"
    VERBATIM)
  set(unchanged ${anchor} unchanged --spec "${spec_file}" --spec-sha256 ${spec_sha})
  foreach(target IN LISTS ARGN)
    add_dependencies(${target} ${VFA_VERIFIED_SOURCES_TARGET})
    add_custom_command(TARGET ${target} PRE_LINK
      COMMAND ${unchanged} --when "before ${target} is linked"
      VERBATIM)
  endforeach()
  # Before anything is packed: install() steps run in the order they are declared, and the
  # wheel holds what `cmake --install` copies.
  string(REPLACE ";" "\" \"" shown "${unchanged}")
  install(CODE "
    execute_process(COMMAND \"${shown}\" --when \"before the wheel is packed\" RESULT_VARIABLE vfa_rc)
    if(NOT vfa_rc EQUAL 0)
      message(FATAL_ERROR \"vendored-flash-attn: nothing is packed (see above).\")
    endif()")
endfunction()
