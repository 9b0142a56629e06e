# CUDA architectures. One knob, TORCH_CUDA_ARCH_LIST (the ecosystem's name),
# decides what each component compiles for; the -gencode flags are set per
# component, never as one global list:
#   FA2: sm_80 SASS + compute_80 PTX when the list has any arch >= 8.0
#        (FA2 only has sm80 kernels; the PTX serves newer GPUs through the
#        driver's JIT), plus sm_90 SASS when the list has 9.x and
#        VFA_FA2_SM90_SASS is on (no JIT on Hopper, at twice the build time).
#   FA3: exactly sm_90a, only when the list has 9.0 and nvcc >= 12.3.
# FA2's lowest arch is its family's declared capabilities.min (cmake/knobs.json; "8.0" ->
# sm_80/compute_80), and an arch its family is not declared for (below min, excluded, or
# of a generation it does not list) is not counted as one FA2 serves; FA3's declaration
# must say 9.0 only (its code is sm_90a), else the configure stops.
# +PTX is honoured where the build has such PTX: FA2's lowest arch (8.0+PTX, needs
# VFA_FA2_PTX=ON); any other (9.0+PTX) stops the configure, as does a list that names no
# architecture (";"), before torch's CMake reads it.
# Every arch >= 8.0 of the list must get code that runs there: FA2 not built
# (VFA_BUILD_FA2=off) is the only way to leave one without, and gets a warning;
# otherwise a listed arch that nothing runs on (10.0 with VFA_FA2_PTX=OFF: sm_80
# SASS runs on 8.x only) stops the configure, naming the knob. pip shows a build's
# output only when it fails, so a warning would reach nobody who did not pass -v.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

set(VFA_FA3_MIN_NVCC "12.3")

# Parses "8.0 8.6;9.0a,8.0+PTX Hopper" into numeric archs ("8.0;8.6;9.0"), and the
# archs written with +PTX into <out_var>_PTX ("8.0"). A list that names no architecture
# (empty, or separators only: ";") stops here, before torch's CMake reads it.
function(vfa_parse_arch_list out_var text)
  string(REGEX REPLACE "[ ,;]+" ";" tokens "${text}")
  set(archs "")
  set(ptx "")
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
      if(CMAKE_MATCH_3)
        list(APPEND ptx "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      endif()
    else()
      message(FATAL_ERROR
        "TORCH_CUDA_ARCH_LIST: '${token}' is not an architecture. Use compute capabilities "
        "such as \"8.0;9.0\" (also 9.0a, 8.0+PTX) or Ampere/Ada/Hopper/Blackwell.")
    endif()
  endforeach()
  if(NOT archs)
    message(FATAL_ERROR
      "TORCH_CUDA_ARCH_LIST='${text}' names no architecture. Give the GPUs to build for as compute "
      "capabilities separated by ';' (such as \"8.0;9.0\", the default when it is not set), or "
      "Ampere/Ada/Hopper/Blackwell.")
  endif()
  list(REMOVE_DUPLICATES archs)
  list(REMOVE_DUPLICATES ptx)
  set(${out_var} "${archs}" PARENT_SCOPE)
  set(${out_var}_PTX "${ptx}" PARENT_SCOPE)
endfunction()

# What the declaration (cmake/knobs.json "families") says about where <family> runs:
# whether a GPU of compute capability <arch> is one (at or above its capabilities.min, of
# a generation it runs on, not excluded). The runtime selector (families.py) applies the
# same fields to the GPU it finds; the build follows them for the archs it is given.
#   vfa_family_declared_for(ok fa2 8.6)   ->  TRUE
#   vfa_family_declared_for(ok fa3 10.0)  ->  FALSE (generations: 9 only)
function(vfa_family_declared_for out_var family arch)
  vfa_family_field(lowest ${family} "capabilities;min" "")
  string(REGEX MATCH "^[0-9]+" major "${arch}")
  vfa_family_field(generation ${family} "capabilities;generations;${major}" "")
  vfa_family_field(generations ${family} "capabilities;generations" "{}")
  string(JSON declared LENGTH "${generations}")
  vfa_family_field(excluded ${family} "capabilities;excluded;${major}" "")
  set(ok FALSE)
  if(arch VERSION_GREATER_EQUAL lowest AND excluded STREQUAL "" AND (declared EQUAL 0 OR NOT generation STREQUAL ""))
    set(ok TRUE)
  endif()
  set(${out_var} ${ok} PARENT_SCOPE)
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
  vfa_check_fa3_capabilities()
  # FA2's code is for its declared lowest arch (cmake/knobs.json: families.fa2.capabilities.min):
  # "8.0" -> sm_80 SASS + compute_80 PTX.
  vfa_family_field(fa2_min fa2 "capabilities;min" "")
  string(REPLACE "." "" fa2_code "${fa2_min}")
  string(REGEX MATCH "^[0-9]+" fa2_major "${fa2_min}")
  vfa_check_ptx_requests("${archs_PTX}" "${fa2_min}" "${fa2_code}" "${ptx}")

  set(fa2 "")
  set(has_80_plus FALSE)
  set(has_8x FALSE)
  set(has_9x FALSE)
  set(has_90 FALSE)
  foreach(arch IN LISTS archs)
    if(arch VERSION_GREATER_EQUAL fa2_min)
      set(has_80_plus TRUE)
      if(arch MATCHES "^${fa2_major}\\.")
        set(has_8x TRUE)
      endif()
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
      list(APPEND fa2 sm_${fa2_code})
    endif()
    if(has_9x AND sm90_sass)
      list(APPEND fa2 sm_90)
    endif()
    if(ptx)
      list(APPEND fa2 compute_${fa2_code})
    endif()
    set(fa2_ok TRUE)
    set(fa2_reason "")
  else()
    set(fa2_ok FALSE)
    set(fa2_reason "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' has no architecture >= ${fa2_min}")
  endif()

  # FA2 is only worth building when its code runs on a listed GPU its family is declared for.
  vfa_option(VFA_BUILD_FA2)
  vfa_option(VFA_BUILD_FA3)
  set(fa2_runs_on "")
  foreach(arch IN LISTS archs)
    vfa_code_runs_on(runs "${arch}" ${fa2})
    vfa_family_declared_for(declared fa2 "${arch}")
    if(runs AND declared)
      list(APPEND fa2_runs_on "${arch}")
    endif()
  endforeach()
  if(has_80_plus AND NOT fa2_runs_on)
    set(fa2_ok FALSE)
    vfa_fa2_code_words(fa2_words "${fa2}" "${ptx}" "${has_9x}" "${sm90_sass}")
    set(fa2_reason "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' names no GPU that FA2's code runs on: ${fa2_words}")
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

  # Listed archs >= 8.0 that no module of this build runs on.
  set(bare "")
  foreach(arch IN LISTS archs)
    if(arch VERSION_LESS 8.0)
      continue()
    endif()
    set(served FALSE)
    if(fa2_ok AND NOT VFA_BUILD_FA2 STREQUAL "off" AND arch IN_LIST fa2_runs_on)
      set(served TRUE)
    endif()
    if(fa3_ok AND NOT VFA_BUILD_FA3 STREQUAL "off" AND arch STREQUAL "9.0")
      set(served TRUE)
    endif()
    if(NOT served)
      list(APPEND bare "${arch}")
    endif()
  endforeach()
  if(bare)
    string(REPLACE ";" ", " bare_text "${bare}")
    if(VFA_BUILD_FA2 STREQUAL "off")
      message(WARNING "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' names ${bare_text}, but this "
        "wheel will hold nothing that runs there: VFA_BUILD_FA2=off, and FA3 runs on 9.0 only.")
    else()
      vfa_fa2_code_words(fa2_words "${fa2}" "${ptx}" "${has_9x}" "${sm90_sass}")
      set(fa3_reason_text "")
      if("9.0" IN_LIST bare AND NOT fa3_ok)
        set(fa3_reason_text ", and is not built: ${fa3_reason}")
      elseif("9.0" IN_LIST bare)
        set(fa3_reason_text ", and is not built: VFA_BUILD_FA3=off")
      endif()
      message(FATAL_ERROR "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' names ${bare_text}, but "
        "nothing this build compiles would run there: ${fa2_words}; FA3 runs on 9.0 only"
        "${fa3_reason_text}. Take ${bare_text} out of TORCH_CUDA_ARCH_LIST, or build "
        "without FA2 (VFA_BUILD_FA2=off) to leave ${bare_text} without FlashAttention.")
    endif()
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

# FA3's kernels are upstream's sm_90a code (wgmma, TMA: instructions of 9.0 only, which no
# PTX carries to another GPU), so the build can honour one declaration of where FA3 runs:
# capabilities {"min": "9.0", "generations": {"9": ...}}. Another one (a family
# declared from 8.0 or for 10.x) would ship a module the selector then sends GPUs it cannot
# run on: refused, naming the field and the fix.
function(vfa_check_fa3_capabilities)
  vfa_family_field(lowest fa3 "capabilities;min" "")
  vfa_family_field(generations fa3 "capabilities;generations" "{}")
  string(JSON count LENGTH "${generations}")
  set(majors "")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON major MEMBER "${generations}" ${i})
      list(APPEND majors "${major}")
    endforeach()
  endif()
  if(NOT lowest STREQUAL "9.0" OR NOT majors STREQUAL "9")
    get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
    string(REPLACE ";" ", " majors "${majors}")
    message(FATAL_ERROR
      "${file}: families.fa3.capabilities declares FA3 from ${lowest} on generations [${majors}], but FA3's "
      "kernels are upstream's sm_90a code, which runs on compute capability 9.0 only: the build cannot "
      "compile FA3 for anything else. Set families.fa3.capabilities.min to \"9.0\" and its generations to "
      "{\"9\": \"sm90\"}.")
  endif()
endfunction()

# Stops when the arch list asks for PTX (<arch>+PTX) this build cannot make: the only PTX
# it embeds is FA2's, for FA2's lowest arch <fa2_min> (compute_<fa2_code>, VFA_FA2_PTX);
# FA3 is sm_90a SASS only. torch's convention would put PTX of that arch in every module;
# dropping the +PTX silently would ship a wheel without what was asked for.
#   vfa_check_ptx_requests("9.0" 8.0 80 ON)  ->  FATAL_ERROR "... asks for 9.0+PTX ..."
#   vfa_check_ptx_requests("8.0" 8.0 80 ON)  ->  (FA2's compute_80: honoured)
function(vfa_check_ptx_requests requested fa2_min fa2_code ptx)
  foreach(arch IN LISTS requested)
    if(arch STREQUAL fa2_min AND ptx)
      continue()
    elseif(arch STREQUAL fa2_min)
      message(FATAL_ERROR
        "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' asks for ${arch}+PTX, but VFA_FA2_PTX=OFF leaves FA2's "
        "compute_${fa2_code} PTX out. Set VFA_FA2_PTX=ON, or write ${arch} without +PTX.")
    endif()
    message(FATAL_ERROR
      "TORCH_CUDA_ARCH_LIST='${TORCH_CUDA_ARCH_LIST}' asks for ${arch}+PTX, which this build cannot make: "
      "the only PTX it embeds is FA2's compute_${fa2_code} (VFA_FA2_PTX, on by default; GPUs newer than the "
      "list run it through the driver's JIT), and FA3 is sm_90a SASS only (its kernels use instructions "
      "of 9.0 only, which no PTX carries to another GPU). Write ${arch} without +PTX (${fa2_min}+PTX asks "
      "for FA2's PTX).")
  endforeach()
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

# Whether code compiled for <codes> (sm_80, compute_80, sm_90a) runs on a GPU of
# compute capability <arch>: an sm_XY cubin runs on major X with minor >= Y (an
# sm_XYa one on X.Y only), compute_XY PTX on every GPU >= X.Y (the driver compiles
# it at load time).
#   vfa_code_runs_on(runs 10.0 sm_80 compute_80)  ->  TRUE
#   vfa_code_runs_on(runs 10.0 sm_80)             ->  FALSE
function(vfa_code_runs_on out_var arch)
  set(runs FALSE)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)$" _ "${arch}")
  set(major "${CMAKE_MATCH_1}")
  set(minor "${CMAKE_MATCH_2}")
  foreach(code IN LISTS ARGN)
    if(code MATCHES "^sm_([0-9]+)([0-9])(a?)f?$")
      if(CMAKE_MATCH_3 STREQUAL "a")
        if(major EQUAL CMAKE_MATCH_1 AND minor EQUAL CMAKE_MATCH_2)
          set(runs TRUE)
        endif()
      elseif(major EQUAL CMAKE_MATCH_1 AND NOT minor LESS CMAKE_MATCH_2)
        set(runs TRUE)
      endif()
    elseif(code MATCHES "^compute_([0-9]+)([0-9])$")
      if(arch VERSION_GREATER_EQUAL "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
        set(runs TRUE)
      endif()
    endif()
  endforeach()
  set(${out_var} ${runs} PARENT_SCOPE)
endfunction()

# What FA2's code is and the knob that would make it run on more GPUs, for messages:
#   "FA2 is sm_80 SASS only, which runs on 8.x GPUs; its compute_80 PTX, which newer
#    GPUs run, is left out by VFA_FA2_PTX=OFF (set VFA_FA2_PTX=ON)"
function(vfa_fa2_code_words out_var codes ptx has_9x sm90_sass)
  string(REPLACE ";" " + " code_text "${codes}")
  vfa_family_field(lowest fa2 "capabilities;min" "")
  string(REPLACE "." "" code "${lowest}")
  string(REGEX MATCH "^[0-9]+" major "${lowest}")
  set(gpus "${major}.x GPUs")
  if(NOT lowest MATCHES "\\.0$")
    set(gpus "${major}.x GPUs from ${lowest}")
  endif()
  set(words "FA2 is ${code_text} SASS only, which runs on ${gpus}")
  if("sm_90" IN_LIST codes)
    set(words "FA2 is ${code_text} SASS only, which runs on ${gpus} and 9.0 GPUs")
  endif()
  if(NOT ptx)
    string(APPEND words "; its compute_${code} PTX, which newer GPUs run, is left out by "
      "VFA_FA2_PTX=OFF (set VFA_FA2_PTX=ON")
    if(has_9x AND NOT sm90_sass)
      string(APPEND words ", or VFA_FA2_SM90_SASS=ON for 9.0")
    endif()
    string(APPEND words ")")
  endif()
  set(${out_var} "${words}" PARENT_SCOPE)
endfunction()
