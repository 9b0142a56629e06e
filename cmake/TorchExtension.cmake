# One function that defines a torch-stable-ABI CUDA extension module the way
# every compiled family needs it (cmake/FamilyTarget.cmake calls it): abi3 (limited API), C++20 host and device code,
# per-module -gencode flags, our memory-aware job pool, installed into the
# Python package.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/CudaArchs.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

# torch >= 2.10 stable ABI: pins the headers' target version and bans unstable use.
set(VFA_TORCH_TARGET_VERSION "0x020A000000000000ULL")

# CUTLASS calls the CUDA driver (cuTensorMapEncodeTiled, ...). Upstream compiles
# its CUDA units (nvcc only, not its C++ units) with
# CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1 and links libcuda (CUDA::cuda_driver).
# A toolkit without libcuda or its stub (lib64/stubs/libcuda.so), as on a GPU-less
# CI machine, has no such target; there CUTLASS reaches the driver through the
# runtime's entry-point query (cudaGetDriverEntryPoint, its default) instead, so
# the build needs no driver. The manylinux CUDA images that release wheels build
# in have the stub, so they build upstream's way. The choice is printed here and
# recorded in the build info (cuda_driver_call).
#   VFA_CUDA_DRIVER_CALL=auto         direct where CUDA::cuda_driver exists, else entry_point
#   VFA_CUDA_DRIVER_CALL=direct       upstream's way; stops where there is no libcuda
#   VFA_CUDA_DRIVER_CALL=entry_point  never links libcuda
# Sets VFA_CUDA_DRIVER_CALL (direct or entry_point) and VFA_CUDA_DRIVER_CALL_REASON.
function(vfa_select_cuda_driver_call)
  vfa_option(VFA_CUDA_DRIVER_CALL)
  set(mode "${VFA_CUDA_DRIVER_CALL}")
  # (No paths here: the reason goes into the build info.)
  if(TARGET CUDA::cuda_driver AND CUDA_cuda_driver_LIBRARY MATCHES "/stubs/")
    set(found "the toolkit has the driver stub")
  elseif(TARGET CUDA::cuda_driver)
    set(found "this machine has libcuda")
  else()
    set(found "this machine has no libcuda, and the toolkit no stub lib64/stubs/libcuda.so")
  endif()
  if(mode STREQUAL "direct" AND NOT TARGET CUDA::cuda_driver)
    message(FATAL_ERROR
      "VFA_CUDA_DRIVER_CALL=direct, but ${found}, so there is no CUDA::cuda_driver to "
      "link. Use a toolkit with the driver stub (the manylinux CUDA images have it), or "
      "VFA_CUDA_DRIVER_CALL=auto.")
  elseif(mode STREQUAL "auto" AND TARGET CUDA::cuda_driver)
    set(mode "direct")
    set(reason "auto: ${found}; as upstream")
  elseif(mode STREQUAL "auto")
    set(mode "entry_point")
    set(reason "auto: ${found}; upstream calls the driver directly")
  else()
    set(reason "VFA_CUDA_DRIVER_CALL=${mode}")
  endif()
  message(STATUS "vendored-flash-attn: CUTLASS driver calls: ${mode} (${reason})")
  set(VFA_CUDA_DRIVER_CALL "${mode}" PARENT_SCOPE)
  set(VFA_CUDA_DRIVER_CALL_REASON "${reason}" PARENT_SCOPE)
endfunction()

# Fatbin compression (nvcc >= 12.8 --compress-mode): how device code is stored in the
# module. Measured (docs/wheel-size.md): "size" stores the minimal FA3 module in 32 %
# of the bytes and FA2 in 27 % (the wheel shrinks by about half), compiles as fast,
# and on the H200 neither the first call (module load included) nor the kernels got
# slower. So "auto" means "size" where nvcc has the option, nvcc's default elsewhere.
function(vfa_select_fatbin_compression nvcc_version)
  vfa_option(VFA_FATBIN_COMPRESSION)
  set(mode "${VFA_FATBIN_COMPRESSION}")
  if(mode STREQUAL "auto")
    if(nvcc_version VERSION_LESS 12.8)
      set(mode "default")
    else()
      set(mode "size")
    endif()
  endif()
  set(flags "")
  if(NOT mode STREQUAL "default")
    if(nvcc_version VERSION_LESS 12.8)
      message(FATAL_ERROR
        "VFA_FATBIN_COMPRESSION=${mode} needs nvcc 12.8 or newer (--compress-mode); this is "
        "nvcc ${nvcc_version}. Use VFA_FATBIN_COMPRESSION=auto or default.")
    endif()
    set(flags "--compress-mode=${mode}")
  endif()
  set(VFA_FATBIN_FLAGS "${flags}" PARENT_SCOPE)
  set(VFA_FATBIN_COMPRESSION "${mode}" PARENT_SCOPE)
endfunction()

# vfa_add_torch_extension(<name> SOURCES ... GENCODE ... DEFINES ... INCLUDE_DIRS ...)
function(vfa_add_torch_extension name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;GENCODE;DEFINES;INCLUDE_DIRS")
  # Py_LIMITED_API=3, as upstream: the module uses the stable ABI only.
  Python_add_library(${name} MODULE USE_SABI 3 WITH_SOABI ${arg_SOURCES})
  set_target_properties(${name} PROPERTIES
    CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
    CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
    CUDA_ARCHITECTURES OFF
    JOB_POOL_COMPILE ${VFA_JOB_POOL})

  vfa_gencode_flags(gencode_flags ${arg_GENCODE})
  set(cuda_flags ${VFA_NVCC_FLAGS} ${VFA_FATBIN_FLAGS})
  if(VFA_NVCC_THREADS GREATER 1)
    list(APPEND cuda_flags --threads=${VFA_NVCC_THREADS})
  endif()
  target_compile_options(${name} PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:${cuda_flags}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:${gencode_flags}>")

  set(defines ${arg_DEFINES} TORCH_EXTENSION_NAME=${name} USE_CUDA
              TORCH_TARGET_VERSION=${VFA_TORCH_TARGET_VERSION})
  set(libraries torch CUDA::cudart)
  target_compile_definitions(${name} PRIVATE ${defines})
  if(VFA_CUDA_DRIVER_CALL STREQUAL "direct")
    # CUDA units only, as upstream (its C++ units do not get it). Not in the build
    # info's defines: it records the choice as cuda_driver_call.
    target_compile_definitions(${name} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1>")
    list(APPEND libraries CUDA::cuda_driver)
  endif()
  target_include_directories(${name} PRIVATE ${arg_INCLUDE_DIRS})
  target_link_libraries(${name} PRIVATE ${libraries})
  install(TARGETS ${name} LIBRARY DESTINATION vendored_flash_attn)
  set_property(GLOBAL PROPERTY VFA_${name}_DEFINES "${defines}")
  set_property(GLOBAL PROPERTY VFA_${name}_DRIVER_CALL "${VFA_CUDA_DRIVER_CALL}")
endfunction()
