# The kernel instantiation files a selection of build knobs compiles, from the build's own
# rule (cmake/KernelSelection.cmake), without configuring a build:
#
#   cmake -DVFA_PRESET=full -DVFA_FA3_HEAD_DIMS=96 [-DVFA_BUILD_FA2=OFF ...] -P cmake/kernel_units.cmake
#
# prints one line per unit, "fa3 <file name>" or "fa2 <file name>". The knobs are read like
# a configure reads them (-D, else the environment, else the default). The units every
# build of a module also compiles (FA3 combine + scheduler, the C++ API files, FA2's stubs
# of left-out kernels) are not listed. benchmarks/dist_model.py uses this for the slices of `full`.
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/KernelSelection.cmake)
vfa_read_selection()
vfa_option(VFA_BUILD_FA3)
vfa_option(VFA_BUILD_FA2)
set(lines "")
if(NOT VFA_BUILD_FA3 STREQUAL "off")
  vfa_fa3_selection("${VFA_FA3_HEAD_DIMS}" "${VFA_FA3_DTYPES}" "${VFA_FA3_FEATURES}")
  foreach(rel IN LISTS VFA_FA3_INSTANTIATIONS)
    get_filename_component(name "${rel}" NAME)
    string(APPEND lines "fa3 ${name}\n")
  endforeach()
endif()
if(NOT VFA_BUILD_FA2 STREQUAL "off")
  vfa_fa2_selection("${VFA_FA2_HEAD_DIMS}" "${VFA_FA2_DTYPES}" "${VFA_FA2_FEATURES}")
  foreach(rel IN LISTS VFA_FA2_INSTANTIATIONS)
    get_filename_component(name "${rel}" NAME)
    string(APPEND lines "fa2 ${name}\n")
  endforeach()
endif()
# stdout (message() writes to stderr)
execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${lines}")
