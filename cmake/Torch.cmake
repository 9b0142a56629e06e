# Python and torch: the interpreter the wheel is built for, torch's CMake
# config (found without importing torch: torch_metadata.py), its headers at a
# path chosen by their content (torch_headers.py), and the nvcc flags torch
# would use (minus its -gencode list, which CudaArchs.cmake replaces per
# component).

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamSources.cmake)  # vfa_default_source_cache

set(VFA_MIN_TORCH_VERSION "2.10")

# Every compile includes torch's headers, and the compiler cache keys on the path they were
# read from (their line markers in the preprocessed text: C++ units and CUDA device compiles
# alike). Under pip's default build isolation torch lies in a fresh /tmp/pip-build-env-*
# folder each time, so each isolated build missed the cache for every unit that includes
# torch. So the compiles read a copy staged at a path that depends only on the headers'
# content: <store>/torch-<version>-<digest>/include (torch_headers.py, cmake/vfa_build/sources/staged_tree.py:
# verified when reused, this user's alone). torch's imported targets are pointed there;
# their libraries stay where they are (linking is not cached). Where the headers cannot be
# staged the build says why and compiles from torch's own folder, as before.
#   vfa_stage_torch_headers(/venv/.../site-packages/torch 2.14.1+cu130)
#     -> -isystem ~/.cache/vendored-flash-attn/staged/torch-2.14.1+cu130-58381128.../include
function(vfa_stage_torch_headers torch_root version)
  # The per-user staging folder: the one the upstream sources are staged in
  # (VFA_STAGED_SOURCES) when this build has one, else <user cache>/staged.
  if(DEFINED VFA_STAGED_SOURCES AND NOT VFA_STAGED_SOURCES STREQUAL "")
    set(store "${VFA_STAGED_SOURCES}")
  elseif(IS_ABSOLUTE "$ENV{XDG_CACHE_HOME}" OR IS_ABSOLUTE "$ENV{HOME}")
    vfa_default_source_cache(cache)
    set(store "${cache}/staged")
  else()
    set(store "")  # no user cache dir (vfa_default_source_cache would stop the configure)
  endif()
  if(store STREQUAL "")
    message(WARNING "vendored-flash-attn: torch's headers are compiled from ${torch_root}/include: "
      "neither XDG_CACHE_HOME nor HOME is an absolute path, so there is no user cache dir to stage "
      "them in, and a build from another torch folder (every build under pip's default isolation) "
      "misses the compiler cache for each unit that includes torch. Set HOME or XDG_CACHE_HOME.")
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${VFA_BUILD_PY}" sources.torch_headers --torch-root "${torch_root}"
            --version "${version}" --store "${store}"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(WARNING "vendored-flash-attn: torch's headers could not be staged (${err}); they are "
      "compiled from ${torch_root}/include, so a build from another torch folder (every build "
      "under pip's default isolation) misses the compiler cache for each unit that includes "
      "torch. Fix what the message says, or build with --no-build-isolation.")
    return()
  endif()
  string(REPLACE "\n" ";" out "${out}")
  list(GET out 0 staged)
  list(GET out 1 how)
  set(from "${torch_root}/include")
  string(LENGTH "${from}/" n)
  get_directory_property(targets IMPORTED_TARGETS)
  foreach(target IN LISTS targets)
    foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
      get_target_property(dirs ${target} ${property})
      if(NOT dirs)
        continue()
      endif()
      set(moved "")
      foreach(dir IN LISTS dirs)
        # <from> itself or a folder under it; "<from>x" is another folder.
        string(SUBSTRING "${dir}/" 0 ${n} head)
        if(head STREQUAL "${from}/")
          string(SUBSTRING "${dir}/" ${n} -1 tail)
          string(REGEX REPLACE "/$" "" dir "${staged}/include/${tail}")
        endif()
        list(APPEND moved "${dir}")
      endforeach()
      set_target_properties(${target} PROPERTIES ${property} "${moved}")
    endforeach()
  endforeach()
  message(STATUS "vendored-flash-attn: torch's headers: ${staged}/include (${how}, by content, from ${from})")
endfunction()

macro(vfa_find_python_and_torch)
  # abi3 modules: the limited API of the interpreter we build with.
  find_package(Python REQUIRED COMPONENTS Interpreter Development.Module Development.SABIModule)

  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${VFA_BUILD_PY}" sources.torch_metadata
    OUTPUT_VARIABLE _vfa_torch_out ERROR_VARIABLE _vfa_torch_err RESULT_VARIABLE _vfa_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _vfa_torch_rc EQUAL 0)
    message(FATAL_ERROR
      "Cannot find torch for ${Python_EXECUTABLE}:\n${_vfa_torch_err}\n"
      "The modules compile against torch's headers. With --no-build-isolation, install "
      "torch>=${VFA_MIN_TORCH_VERSION} (a CUDA build) into that environment first.")
  endif()
  string(REPLACE "\n" ";" _vfa_torch_out "${_vfa_torch_out}")
  list(GET _vfa_torch_out 0 _vfa_torch_prefix)
  list(GET _vfa_torch_out 1 VFA_TORCH_VERSION)
  list(LENGTH _vfa_torch_out _vfa_n)
  set(VFA_TORCH_CUDA_VERSION "")
  if(_vfa_n GREATER 2)
    list(GET _vfa_torch_out 2 VFA_TORCH_CUDA_VERSION)
  endif()
  string(REGEX MATCH "^[0-9]+\\.[0-9]+(\\.[0-9]+)?" _vfa_torch_release "${VFA_TORCH_VERSION}")
  if(_vfa_torch_release VERSION_LESS VFA_MIN_TORCH_VERSION)
    message(FATAL_ERROR
      "torch ${VFA_TORCH_VERSION} is too old: the upstream code uses the torch stable ABI "
      "headers of torch >= ${VFA_MIN_TORCH_VERSION}. Install a newer torch.")
  endif()
  if(VFA_TORCH_CUDA_VERSION STREQUAL "")
    message(FATAL_ERROR
      "torch ${VFA_TORCH_VERSION} is a CPU-only build; install a CUDA build of torch "
      "(matching CUDA ${CMAKE_CUDA_COMPILER_VERSION}) to build the CUDA modules.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_vfa_torch_prefix}")

  vfa_export_cuda_toolkit_root()
  # torch reads the arch list from the environment; give it ours (its -gencode
  # list is dropped below anyway, this only keeps its log truthful).
  set(ENV{TORCH_CUDA_ARCH_LIST} "${TORCH_CUDA_ARCH_LIST}")
  # torch's CMake config reports its own -gencode choice ("Added CUDA NVCC flags for:
  # ... sm_90"), which this build drops: each module gets its own list (FA3 sm_90a),
  # stated in the FA2/FA3 lines below. And it warns about two things this build does not
  # use: CMAKE_CUDA_ARCHITECTURES (which enable_language(CUDA) sets; the modules set
  # CUDA_ARCHITECTURES OFF and get their -gencode flags from CudaArchs.cmake), and
  # "library kineto not found" (torch's wheels link kineto into libtorch_cpu; the modules
  # link the `torch` target, not TORCH_LIBRARIES). The first is not triggered: the variable
  # is unset around torch's config. At the default log level its status lines and warnings
  # go (its errors stay); any --log-level given to cmake (pip:
  # -C cmake.args=--log-level=STATUS), or a CMAKE_MESSAGE_LOG_LEVEL asking for more than
  # STATUS, shows them all.
  set(_vfa_saved_log_level "${CMAKE_MESSAGE_LOG_LEVEL}")
  set(_vfa_torch_note "")
  cmake_language(GET_MESSAGE_LOG_LEVEL _vfa_log_level)
  if(_vfa_log_level STREQUAL "STATUS")
    set(CMAKE_MESSAGE_LOG_LEVEL ERROR)
    cmake_language(GET_MESSAGE_LOG_LEVEL _vfa_log_level)  # still STATUS under --log-level
    if(_vfa_log_level STREQUAL "ERROR")
      set(_vfa_torch_note "; its CMake config's status lines and warnings are hidden (--log-level=STATUS shows them)")
    endif()
  endif()
  set(_vfa_saved_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  set(_vfa_saved_cuda_archs_cache "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
  get_property(_vfa_cuda_archs_cached CACHE CMAKE_CUDA_ARCHITECTURES PROPERTY TYPE SET)
  unset(CMAKE_CUDA_ARCHITECTURES)
  unset(CMAKE_CUDA_ARCHITECTURES CACHE)
  find_package(Torch REQUIRED)
  if(_vfa_cuda_archs_cached)
    set(CMAKE_CUDA_ARCHITECTURES "${_vfa_saved_cuda_archs_cache}" CACHE STRING "CUDA architectures")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_vfa_saved_cuda_archs}")
  set(CMAKE_MESSAGE_LOG_LEVEL "${_vfa_saved_log_level}")
  # TORCH_INSTALL_PREFIX: the folder torch's config names its include dirs by.
  vfa_stage_torch_headers("${TORCH_INSTALL_PREFIX}" "${VFA_TORCH_VERSION}")
  message(STATUS "vendored-flash-attn: torch ${VFA_TORCH_VERSION} (CUDA ${VFA_TORCH_CUDA_VERSION}) at "
    "${_vfa_torch_prefix}${_vfa_torch_note}")

  # torch appends its own -gencode list to CMAKE_CUDA_FLAGS; the archs are set
  # per component instead, so drop it here.
  string(REGEX REPLACE "-gencode[= ]arch=[^ ]+" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
  string(REGEX REPLACE "  +" " " CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")

  # The flags upstream adds on top of torch's (its get_torch_gpu_compiler_flags):
  # torch's COMMON_NVCC_FLAGS minus the __CUDA_NO_HALF* defines, which CUDA 12+
  # does not need, plus FP8, fast math and direct CUTLASS driver calls.
  set(VFA_NVCC_FLAGS --expt-relaxed-constexpr -DENABLE_FP8 --expt-extended-lambda --use_fast_math)
endmacro()
