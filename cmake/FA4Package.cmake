# FA4: upstream's flash_attn/cute (FlashAttention-4 in NVIDIA's CuTe DSL, pure Python)
# shipped as the subpackage vendored_flash_attn._fa4.cute, and optionally its kernels
# compiled ahead of time. docs/fa4.md says why each step is done this way.
#
# Build time, not configure time: cmake/vfa_build/fa4/precompile.py `stage` copies the pinned
# sources (fetched and content-checked with the rest: vendor/flash-attention/pin.json
# lists flash_attn/cute) into <build>/fa4, absolute `flash_attn.cute` imports rewritten,
# refusing a pin whose FA4 dependencies differ from the [fa4] extra; it writes FA4's part
# of the build info (_fa4/build_info.json: the sources' commit and verification, staged
# files, precompiled kernels). `compile` (VFA_FA4_PRECOMPILE) then fills _fa4/kernels.
#
# Knobs (cmake/knobs.json): VFA_BUILD_FA4, VFA_FA4_PRECOMPILE, and the precompile's selection
# VFA_FA4_PRECOMPILE_{HEAD_DIMS,DTYPES,FEATURES,GQA_RATIOS,PYTHONS}.
#
# This file is the fa4 family's own build side (CMakeLists.txt calls vfa_add_<name>_package for
# each packaged family of the declaration): it names its family and its knobs on purpose; every
# compiled family is built by the one target function instead (cmake/FamilyTarget.cmake).

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/CudaArchs.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/KernelSelection.cmake)

set(_VFA_FA4 "${VFA_BUILD_PY}" fa4.precompile)  # FA4's build steps (cmake/vfa_build/fa4/precompile.py)

# The DSL target of each arch of the list that FA4 runs on: the fa4 family declares its
# generations (cmake/knobs.json: capabilities; sm120 being declared `excluded` at the pin) and
# "archs": {"dsl": "a"}, each GPU's own arch-specific target of the arch table
# (cmake/CudaArchs.cmake, vfa_family_dsl_targets): what upstream's DSL compiles on that GPU.
#   vfa_fa4_dsl_archs(out "8.0;9.0;10.0;10.3")  ->  sm_90a;sm_100a;sm_103a
function(vfa_fa4_dsl_archs out_var)
  vfa_family_dsl_targets(targets fa4 ${ARGN})
  set(${out_var} "${targets}" PARENT_SCOPE)
  set(${out_var}_UNKNOWN "${targets_UNKNOWN}" PARENT_SCOPE)
endfunction()

# The command that runs the build's Python for FA4's steps, probe and build steps alike, so
# that what the probe found is what the steps get: the PYTHONPATH and PYTHONHOME configure
# ran with (pip's build isolation gives the build's requirements through PYTHONPATH: `-E`
# would hide them from the steps, as it did, and `packaging` went missing), pinned here
# because ninja may run the steps later from another shell; no user site (`-s`).
function(vfa_fa4_build_python out_var)
  set(env "")
  foreach(variable PYTHONPATH PYTHONHOME)
    if(DEFINED ENV{${variable}} AND NOT "$ENV{${variable}}" STREQUAL "")
      list(APPEND env "${variable}=$ENV{${variable}}")
    else()
      list(APPEND env "--unset=${variable}")
    endif()
  endforeach()
  set(${out_var} "${CMAKE_COMMAND}" -E env ${env} "${Python_EXECUTABLE}" -s PARENT_SCOPE)
endfunction()

# Sets VFA_FA4_BUILT, VFA_FA4_REASON, VFA_FA4_PRECOMPILE_ARCHS and VFA_FA4_ARCHS (the DSL
# targets of the arch list FA4 runs on; empty: none, VFA_FA4_ARCH_REASON says so) in the
# caller; adds the vfa_fa4 target and the install rule when FA4 is packaged.
function(vfa_add_fa4_package)
  vfa_option(VFA_BUILD_FA4)
  vfa_option(VFA_FA4_PRECOMPILE)
  set(VFA_FA4_BUILT FALSE PARENT_SCOPE)
  set(VFA_FA4_PRECOMPILE_ARCHS "" PARENT_SCOPE)
  vfa_fa4_dsl_archs(fa4_archs ${VFA_CUDA_ARCHS})
  set(VFA_FA4_ARCHS "${fa4_archs}" PARENT_SCOPE)
  set(VFA_FA4_ARCH_REASON "" PARENT_SCOPE)
  if(NOT fa4_archs)
    set(VFA_FA4_ARCH_REASON "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' has no arch FA4 runs on" PARENT_SCOPE)
  endif()
  if(VFA_BUILD_FA4 STREQUAL "off")
    set(VFA_FA4_REASON "VFA_BUILD_FA4=off" PARENT_SCOPE)
    message(STATUS "vendored-flash-attn: FA4 not packaged: VFA_BUILD_FA4=off")
    return()
  endif()
  set(cute_path "flash_attn/cute")
  set(cute "${VFA_flash_attention_SOURCE_DIR}/${cute_path}")
  # The stage copies what the source check verified, and only that: flash_attn/cute must be
  # one of the pin's checked paths (vendor/flash-attention/pin.json "paths").
  if(NOT cute_path IN_LIST VFA_PIN_flash_attention_PATHS)
    message(FATAL_ERROR "FA4 stages ${cute_path}, which is not among the paths the source check verifies "
      "(${VFA_PIN_flash_attention_PATHS}): add it to \"paths\" in the pin, or set VFA_BUILD_FA4=off.")
  endif()

  vfa_fa4_build_python(build_python)
  execute_process(COMMAND ${build_python} ${_VFA_FA4} probe
    OUTPUT_VARIABLE probe ERROR_VARIABLE probe_err RESULT_VARIABLE rc TIMEOUT 120)
  set(build_minor "")
  if(NOT rc EQUAL 0)
    set(stage_reason "cmake/vfa_build/fa4/precompile.py probe failed with ${Python_EXECUTABLE}: ${probe_err}")
    set(precompile_reason "${stage_reason}")
  else()
    string(JSON stage_reason GET "${probe}" stage)
    string(JSON precompile_reason GET "${probe}" precompile)
    string(JSON build_minor GET "${probe}" python)
  endif()
  if(NOT EXISTS "${cute}/interface.py")
    set(stage_reason "the flash-attention sources at '${VFA_flash_attention_SOURCE_DIR}' have no flash_attn/cute")
  endif()
  if(NOT stage_reason STREQUAL "")
    if(VFA_BUILD_FA4 STREQUAL "on")
      message(FATAL_ERROR "VFA_BUILD_FA4=on, but FA4 cannot be staged with ${Python_EXECUTABLE}: ${stage_reason}. "
        "Install packaging (and tomli on Python 3.10) into the build environment (an isolated build gets them "
        "from pyproject.toml's build requirements), or set VFA_BUILD_FA4=off.")
    endif()
    set(VFA_FA4_REASON "${stage_reason}" PARENT_SCOPE)
    message(STATUS "vendored-flash-attn: FA4 not packaged: ${stage_reason}")
    return()
  endif()

  # Precompile: only where asked for, or (auto) where a Python can; never failing a build
  # that did not ask for it. The build's Python compiles when it has the [fa4] extra; each
  # interpreter of VFA_FA4_PRECOMPILE_PYTHONS must be able to: naming one that cannot is a
  # mistake, whatever the mode.
  vfa_option(VFA_FA4_PRECOMPILE_PYTHONS)
  # Each interpreter that compiles, as the command that runs it (the build's Python in the
  # probe's environment; another one with -E -s: its own packages, never the build
  # environment's, which are the build Python's minor), and the Python minors they are.
  set(pythons "")
  set(minors "")
  if(precompile_reason STREQUAL "")
    list(APPEND pythons "BUILD")
    list(APPEND minors "${build_minor}")
  endif()
  if(NOT VFA_FA4_PRECOMPILE STREQUAL "off")
    foreach(interpreter IN LISTS VFA_FA4_PRECOMPILE_PYTHONS)
      execute_process(COMMAND "${interpreter}" -E -s ${_VFA_FA4} probe --named
        OUTPUT_VARIABLE extra_probe ERROR_VARIABLE extra_err RESULT_VARIABLE extra_rc TIMEOUT 120)
      if(NOT extra_rc EQUAL 0)
        message(FATAL_ERROR "VFA_FA4_PRECOMPILE_PYTHONS: '${interpreter}' cannot run "
          "cmake/vfa_build/fa4/precompile.py (${extra_rc}): ${extra_err}. Name Python interpreters (3.10 or newer) "
          "with torch and the [fa4] extra installed, or leave the knob empty.")
      endif()
      string(JSON extra_reason GET "${extra_probe}" precompile)
      if(NOT extra_reason STREQUAL "")
        message(FATAL_ERROR "VFA_FA4_PRECOMPILE_PYTHONS: '${interpreter}': ${extra_reason}")
      endif()
      string(JSON extra_minor GET "${extra_probe}" python)
      if(interpreter STREQUAL Python_EXECUTABLE AND "BUILD" IN_LIST pythons)
        continue()  # the build's own Python named again compiles once
      endif()
      list(APPEND pythons "${interpreter}")
      list(APPEND minors "${extra_minor}")
    endforeach()
    list(REMOVE_DUPLICATES pythons)
    list(REMOVE_DUPLICATES minors)
    if(pythons AND NOT precompile_reason STREQUAL "")
      message(STATUS "vendored-flash-attn: FA4 kernels precompiled by VFA_FA4_PRECOMPILE_PYTHONS only: ${precompile_reason}")
      set(precompile_reason "")
    endif()
  endif()
  set(archs "")
  set(precompile_state "off")
  if(NOT VFA_FA4_PRECOMPILE STREQUAL "off")
    set(archs "${fa4_archs}")
    if(NOT archs)
      set(precompile_reason "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' has no arch FA4 runs on (the fa4 family's capabilities in cmake/knobs.json)")
    endif()
    if(precompile_reason STREQUAL "" AND fa4_archs_UNKNOWN)
      get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
      message(FATAL_ERROR "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' names ${fa4_archs_UNKNOWN}, where FA4 runs, "
        "but the arch table of ${file} (\"cuda_archs\") has no a target for it: nothing says which code that GPU "
        "loads, so its kernels cannot be precompiled. Add its row to the table, take it out of the list, or set "
        "VFA_FA4_PRECOMPILE=off.")
    endif()
    if(precompile_reason STREQUAL "")
      set(precompile_state "on")
    elseif(VFA_FA4_PRECOMPILE STREQUAL "on")
      message(FATAL_ERROR "VFA_FA4_PRECOMPILE=on, but ${precompile_reason}. Or set VFA_FA4_PRECOMPILE=off.")
    else()
      set(precompile_state "skipped")
      set(archs "")
      message(STATUS "vendored-flash-attn: FA4 kernels not precompiled (VFA_FA4_PRECOMPILE=auto): ${precompile_reason}")
    endif()
  endif()

  # What configure knows, for FA4's build record (written by the stage step).
  set(facts "{}")
  # FA4's record ships in the wheel: the wheel's form of the source record.
  vfa_json_source(sources flash_attention)
  vfa_wheel_source(sources "${sources}" flash_attention)
  string(JSON facts SET "${facts}" sources "${sources}")
  vfa_json_string(mode "${VFA_FA4_PRECOMPILE}")
  vfa_json_string(state "${precompile_state}")
  vfa_json_string(reason "${precompile_reason}")
  vfa_json_array(targets ${archs})
  # Interpreters are recorded by their Python minor, never by path (the record ships, and the
  # wheel's bytes must not depend on where this machine keeps them); the release gate
  # (wheel_check) wants kernels for each arch and each of these.
  if(precompile_state STREQUAL "on")
    vfa_json_array(minors_json ${minors})
  else()
    set(minors_json "[]")
  endif()
  string(JSON facts SET "${facts}" precompile
    "{\"mode\": ${mode}, \"state\": ${state}, \"reason\": ${reason}, \"archs\": ${targets}, \"pythons\": ${minors_json}, \"runs\": []}")
  set(facts_file "${CMAKE_CURRENT_BINARY_DIR}/fa4_configure.json")
  file(WRITE "${facts_file}.tmp" "${facts}\n")
  file(COPY_FILE "${facts_file}.tmp" "${facts_file}" ONLY_IF_DIFFERENT)

  set(stage "${CMAKE_CURRENT_BINARY_DIR}/fa4")
  set(package "${stage}/vendored_flash_attn/_fa4")
  # No CONFIGURE_DEPENDS: it makes every `ninja -n` (the progress monitor's dry run,
  # cmake/vfa_build/progress/build_monitor.py) stop at "Re-running CMake" and plan no unit. The files are
  # those of the verified source tree, re-listed and content-checked on every configure;
  # an edit to one of them re-stages through DEPENDS.
  file(GLOB_RECURSE inputs "${cute}/*.py" "${cute}/pyproject.toml" "${cute}/LICENSE"
       "${cute}/AUTHORS" "${cute}/README.md")
  set(deps "${VFA_BUILD_PY}/fa4/precompile.py" "${VFA_BUILD_PY}/fa4/stage.py"
      "${VFA_PROJECT_DIR}/python/vendored_flash_attn/families/fa4/deps.py"
      "${VFA_PROJECT_DIR}/python/vendored_flash_attn/families/fa4/cache.py" "${VFA_PROJECT_DIR}/pyproject.toml")
  # From scratch each time: no kernel of an earlier source or selection may stay behind.
  set(commands
    COMMAND "${CMAKE_COMMAND}" -E rm -rf "${package}" "${stage}/share"
    COMMAND ${build_python} ${_VFA_FA4} stage --cute-src "${cute}" --dest "${stage}" --record "${facts_file}")
  # The kernels of FA4's own selection (cmake/knobs.json: VFA_FA4_PRECOMPILE_HEAD_DIMS, _DTYPES,
  # _FEATURES, _GQA_RATIOS; a preset's values where not set), for each arch and each Python
  # (cmake/vfa_build/fa4/precompile.py plan lists them). No FA3 knob chooses any of it.
  # Upstream keys kernels on the Python minor, but their bytes do not depend on it: the first
  # Python compiles and leaves its keys in the arch's --share file; each other one compiles
  # every kernel too, compares each byte for byte and ships an index of the first one's files
  # (or its own set when any differs, saying why).
  # One argument per axis, its values joined by commas (a CMake list would become words).
  set(selection "")
  foreach(axis head-dims:HEAD_DIMS dtypes:DTYPES features:FEATURES gqa-ratios:GQA_RATIOS)
    string(REPLACE ":" ";" axis "${axis}")
    list(GET axis 0 flag)
    list(GET axis 1 knob)
    vfa_selection_knob(values VFA_FA4_PRECOMPILE_${knob})
    string(REPLACE ";" "," values "${values}")
    list(APPEND selection "--${flag}=${values}")
  endforeach()
  # Each worker is held to a per-kernel bound, and the step says how far it is at least once a
  # minute (cmake/vfa_build/fa4/workers.py); a step that precompiles runs in ninja's console pool, so those
  # lines reach the console as they come (ninja holds back a command's output until it ends
  # otherwise). It waits for the compiled modules (below), so the build's progress monitor,
  # also in that pool, has ended by then.
  set(terminal "")
  if(archs)
    set(terminal USES_TERMINAL)
  endif()
  vfa_option(VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT)
  set(flags --kernel-timeout ${VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT})
  if(VFA_FA4_PRECOMPILE STREQUAL "auto")
    list(APPEND flags --best-effort)
  endif()
  foreach(interpreter IN LISTS pythons)
    if(interpreter STREQUAL "BUILD")
      set(run ${build_python})
    else()
      set(run "${interpreter}" -E -s)
    endif()
    foreach(arch IN LISTS archs)
      # The CUDA flavour directory is created below kernels/ by the compile itself.
      list(APPEND commands COMMAND ${run} ${_VFA_FA4} compile --stage "${stage}"
        --out "${package}/kernels" --arch ${arch} ${selection} --jobs ${VFA_JOBS}
        --record "${package}/build_info.json" --share "${stage}/share/${arch}.json" ${flags})
    endforeach()
  endforeach()
  add_custom_command(OUTPUT "${stage}/.staged"
    ${commands}
    COMMAND "${CMAKE_COMMAND}" -E touch "${stage}/.staged"
    DEPENDS ${inputs} ${deps} "${facts_file}"
    COMMENT "vendored-flash-attn: staging FA4 as vendored_flash_attn._fa4.cute (precompile: ${precompile_state} ${archs})"
    ${terminal} VERBATIM)
  add_custom_target(vfa_fa4 ALL DEPENDS "${stage}/.staged")
  # The stage reads the sources the build verified, from the folder the source check
  # verified: where the build checks them again before anything reads them (the target
  # vfa_verified_sources, when the sources' build-time check defines it), the stage waits
  # for that check and a failed one stops the build first; an edit to a staged file
  # re-stages through DEPENDS above.
  if(TARGET vfa_verified_sources)
    add_dependencies(vfa_fa4 vfa_verified_sources)
  endif()
  if(archs)
    # The precompile runs VFA_JOBS workers (about 1.4 GB each): after the compiled modules
    # this build makes, so it never shares the machine with their compiles (the job pool's budget).
    if(VFA_BUILT_MODULES)
      add_dependencies(vfa_fa4 ${VFA_BUILT_MODULES})
    endif()
  endif()
  install(DIRECTORY "${package}" DESTINATION vendored_flash_attn
    PATTERN "__pycache__" EXCLUDE)
  set(VFA_FA4_BUILT TRUE PARENT_SCOPE)
  set(VFA_FA4_REASON "" PARENT_SCOPE)
  set(VFA_FA4_PRECOMPILE_ARCHS "${archs}" PARENT_SCOPE)
  message(STATUS "vendored-flash-attn: FA4 packaged as vendored_flash_attn._fa4.cute "
    "(precompile: ${precompile_state} ${archs})")
endfunction()
