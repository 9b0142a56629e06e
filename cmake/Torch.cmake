# Python and torch: the interpreter the wheel is built for, torch's CMake
# config (found without importing torch: torch_metadata.py), and the nvcc
# flags torch would use (minus its -gencode list, which CudaArchs.cmake
# replaces per component).

include_guard(GLOBAL)

set(VFA_MIN_TORCH_VERSION "2.10")
set(_VFA_TORCH_METADATA_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/torch_metadata.py")

macro(vfa_find_python_and_torch)
  # abi3 modules: the limited API of the interpreter we build with.
  find_package(Python REQUIRED COMPONENTS Interpreter Development.Module Development.SABIModule)

  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${_VFA_TORCH_METADATA_SCRIPT}"
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
