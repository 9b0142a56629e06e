# Build progress: what a user sees while the modules compile.
#
# A cold build runs for half an hour on a small machine, and ninja prints a unit only
# when it ends (minutes without a line), under ~100 warnings about upstream code that no
# user can act on. So every compile of the given targets goes through
# cmake/vfa_build/units/compile_unit.py, in front of the launcher the targets already have (sccache or
# none): it records when each unit starts and ends and keeps the warnings located in
# the pinned upstream and CUTLASS off the console. And a `build_progress` target in
# ninja's console pool (cmake/vfa_build/progress/build_monitor.py) prints, while the units compile, a line
# per finished unit and every VFA_BUILD_PROGRESS_INTERVAL seconds the units running, how
# many are done, the elapsed time and an estimate of what is left. Errors, and warnings
# located anywhere else, are shown as the compiler printed them.
#
#   VFA_BUILD_PROGRESS           on (default), off: neither launcher nor monitor
#   VFA_BUILD_PROGRESS_INTERVAL  seconds between progress lines while units compile (30)
#
# While the monitor holds ninja's console, ninja keeps of the other units what they print,
# each with its "[n/N] Building CUDA object ..." status line, and the last status line, and
# prints them once the monitor ends. So a unit hands what it shows (warnings located outside
# upstream) to the monitor, which prints it at once, after the unit's line (compile_unit.py,
# relay); upstream noise stays in the log, ptxas's C7514 notes on upstream's FP8 kernels
# included (compiler_output.py), counted apart from the compiler warnings. pip builds run
# ninja with --quiet (pyproject.toml's build.tool-args): no status lines at all, so none
# comes after the monitor's last line (after its "interrupted" line on a Ctrl-C).
#
# The monitor prints a line per unit that compiled (not those the compiler cache answered:
# the status lines count them), and the status line VFA_BUILD_PROGRESS_INTERVAL seconds after
# the last line, then twice as long each time nothing else came (up to 5 min); its estimate
# of what is left, and what it was against what was actually left at 10-90 % of the build,
# go to vfa-estimate.json (build_monitor.py, docs/PERFORMANCE.md "Build progress estimate").
#
# In the build dir: vfa-compile.log (every unit's whole compiler output, and the compiler
# cache's statistics at the end), vfa-progress.log (the progress lines; `tail -f` it where
# pip runs without -v and shows nothing until the build ends), vfa-progress.tsv (the
# start/end events); each holds one build, the last build's is NAME.1 (compile_unit.py). An
# interrupt (Ctrl-C) stops every compile of the build, in sccache's server too, and the
# monitor says so in one line.
#
# Example, after the targets and the job pool (VFA_JOBS) exist:
#   vfa_setup_build_progress(_vendored_fa2_C _vendored_fa3_C)   (CMakeLists.txt: the modules this build makes)
#   -- vendored-flash-attn: build progress: a line per unit that compiles, the units running every
#      30 s or less often; warnings located in upstream code go only to <build>/vfa-compile.log, ...

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

# The install step (scikit-build-core's `cmake --install`) lists no file: an "-- Installing:"
# line per file of the wheel said nothing a user needs (the wheel's contents are listed by
# `unzip -l`).
set(CMAKE_INSTALL_MESSAGE NEVER)


# A kind of CUDA unit of <target> for the progress estimate, with its reference seconds
# compiled and, optionally, answered by the compiler cache (cmake/vfa_build/progress/build_monitor.py): the units
# whose path holds <path text> ("" for any; the first kind declared that matches wins). Each
# family's target file declares its module's kinds, so the monitor names no family.
#   vfa_unit_kind(_vendored_fa3_C "FA3 CUDA" 153 "/instantiations/" 11.5)
function(vfa_unit_kind target kind seconds contains)
  if(kind MATCHES "[|;]" OR contains MATCHES "[|;]")
    message(FATAL_ERROR "vfa_unit_kind(${target}): '|' and ';' cannot be part of a kind or path text.")
  endif()
  set(cached "${ARGV4}")
  set_property(TARGET ${target} APPEND PROPERTY VFA_UNIT_KINDS "${target}|${kind}|${seconds}|${contains}|${cached}")
endfunction()

function(vfa_setup_build_progress)
  # Types and ranges are checked by vfa_option (cmake/knobs.json).
  vfa_option(VFA_BUILD_PROGRESS)
  vfa_option(VFA_BUILD_PROGRESS_INTERVAL)
  string(TOLOWER "${VFA_BUILD_PROGRESS}" mode)
  if(mode STREQUAL "off")
    return()
  endif()
  if("${ARGN}" STREQUAL "")
    # No compiled module (a wheel of FA4 alone): no unit to follow, and a monitor handed no
    # target would stop the build (its --targets takes one at least).
    message(STATUS "vendored-flash-attn: build progress: no CUDA or C++ unit to compile (no compiled module in this build)")
    return()
  endif()

  # -E -s -S: the interpreter's standard library only, whatever the environment says.
  set(python "${Python_EXECUTABLE}" -E -s -S)
  set(wrapper ${python} "${VFA_BUILD_PY}" units.compile_unit "${CMAKE_BINARY_DIR}"
      --quiet-under "${VFA_flash_attention_SOURCE_DIR}" --quiet-under "${VFA_cutlass_SOURCE_DIR}" --)
  set(targets "")
  set(unit_kinds "")
  foreach(target IN LISTS ARGN)
    list(APPEND targets ${target})
    get_target_property(kinds ${target} VFA_UNIT_KINDS)
    foreach(kind IN LISTS kinds)
      if(kind)
        list(APPEND unit_kinds --unit-kind "${kind}")
      endif()
    endforeach()
    foreach(lang CXX CUDA)
      get_target_property(launcher ${target} ${lang}_COMPILER_LAUNCHER)
      if(NOT launcher)
        set(launcher "")
      endif()
      set_property(TARGET ${target} PROPERTY ${lang}_COMPILER_LAUNCHER ${wrapper} ${launcher})
    endforeach()
  endforeach()

  set(log "${CMAKE_BINARY_DIR}/vfa-compile.log")
  # How many units the compiler cache answered, from its server (cmake/CompilerCache.cmake).
  set(cache_stats "")
  if(VFA_COMPILER_CACHE_ENABLED AND VFA_SCCACHE_SETTINGS)
    set(cache_stats --sccache-settings "${VFA_SCCACHE_SETTINGS}")
  endif()
  if(CMAKE_GENERATOR MATCHES "Ninja")
    # The console pool is the one way to print while other commands run (ninja buffers
    # their output); the monitor ends itself and always exits 0 (build_monitor.py).
    add_custom_target(build_progress ALL
      COMMAND ${python} "${VFA_BUILD_PY}" progress.build_monitor --dir "${CMAKE_BINARY_DIR}" --targets ${targets}
              --jobs ${VFA_JOBS} --interval ${VFA_BUILD_PROGRESS_INTERVAL} ${unit_kinds} ${cache_stats}
      COMMENT "vendored-flash-attn: compile progress"
      USES_TERMINAL VERBATIM)
    message(STATUS "vendored-flash-attn: build progress: a line per unit that compiles, the units running "
      "every ${VFA_BUILD_PROGRESS_INTERVAL} s or less often; warnings located in upstream code go only to ${log}, "
      "with all compiler output")
  else()
    message(STATUS "vendored-flash-attn: warnings located in upstream code go only to ${log}, with all "
      "compiler output (progress lines need the Ninja generator)")
  endif()
endfunction()
