# CUDA architectures. One knob, TORCH_CUDA_ARCH_LIST (the ecosystem's name),
# decides what each component compiles for; the -gencode flags are set per
# component, never as one global list:
#   FA2: sm_80 SASS + compute_80 PTX when the list has any arch >= 8.0
#        (FA2 only has sm80 kernels; the PTX serves newer GPUs through the
#        driver's JIT), plus sm_90 SASS when the list has 9.x and
#        VFA_FA2_SM90_SASS is on (no JIT on Hopper, at twice the build time).
#   FA3: exactly sm_90a, only when the list has 9.0 and nvcc >= 12.3.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(VFA_FA3_MIN_NVCC "12.3")

# Parses "8.0 8.6;9.0a,9.0+PTX Hopper" into numeric archs ("8.0;8.6;9.0").
function(vfa_parse_arch_list out_var text)
  string(REGEX REPLACE "[ ,;]+" ";" tokens "${text}")
  set(archs "")
  foreach(token IN LISTS tokens)
    if(token STREQUAL "")
      continue()
    endif()
    string(TOLOWER "${token}" lower)
    if(lower STREQUAL "ampere")
      list(APPEND archs 8.0 8.6)
    elseif(lower STREQUAL "ada")
      list(APPEND archs 8.9)
    elseif(lower STREQUAL "hopper")
      list(APPEND archs 9.0)
    elseif(lower STREQUAL "blackwell")
      list(APPEND archs 10.0 12.0)
    elseif(lower MATCHES "^([0-9]+)\\.([0-9]+)[af]?(\\+ptx)?$")
      list(APPEND archs "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    else()
      message(FATAL_ERROR
        "TORCH_CUDA_ARCH_LIST: '${token}' is not an architecture. Use compute capabilities "
        "such as \"8.0;9.0\" (also 9.0a, 8.6+PTX) or Ampere/Ada/Hopper/Blackwell.")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES archs)
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()

# Sets VFA_CUDA_ARCHS, VFA_FA2_GENCODE / VFA_FA3_GENCODE (code names such as
# sm_80, compute_80, sm_90a) and VFA_FA{2,3}_ARCH_OK / _ARCH_REASON.
function(vfa_select_cuda_archs nvcc_version)
  vfa_option(TORCH_CUDA_ARCH_LIST)
  vfa_option(VFA_FA2_SM90_SASS)
  vfa_option(VFA_FA2_PTX)
  set(sm90_sass ${VFA_FA2_SM90_SASS})
  set(ptx ${VFA_FA2_PTX})
  vfa_parse_arch_list(archs "${TORCH_CUDA_ARCH_LIST}")

  set(fa2 "")
  set(has_80_plus FALSE)
  set(has_8x FALSE)
  set(has_9x FALSE)
  set(has_90 FALSE)
  foreach(arch IN LISTS archs)
    if(arch VERSION_GREATER_EQUAL 8.0)
      set(has_80_plus TRUE)
    endif()
    if(arch MATCHES "^8\\.")
      set(has_8x TRUE)
    endif()
    if(arch MATCHES "^9\\.")
      set(has_9x TRUE)
    endif()
    if(arch STREQUAL "9.0")
      set(has_90 TRUE)
    endif()
  endforeach()

  if(has_80_plus)
    # sm_80 SASS runs on every 8.x GPU; keep it whenever 8.x is asked for or
    # nothing else would give FA2 machine code.
    if(has_8x OR NOT (has_9x AND sm90_sass))
      list(APPEND fa2 sm_80)
    endif()
    if(has_9x AND sm90_sass)
      list(APPEND fa2 sm_90)
    endif()
    if(ptx)
      list(APPEND fa2 compute_80)
    endif()
    set(fa2_ok TRUE)
    set(fa2_reason "")
  else()
    set(fa2_ok FALSE)
    set(fa2_reason "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' has no architecture >= 8.0")
  endif()

  if(NOT has_90)
    set(fa3_ok FALSE)
    set(fa3_reason "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' does not contain 9.0")
    set(fa3 "")
  elseif(nvcc_version VERSION_LESS VFA_FA3_MIN_NVCC)
    set(fa3_ok FALSE)
    set(fa3_reason "nvcc ${nvcc_version} is older than ${VFA_FA3_MIN_NVCC}, which FA3 (sm_90a) needs")
    set(fa3 "")
  else()
    set(fa3_ok TRUE)
    set(fa3_reason "")
    set(fa3 sm_90a)
  endif()

  set(VFA_CUDA_ARCHS "${archs}" PARENT_SCOPE)
  set(VFA_FA2_GENCODE "${fa2}" PARENT_SCOPE)
  set(VFA_FA3_GENCODE "${fa3}" PARENT_SCOPE)
  set(VFA_FA2_ARCH_OK ${fa2_ok} PARENT_SCOPE)
  set(VFA_FA2_ARCH_REASON "${fa2_reason}" PARENT_SCOPE)
  set(VFA_FA3_ARCH_OK ${fa3_ok} PARENT_SCOPE)
  set(VFA_FA3_ARCH_REASON "${fa3_reason}" PARENT_SCOPE)
  set(TORCH_CUDA_ARCH_LIST "${TORCH_CUDA_ARCH_LIST}" PARENT_SCOPE)
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
