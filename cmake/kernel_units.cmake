# The kernel instantiation files a selection of build knobs compiles, from the build's own
# rule (cmake/KernelSelection.cmake), without configuring a build:
#
#   cmake -DVFA_PRESET=full -DVFA_FA3_HEAD_DIMS=96 [-DVFA_BUILD_FA2=OFF ...] -P cmake/kernel_units.cmake
#
# prints one line per unit, "<family> <file name>" ("fa2 flash_fwd_...", "fa3 ..."). The knobs are read like
# a configure reads them (-D, else the environment, else the default). The units every
# build of a module also compiles (FA3 combine + scheduler, the C++ API files, FA2's stubs
# of left-out kernels) are not listed. benchmarks/dist_model.py uses this for the slices of `full`.
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/KernelSelection.cmake)
vfa_read_selection()
set(lines "")
# Every compiled family of cmake/knobs.json, through its declared rule (vfa_family_selection).
vfa_declared_families(families extension)
foreach(family IN LISTS families)
  string(TOUPPER "${family}" part)
  vfa_family_field(build_knob ${family} build_knob "")
  vfa_option(${build_knob})
  if(NOT ${build_knob} STREQUAL "off")
    foreach(field head_dims dtypes features)
      vfa_family_field(knob ${family} ${field}_knob "")
      set(chosen_${field} "")
      if(NOT knob STREQUAL "")
        set(chosen_${field} "${${knob}}")
      endif()
    endforeach()
    vfa_family_selection(${family} "${chosen_head_dims}" "${chosen_dtypes}" "${chosen_features}")
    foreach(rel IN LISTS VFA_${part}_INSTANTIATIONS)
      get_filename_component(name "${rel}" NAME)
      string(APPEND lines "${family} ${name}\n")
    endforeach()
  endif()
endforeach()
# stdout (message() writes to stderr)
execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${lines}")
