# The declaration (cmake/knobs.json) checked at configure: its knobs by cmake/vfa_build/knobs/knobs.py's typed
# parse (`validate`), the kernel families ("families") by the package's own validator:
# python/vendored_flash_attn/declaration/families.py's problems(), which the installed package runs at
# first use. One set of rules, so a mistake (a version
# declared twice, an unknown name in default_order, a mistyped `made`, a generation both
# supported and excluded, a module renamed without its op namespace, ...) stops the build
# before anything is fetched or compiled, naming the field and the fix, instead of
# configuring, building and failing at import or in a CMake error far from its cause.
# What the build does with the fields it reads: cmake/Options.cmake (vfa_declared_families,
# vfa_family_field), cmake/CudaArchs.cmake (capabilities), CMakeLists.txt.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamGit.cmake)  # vfa_script_python
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

# Stops the configure, listing every mistake, when the declaration has any. The validator
# runs as `python -E -s -S -m vendored_flash_attn.declaration.families check FILE` from the project's
# python/ folder (standard library only: no site-packages, nothing installed is read).
#   vfa_check_families_declaration()  ->  with fa4's "version": 3: FATAL_ERROR
#     ".../knobs.json declares the kernel families with mistakes ...:
#       families.fa4.version 3 is also fa3's: ... give each family its own version ..."
function(vfa_check_families_declaration)
  get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
  get_property(project GLOBAL PROPERTY VFA_KNOBS_PROJECT_DIR)
  vfa_script_python(python)
  if(NOT python)
    message(FATAL_ERROR "No Python to check the kernel families declared in ${file} (the build needs one "
      "anyway: torch's): set Python_EXECUTABLE, or put python3 on PATH.")
  endif()
  # The knobs first: the typed parse of each entry (cmake/vfa_build/knobs/knobs.py's Knob, whose fields the JSON
  # Schema cmake/knobs.schema.json is made from) names the first mistake by its JSON path.
  execute_process(COMMAND "${python}" -E -s -S "${VFA_BUILD_PY}" knobs.knobs validate "${file}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
  if(rc EQUAL 1 AND NOT out STREQUAL "")
    message(FATAL_ERROR "${file} declares a knob with a mistake; the build and the package read it, so the "
      "configure stops here:\n  ${out}\n(Its JSON Schema, cmake/knobs.schema.json, shows the fields in an editor.)")
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "Checking the knobs declared in ${file} failed (${python}, exit ${rc}): ${out}${err}")
  endif()
  execute_process(COMMAND "${python}" -E -s -S -m vendored_flash_attn.declaration.families check "${file}"
    WORKING_DIRECTORY "${project}/python" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
  if(rc EQUAL 0)
    return()
  endif()
  if(rc EQUAL 1 AND NOT out STREQUAL "")
    string(REPLACE "\n" "\n  " out "${out}")
    message(FATAL_ERROR "${file} declares the kernel families (its \"families\" section) with mistakes; "
      "the build and the package read them, so the configure stops here:\n  ${out}\n"
      "(The same rules run when the package first reads it: python/vendored_flash_attn/declaration/families.py.)")
  endif()
  message(FATAL_ERROR "Checking the kernel families declared in ${file} failed (${python}, exit ${rc}): "
    "${out}${err}")
endfunction()
