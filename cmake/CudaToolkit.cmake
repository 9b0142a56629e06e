# The CUDA toolkit: pick the real nvcc before project(), then tell torch's
# CMake config where the toolkit is.
#
# On build machines `nvcc` on PATH can be a wrapper script outside the toolkit
# (e.g. /usr/local/bin/nvcc exec'ing /usr/local/cuda-13.0/bin/nvcc). torch's
# CMake config still uses legacy FindCUDA, which derives the toolkit from
# nvcc's folder and then fails with "cannot find the CUDA libraries". So we
# resolve the real compiler (CUDA_HOME/CUDA_PATH first, else ask nvcc where it
# lives) and pass CUDA_TOOLKIT_ROOT_DIR explicitly.

include_guard(GLOBAL)

# Before project(): sets CMAKE_CUDA_COMPILER unless the user chose one.
function(vfa_select_cuda_compiler)
  if(DEFINED CMAKE_CUDA_COMPILER OR DEFINED ENV{CUDACXX})
    return()
  endif()
  foreach(root IN ITEMS "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
    if(NOT root STREQUAL "" AND EXISTS "${root}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${root}/bin/nvcc" CACHE FILEPATH "CUDA compiler")
      return()
    endif()
  endforeach()
  find_program(_vfa_nvcc nvcc PATHS /usr/local/cuda/bin)
  if(NOT _vfa_nvcc)
    # Which nvcc each compiled family needs beyond the arch table's: its declared archs.nvcc.
    vfa_declared_families(_vfa_families extension)
    set(_vfa_needs "")
    foreach(_vfa_family IN LISTS _vfa_families)
      vfa_family_field(_vfa_nvcc_min ${_vfa_family} "archs;nvcc" "")
      string(TOUPPER "${_vfa_family}" _vfa_title)
      if(_vfa_nvcc_min)
        list(APPEND _vfa_needs "${_vfa_nvcc_min} or newer to build ${_vfa_title}")
      endif()
    endforeach()
    list(JOIN _vfa_needs ", " _vfa_needs)
    if(_vfa_needs)
      set(_vfa_needs " (${_vfa_needs})")
    endif()
    message(FATAL_ERROR
      "nvcc was not found. Install the CUDA toolkit${_vfa_needs} and set "
      "CUDA_HOME to its folder, or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc.")
  endif()
  # A dry run prints the folder of the real compiler as `#$ _HERE_=...`.
  execute_process(
    COMMAND "${_vfa_nvcc}" --dryrun -c -x cu /dev/null -o /dev/null
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if("${out}${err}" MATCHES "#\\$ _HERE_=([^\n]+)")
    string(STRIP "${CMAKE_MATCH_1}" here)
    set(CMAKE_CUDA_COMPILER "${here}/nvcc" CACHE FILEPATH "CUDA compiler")
  else()
    set(CMAKE_CUDA_COMPILER "${_vfa_nvcc}" CACHE FILEPATH "CUDA compiler")
  endif()
endfunction()

# After project(): the toolkit folder for torch's FindCUDA/FindCUDAToolkit.
macro(vfa_export_cuda_toolkit_root)
  if(NOT DEFINED CUDA_TOOLKIT_ROOT_DIR)
    set(CUDA_TOOLKIT_ROOT_DIR "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}")
  endif()
  if(NOT DEFINED CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT "${CUDA_TOOLKIT_ROOT_DIR}")
  endif()
  message(STATUS "vendored-flash-attn: CUDA ${CMAKE_CUDA_COMPILER_VERSION} at ${CUDA_TOOLKIT_ROOT_DIR}")
endmacro()
