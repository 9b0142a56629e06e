# Kernel selection: which upstream instantiation files each compiled family's module compiles,
# and the defines that must agree with them. This file names no family: each family declares
# its rule in cmake/knobs.json ("families.<name>.build.kernels"), its choices and presets are
# those of its selection knobs (head_dims_knob, dtypes_knob, features_knob), and one function
# applies the rule:
#
#   file       the instantiation file of one kernel, e.g.
#              "hopper/instantiations/flash_fwd_hdim{kernel}_{dtype}{variant}_sm90.cu": {kernel} is
#              the head dim or an extra kernel's name, {head_dim} and {dtype} the selection's, every
#              other {name} a string field of the variant
#   variants   the files of each (dtype, kernel), in order; a variant compiles when the selection has
#              its "features" (all of them), only for its "head_dims" when given, only for extra
#              kernels when "extra_only"
#   extra_kernels  kernels beside the head dims (the hdimdiff ones): {kernel, head_dim, features,
#              dtypes}, built when their head dim and features are selected (and their dtype, if named)
#   left_out   "disable": what is not selected is switched off by defines ("disable": a template per
#              head dim left out, [dtype, defines...] and [feature, defines...] pairs), so a selection
#              changes both the files and the defines, from one table, and the two never disagree (a
#              missing instantiation would only show up as an undefined symbol at import);
#              "stub": the upstream dispatcher references every kernel and has no such switch, so
#              each kernel left out whose variant names a "stub" kind gets a definition that raises
#              a clear error (the "stubs" table: includes, namespace, C++ type per dtype, and per
#              kind the definition and what its error says), in one generated file (the Python
#              interface refuses such calls before dispatch)
#   required_dtypes  [dtype, why] pairs a selection must include
#   knob_defines     [knob, ON|OFF, defines...]: defines a bool knob adds at that value
#
# Example: the family whose rule compiles hopper/instantiations (left_out "disable"), its knobs
# set to head dims 128, dtypes bf16, features paged:
#   vfa_family_selection(<name> "128" "bf16" "paged")
#   ->  VFA_<NAME>_INSTANTIATIONS  hopper/instantiations/flash_fwd_hdim128_bf16_packgqa_sm90.cu;
#                                  hopper/instantiations/flash_fwd_hdim128_bf16_paged_sm90.cu
#       VFA_<NAME>_DEFINES         FLASHATTENTION_DISABLE_BACKWARD;...;FLASHATTENTION_DISABLE_HDIM64;...;
#                                  FLASHATTENTION_DISABLE_FP16;FLASHATTENTION_DISABLE_FP8;
#                                  FLASHATTENTION_DISABLE_SPLIT;...
#       VFA_<NAME>_MISSING         (none: its rule is "disable")

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

# VFA_<NAME>_ALL_HEAD_DIMS / _ALL_DTYPES / _ALL_FEATURES of each compiled family: the choices of
# its selection knobs, declared once in cmake/knobs.json (the package's kernels.py reads the same).
vfa_declared_families(_vfa_families extension)
foreach(_vfa_family IN LISTS _vfa_families)
  string(TOUPPER "${_vfa_family}" _vfa_part)
  foreach(_vfa_what HEAD_DIMS DTYPES FEATURES)
    string(TOLOWER "${_vfa_what}_knob" _vfa_field)
    vfa_family_field(_vfa_knob ${_vfa_family} ${_vfa_field} "")
    set(VFA_${_vfa_part}_ALL_${_vfa_what} "")
    if(NOT _vfa_knob STREQUAL "")
      vfa_knob_declaration(_vfa_decl ${_vfa_knob})
      vfa_knob_field(VFA_${_vfa_part}_ALL_${_vfa_what} "${_vfa_decl}" choices "")
    endif()
  endforeach()
endforeach()
unset(_vfa_families)
unset(_vfa_family)
unset(_vfa_part)
unset(_vfa_what)
unset(_vfa_field)
unset(_vfa_knob)
unset(_vfa_decl)

# What <knob> holds in preset <preset>: its declaration's "presets" entry, or every choice when
# it names none (cmake/knobs.json; the presets' names are VFA_PRESET's choices).
#   vfa_preset_values(values <dtypes knob> minimal)  ->  bf16;e4m3       ("presets": {"minimal": ["bf16", "e4m3"]})
#   vfa_preset_values(values <dtypes knob> full)     ->  bf16;fp16;e4m3  (every choice)
function(vfa_preset_values out_var knob preset)
  vfa_knob_declaration(decl ${knob})
  string(JSON type ERROR_VARIABLE err TYPE "${decl}" presets "${preset}")
  if(err)
    vfa_knob_field(values "${decl}" choices "")
  else()
    vfa_knob_field(values "${decl}" "presets;${preset}" "")
  endif()
  set(${out_var} "${values}" PARENT_SCOPE)
endfunction()

# Sets VFA_PRESET and each compiled family's selection knobs (cmake/knobs.json declares them:
# VFA_<NAME>_{HEAD_DIMS,DTYPES,FEATURES}): each list knob as given (checked and in canonical
# order by vfa_option; "none" means empty), else the preset's (vfa_preset_values).
function(vfa_read_selection)
  vfa_option(VFA_PRESET)
  vfa_declared_families(families extension)
  foreach(family IN LISTS families)
    foreach(field head_dims_knob dtypes_knob features_knob)
      vfa_family_field(knob ${family} ${field} "")
      if(knob STREQUAL "")
        continue()
      endif()
      vfa_selection_knob(values ${knob})
      set(${knob} "${values}" PARENT_SCOPE)
    endforeach()
  endforeach()
  set(VFA_PRESET "${VFA_PRESET}" PARENT_SCOPE)
endfunction()

# What a selection knob with presets holds: as given (checked and in canonical order by
# vfa_option; "none" means empty), else VFA_PRESET's (vfa_preset_values). The compiled families'
# knobs (vfa_read_selection) and FA4's precompile knobs (cmake/FA4Package.cmake) alike.
function(vfa_selection_knob out_var knob)
  vfa_option(VFA_PRESET)
  vfa_option(${knob})
  set(values "${${knob}}")
  if(values STREQUAL "")
    vfa_preset_values(values ${knob} "${VFA_PRESET}")
  elseif(values STREQUAL "none")
    set(values "")
  endif()
  set(${out_var} "${values}" PARENT_SCOPE)
endfunction()

# <text> with each {name} replaced by the string members of the JSON object <values>, then by
# the NAME=VALUE pairs that follow.
#   vfa_fill(f "x_{kind}_{dtype}.cu" "{\"kind\": \"fwd\"}" dtype=bf16)  ->  x_fwd_bf16.cu
function(vfa_fill out_var text values)
  string(JSON count LENGTH "${values}")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON name MEMBER "${values}" ${i})
      string(JSON type TYPE "${values}" ${name})
      if(type STREQUAL "STRING")
        string(JSON value GET "${values}" ${name})
        string(REPLACE "{${name}}" "${value}" text "${text}")
      endif()
    endforeach()
  endif()
  foreach(pair IN LISTS ARGN)
    vfa_split_record(name value "${pair}" "=")
    string(REPLACE "{${name}}" "${value}" text "${text}")
  endforeach()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# Whether every item of <needed> is in <have>.
function(vfa_all_in out_var needed have)
  set(all TRUE)
  foreach(item IN LISTS needed)
    if(NOT item IN_LIST have)
      set(all FALSE)
    endif()
  endforeach()
  set(${out_var} ${all} PARENT_SCOPE)
endfunction()

# The JSON array at <path> of <json> as a list of JSON texts (one per element), or empty.
function(vfa_json_elements out_var json)
  string(JSON count ERROR_VARIABLE err LENGTH "${json}" ${ARGN})
  set(items "")
  if(NOT err AND count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON item GET "${json}" ${ARGN} ${i})
      list(APPEND items "${item}")
    endforeach()
  endif()
  set(${out_var} "${items}" PARENT_SCOPE)
endfunction()

# Sets VFA_<NAME>_INSTANTIATIONS (relative to the upstream root), VFA_<NAME>_DEFINES and
# VFA_<NAME>_MISSING (kernels to stub, as "<stub kind>:<dtype>:<head dim>:<variant index>") for
# the compiled <family>'s selection, by its declared rule (build.kernels; the top of this file).
function(vfa_family_selection family head_dims dtypes features)
  string(TOUPPER "${family}" part)
  vfa_family_field(kernels ${family} "build;kernels" "{}")
  vfa_family_field(dtypes_knob ${family} dtypes_knob "")
  vfa_family_field(head_dims_knob ${family} head_dims_knob "")
  vfa_json_elements(required "${kernels}" required_dtypes)
  foreach(pair IN LISTS required)
    string(JSON dtype GET "${pair}" 0)
    string(JSON why GET "${pair}" 1)
    if(NOT dtype IN_LIST dtypes)
      message(FATAL_ERROR "${dtypes_knob} must include ${dtype}: ${why}.")
    endif()
  endforeach()
  if(NOT head_dims)
    message(FATAL_ERROR "${head_dims_knob} is empty; pick at least one of: ${VFA_${part}_ALL_HEAD_DIMS}.")
  endif()
  vfa_knob_field(template "${kernels}" file "")
  vfa_knob_field(left_out "${kernels}" left_out "disable")
  set(each_dtype ${dtypes})
  set(each_head_dim ${head_dims})
  if(left_out STREQUAL "stub")
    set(each_dtype ${VFA_${part}_ALL_DTYPES})
    set(each_head_dim ${VFA_${part}_ALL_HEAD_DIMS})
  endif()
  # The variants, read once: their JSON, features, head dims, extra_only and stub kind.
  vfa_json_elements(variants "${kernels}" variants)
  list(LENGTH variants count)
  set(indexes "")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      list(GET variants ${i} variant)
      list(APPEND indexes ${i})
      set(variant_${i} "${variant}")
      vfa_knob_field(features_${i} "${variant}" features "")
      vfa_knob_field(head_dims_${i} "${variant}" head_dims "")
      vfa_knob_field(extra_only_${i} "${variant}" extra_only OFF)
      vfa_knob_field(stub_${i} "${variant}" stub "")
    endforeach()
  endif()
  vfa_json_elements(extras "${kernels}" extra_kernels)

  set(files "")
  set(missing "")
  foreach(dtype IN LISTS each_dtype)
    # The kernels of this dtype: "<name>|<head dim>|<extra>".
    set(kernel_list "")
    foreach(hdim IN LISTS each_head_dim)
      list(APPEND kernel_list "${hdim}|${hdim}|0")
    endforeach()
    foreach(extra IN LISTS extras)
      vfa_knob_field(name "${extra}" kernel "")
      vfa_knob_field(hdim "${extra}" head_dim "")
      vfa_knob_field(needs "${extra}" features "")
      vfa_knob_field(only "${extra}" dtypes "")
      vfa_all_in(has "${needs}" "${features}")
      if(hdim IN_LIST head_dims AND has AND (NOT only OR dtype IN_LIST only))
        list(APPEND kernel_list "${name}|${hdim}|1")
      endif()
    endforeach()
    foreach(kernel IN LISTS kernel_list)
      string(REPLACE "|" ";" kernel "${kernel}")
      list(GET kernel 0 name)
      list(GET kernel 1 hdim)
      list(GET kernel 2 is_extra)
      foreach(i IN LISTS indexes)
        if(extra_only_${i} AND NOT is_extra)
          continue()
        endif()
        if(head_dims_${i} AND NOT hdim IN_LIST head_dims_${i})
          continue()
        endif()
        vfa_all_in(has "${features_${i}}" "${features}")
        if(has AND dtype IN_LIST dtypes AND hdim IN_LIST head_dims)
          vfa_fill(file "${template}" "${variant_${i}}" kernel=${name} head_dim=${hdim} dtype=${dtype})
          list(APPEND files "${file}")
        elseif(NOT stub_${i} STREQUAL "")
          list(APPEND missing "${stub_${i}}:${dtype}:${hdim}:${i}")
        endif()
      endforeach()
    endforeach()
  endforeach()

  # The defines: the family's own, then what the selection leaves out, then its knobs'.
  vfa_family_field(defines ${family} "build;defines" "")
  vfa_knob_field(templates "${kernels}" "disable;head_dim" "")
  foreach(hdim IN LISTS VFA_${part}_ALL_HEAD_DIMS)
    if(NOT hdim IN_LIST head_dims)
      foreach(each IN LISTS templates)
        string(REPLACE "{head_dim}" "${hdim}" each "${each}")
        list(APPEND defines "${each}")
      endforeach()
    endif()
  endforeach()
  foreach(axis dtypes features)
    vfa_json_elements(pairs "${kernels}" disable ${axis})
    foreach(pair IN LISTS pairs)
      vfa_knob_field(items "{\"p\": ${pair}}" p "")
      list(POP_FRONT items value)
      if(NOT value IN_LIST ${axis})
        list(APPEND defines ${items})
      endif()
    endforeach()
  endforeach()
  vfa_json_elements(knob_defines "${kernels}" knob_defines)
  foreach(entry IN LISTS knob_defines)
    vfa_knob_field(items "{\"e\": ${entry}}" e "")
    list(POP_FRONT items knob when)
    vfa_option(${knob})
    if(${knob} STREQUAL when)
      list(APPEND defines ${items})
    endif()
  endforeach()
  set(VFA_${part}_INSTANTIATIONS "${files}" PARENT_SCOPE)
  set(VFA_${part}_MISSING "${missing}" PARENT_SCOPE)
  set(VFA_${part}_DEFINES "${defines}" PARENT_SCOPE)
endfunction()

# Stages <text> as <filename> in the user's staged store (VFA_STAGED_SOURCES, the one the
# upstream sources and torch's headers are staged in: cmake/vfa_build/sources/staged_tree.py) and returns its path,
# <store>/<name>-<digest>/<filename>: a path that depends only on the text, the same in every
# checkout and build dir of the user. The compiler cache keys on it (sccache hashes the
# preprocessed text, whose line markers name the file by its absolute path), so a generated file
# in the build dir missed the cache in every new build dir. What is staged is what this configure
# computed: the expected digest is taken from <text> itself, not from a file; a copy already
# there is reused only when its bytes are these, it is this user's and nobody else can write it,
# else it is made again (so a copy edited or cut short since is never compiled); a store others
# can write, or a write cut short (a full disk), stops the configure.
#   vfa_stage_generated_file(path fa2_missing_kernels fa2_missing_kernels.cpp "int x;\n")
#     ->  ~/.cache/vendored-flash-attn/staged/fa2_missing_kernels-3f1c.../fa2_missing_kernels.cpp
function(vfa_stage_generated_file out_var name filename text)
  string(SHA256 sha "${text}")
  string(RANDOM LENGTH 8 suffix)
  # Written here only to be copied from: staged_tree.py hashes what it copies and compares it
  # with <sha>, so an edit of this folder in between is refused, not staged.
  set(tmp "${CMAKE_BINARY_DIR}/generated/.${name}-${suffix}")
  file(MAKE_DIRECTORY "${tmp}")
  file(WRITE "${tmp}/${filename}" "${text}")
  file(WRITE "${tmp}.json" "{\"files\": [[\"${filename}\", \"644\", \"${sha}\"]]}\n")
  vfa_script_python(python)
  execute_process(
    COMMAND "${python}" -E -s -S "${VFA_BUILD_PY}" sources.staged_tree stage --source "${tmp}"
            --store "${VFA_STAGED_SOURCES}" --name "${name}" --expect "${tmp}.json" "${filename}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
  file(REMOVE_RECURSE "${tmp}" "${tmp}.json")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "vendored-flash-attn: the generated file ${filename} could not be staged in "
      "VFA_STAGED_SOURCES ('${VFA_STAGED_SOURCES}'): ${err}. Fix what the message says (a full disk: free "
      "some space there) and configure again.")
  endif()
  string(JSON dir GET "${out}" path)
  set(${out_var} "${dir}/${filename}" PARENT_SCOPE)
endfunction()

# Writes the C++ definitions of <family>'s kernels left out (VFA_<NAME>_MISSING, by its
# declared stubs table) to a content-addressed file in the user's staged store
# (vfa_stage_generated_file), and returns its path in <out_var>. Not in the shared source cache
# (a read-only cache works, and no file there is compiled that only its name vouches for), not in
# the build dir (its path, and so the compiler cache's key, would change with every build dir).
#   vfa_write_family_stubs(stubs <name>)
#     ->  ~/.cache/vendored-flash-attn/staged/<name>_missing_kernels-6403d678.../<name>_missing_kernels.cpp
function(vfa_write_family_stubs out_var family)
  string(TOUPPER "${family}" part)
  vfa_family_field(kernels ${family} "build;kernels" "{}")
  vfa_json_elements(variants "${kernels}" variants)
  string(JSON stubs GET "${kernels}" stubs)
  set(body "")
  foreach(record IN LISTS VFA_${part}_MISSING)
    string(REPLACE ":" ";" record "${record}")
    list(GET record 0 kind)
    list(GET record 1 dtype)
    list(GET record 2 hdim)
    list(GET record 3 index)
    list(GET variants ${index} variant)
    string(JSON type GET "${stubs}" types ${dtype})
    string(JSON definition GET "${stubs}" kinds ${kind} definition)
    string(JSON what GET "${stubs}" kinds ${kind} what)
    set(pairs title=${part} dtype=${dtype} head_dim=${hdim} "type=${type}")
    vfa_fill(definition "${definition}" "${variant}" ${pairs})
    vfa_fill(what "${what}" "${variant}" ${pairs})
    string(APPEND body "${definition} { VFA_NOT_BUILT(\"${what}\"); }\n")
  endforeach()
  vfa_knob_field(includes "${stubs}" includes "")
  set(include_lines "")
  foreach(header IN LISTS includes)
    string(APPEND include_lines "#include ${header}\n")
  endforeach()
  string(JSON namespace GET "${stubs}" namespace)
  set(knobs "")
  foreach(field head_dims_knob dtypes_knob features_knob)
    vfa_family_field(knob ${family} ${field} "")
    if(NOT knob STREQUAL "")
      list(APPEND knobs "${knob}")
    endif()
  endforeach()
  string(REPLACE ";" " / " knobs "${knobs}")
  set(text
"// Generated by vendored-flash-attn (cmake/KernelSelection.cmake): definitions
// for the ${part} kernels this build left out, so the module still loads. Calling
// one raises a clear error instead of failing at import with an undefined symbol.
${include_lines}
#define VFA_NOT_BUILT(what) STD_TORCH_CHECK(false, \"vendored-flash-attn: \" what \" kernels are not in this build; \" \\
  \"rebuild with VFA_PRESET=full or add them to ${knobs}\")

namespace ${namespace} {
${body}}  // namespace ${namespace}
")
  vfa_stage_generated_file(path ${family}_missing_kernels ${family}_missing_kernels.cpp "${text}")
  set(${out_var} "${path}" PARENT_SCOPE)
endfunction()

# Checks that every selected file exists in the upstream tree.
function(vfa_check_instantiations component root)
  set(missing "")
  foreach(rel IN LISTS ARGN)
    if(NOT EXISTS "${root}/${rel}")
      list(APPEND missing "${rel}")
    endif()
  endforeach()
  if(missing)
    list(LENGTH missing n)
    list(GET missing 0 first)
    message(FATAL_ERROR
      "${component}: ${n} selected instantiation file(s) do not exist in '${root}', e.g. "
      "${first}. The upstream commit does not match this build's kernel table "
      "(the family's build.kernels in cmake/knobs.json, applied by cmake/KernelSelection.cmake); "
      "check the pin or the source directory.")
  endif()
endfunction()
