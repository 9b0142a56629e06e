# The arch table (cmake/knobs.json "cuda_archs"), read once for the build: a capability's
# targets, the row of a target, the lowest GPU the build knows, TORCH_CUDA_ARCH_LIST parsed (by
# the package's parser, cuda_archs.py), -gencode flags, and which code runs on which GPU. Which code each
# family compiles from it: cmake/CudaArchs.cmake. The package reads the same table
# (python/vendored_flash_attn/declaration/cuda_archs.py: one rule of which code runs where, checked against
# this file by tests/unit/test_cuda_archs.py).

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamGit.cmake)  # vfa_script_python

# The <field> (sass, a, ptx, nvcc, a_nvcc) of compute capability <cap>'s row of the arch table
# (cmake/knobs.json "cuda_archs"); "" when the table has no such row or field.
#   vfa_arch_table_row(target 10.3 a)  ->  sm_103a
function(vfa_arch_table_row out_var cap field)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON value ERROR_VARIABLE err GET "${json}" cuda_archs table "${cap}" ${field})
  if(err)
    set(value "")
  endif()
  if(field STREQUAL "a_nvcc" AND value STREQUAL "")
    vfa_arch_table_row(value "${cap}" nvcc)
  endif()
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

# The row of a target name: <out_var> = its capability, <out_var>_KIND = sass, a or ptx; both
# "" when no row of the arch table has it.
#   vfa_arch_table_target(row sm_90a)  ->  row=9.0, row_KIND=a
function(vfa_arch_table_target out_var target)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON count LENGTH "${json}" cuda_archs table)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON cap MEMBER "${json}" cuda_archs table ${i})
    foreach(kind sass a ptx)
      string(JSON value ERROR_VARIABLE err GET "${json}" cuda_archs table "${cap}" ${kind})
      if(NOT err AND value STREQUAL target)
        set(${out_var} "${cap}" PARENT_SCOPE)
        set(${out_var}_KIND ${kind} PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
  set(${out_var} "" PARENT_SCOPE)
  set(${out_var}_KIND "" PARENT_SCOPE)
endfunction()

# The lowest compute capability of the arch table (CMake's JSON lists an object's members in
# the order of their names, "10.0" before "8.0": compared here as versions).
function(vfa_arch_table_lowest out_var)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON count LENGTH "${json}" cuda_archs table)
  math(EXPR last "${count} - 1")
  set(lowest "")
  foreach(i RANGE ${last})
    string(JSON cap MEMBER "${json}" cuda_archs table ${i})
    if(lowest STREQUAL "" OR cap VERSION_LESS lowest)
      set(lowest "${cap}")
    endif()
  endforeach()
  set(${out_var} "${lowest}" PARENT_SCOPE)
endfunction()

# Parses "8.0 8.6;9.0a,8.0+PTX Hopper" into numeric archs ("8.0;8.6;9.0"), the archs asked for
# with +PTX into <out_var>_PTX ("8.0;9.0": Hopper is PyTorch's 9.0+PTX), and the names used with
# their meaning into <out_var>_NAMED ("Hopper = 9.0+PTX", for messages). The package's parser
# reads it (python/vendored_flash_attn/declaration/cuda_archs.py, parse_arch_list: the one reader of the
# list, which the package also uses on a recorded list), run as
# `python -E -s -S -m vendored_flash_attn.declaration.cuda_archs parse FILE TEXT` (standard library only).
# A list it refuses (no architecture, "09.0", "Blackwell+PTX", an unknown word) stops here,
# before torch's CMake reads it, with its message.
function(vfa_parse_arch_list out_var text)
  get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
  get_property(project GLOBAL PROPERTY VFA_KNOBS_PROJECT_DIR)
  vfa_script_python(python)
  if(NOT python)
    message(FATAL_ERROR "No Python to read TORCH_CUDA_ARCH_LIST with (the build needs one anyway: "
      "torch's): set Python_EXECUTABLE, or put python3 on PATH.")
  endif()
  # ',' separates as ';' does: a ';' would split the argument into several here.
  string(REPLACE ";" "," arg "${text}")
  execute_process(COMMAND "${python}" -E -s -S -m vendored_flash_attn.declaration.cuda_archs parse "${file}" "${arg}"
    WORKING_DIRECTORY "${project}/python" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
  if(rc EQUAL 1 AND NOT out STREQUAL "")
    # The parser names the list as it saw it; the user wrote it with ';'.
    string(REPLACE "TORCH_CUDA_ARCH_LIST='${arg}'" "TORCH_CUDA_ARCH_LIST='${text}'" out "${out}")
    message(FATAL_ERROR "${out}")
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "Reading TORCH_CUDA_ARCH_LIST='${text}' failed (${python}, exit ${rc}): ${out}${err}")
  endif()
  string(REGEX MATCH "(^|\n)archs ([^\n]*)" _ "${out}")
  set(archs "${CMAKE_MATCH_2}")
  string(REGEX MATCH "(^|\n)ptx ([^\n]*)" _ "${out}")
  set(ptx "${CMAKE_MATCH_2}")
  string(REGEX MATCH "(^|\n)named ([^\n]*)" _ "${out}")
  set(${out_var} "${archs}" PARENT_SCOPE)
  set(${out_var}_PTX "${ptx}" PARENT_SCOPE)
  set(${out_var}_NAMED "${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

# "sm_80;compute_80" -> -gencode flags, one SHELL: group each so CMake does not
# de-duplicate the repeated "-gencode" word.
function(vfa_gencode_flags out_var)
  set(flags "")
  foreach(code IN LISTS ARGN)
    if(code MATCHES "^(sm|compute)_([0-9]+[af]?)$")
      set(flag "SHELL:-gencode arch=compute_${CMAKE_MATCH_2},code=${code}")
      list(APPEND flags "${flag}")
    endif()
  endforeach()
  set(${out_var} "${flags}" PARENT_SCOPE)
endfunction()

# Whether code compiled for <codes> (sm_80, compute_80, sm_90a: targets of the arch table)
# runs on a GPU of compute capability <arch>: SASS (sm_XY) on major X with minor >= Y,
# arch-specific code (sm_XYa) on X.Y only, PTX (compute_XY) on every GPU >= X.Y (the driver
# compiles it at load time). The package's runs_on (cuda_archs.py) is the same rule.
#   vfa_code_runs_on(runs 10.0 sm_80 compute_80)  ->  TRUE
#   vfa_code_runs_on(runs 10.0 sm_80)             ->  FALSE
#   vfa_code_runs_on(runs 10.3 sm_100a)           ->  FALSE
function(vfa_code_runs_on out_var arch)
  set(runs FALSE)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)$" _ "${arch}")
  set(major "${CMAKE_MATCH_1}")
  set(minor "${CMAKE_MATCH_2}")
  foreach(code IN LISTS ARGN)
    vfa_arch_table_target(row "${code}")
    if(row STREQUAL "")
      continue()
    endif()
    string(REGEX MATCH "^([0-9]+)\\.([0-9]+)$" _ "${row}")
    if(row_KIND STREQUAL "a" AND arch VERSION_EQUAL row)
      set(runs TRUE)
    elseif(row_KIND STREQUAL "sass" AND major EQUAL CMAKE_MATCH_1 AND NOT minor LESS CMAKE_MATCH_2)
      set(runs TRUE)
    elseif(row_KIND STREQUAL "ptx" AND arch VERSION_GREATER_EQUAL row)
      set(runs TRUE)
    endif()
  endforeach()
  set(${out_var} ${runs} PARENT_SCOPE)
endfunction()

# Whether a GPU of one of the listed archs runs code compiled for <target>.
function(vfa_any_listed_runs out_var target)
  set(any FALSE)
  foreach(arch IN LISTS ARGN)
    vfa_code_runs_on(runs "${arch}" "${target}")
    if(runs)
      set(any TRUE)
    endif()
  endforeach()
  set(${out_var} ${any} PARENT_SCOPE)
endfunction()
