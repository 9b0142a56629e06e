# Kernel selection: which upstream instantiation files each module compiles,
# and the FLASHATTENTION_* defines that must agree with them.
#
# FA3 has upstream switches per head dim, dtype and feature; a selection
# changes BOTH the list of hopper/instantiations/*.cu and the matching
# FLASHATTENTION_DISABLE_* defines, computed here from one table so they can
# never disagree (a missing instantiation would only show up as an undefined
# symbol at import).
#
# FA2 has no such switches: its dispatcher references every (dtype, head dim,
# causal) kernel. For the ones left out we generate definitions that raise a
# clear error (the Python interface refuses such calls before dispatch).

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

# The presets' names are declared with VFA_PRESET in cmake/knobs.json, and the head
# dims each module can build as the choices of VFA_FA3_HEAD_DIMS / VFA_FA2_HEAD_DIMS
# there (the package's kernels.py reads the same declaration).
vfa_declared_families(_vfa_families extension)
foreach(_vfa_family IN LISTS _vfa_families)
  string(TOUPPER "${_vfa_family}" _vfa_part)
  vfa_family_field(_vfa_knob ${_vfa_family} head_dims_knob "")
  vfa_knob_declaration(_vfa_decl ${_vfa_knob})
  vfa_knob_field(VFA_${_vfa_part}_ALL_HEAD_DIMS "${_vfa_decl}" choices "")
endforeach()
unset(_vfa_families)
unset(_vfa_family)
unset(_vfa_part)
unset(_vfa_knob)
unset(_vfa_decl)
set(VFA_FA3_ALL_DTYPES bf16 fp16 e4m3)
set(VFA_FA3_ALL_FEATURES paged split softcap local hdimdiff)
set(VFA_FA2_ALL_DTYPES bf16 fp16)
set(VFA_FA2_ALL_FEATURES sparse)

# full: the set vLLM ships. minimal: hdim 128, bf16 + e4m3, paged + split
# (sliding window kept: it adds no files), and the matching FA2 part.
set(VFA_PRESET_full_FA3_HEAD_DIMS ${VFA_FA3_ALL_HEAD_DIMS})
set(VFA_PRESET_full_FA3_DTYPES ${VFA_FA3_ALL_DTYPES})
set(VFA_PRESET_full_FA3_FEATURES ${VFA_FA3_ALL_FEATURES})
set(VFA_PRESET_full_FA2_HEAD_DIMS ${VFA_FA2_ALL_HEAD_DIMS})
set(VFA_PRESET_full_FA2_DTYPES ${VFA_FA2_ALL_DTYPES})
set(VFA_PRESET_full_FA2_FEATURES ${VFA_FA2_ALL_FEATURES})
set(VFA_PRESET_minimal_FA3_HEAD_DIMS 128)
set(VFA_PRESET_minimal_FA3_DTYPES bf16 e4m3)
set(VFA_PRESET_minimal_FA3_FEATURES paged split local)
set(VFA_PRESET_minimal_FA2_HEAD_DIMS 128)
set(VFA_PRESET_minimal_FA2_DTYPES bf16)
set(VFA_PRESET_minimal_FA2_FEATURES "")

# Defines upstream sets for every FA3 build (its CMakeLists.txt).
set(VFA_FA3_BASE_DEFINES
  FLASHATTENTION_DISABLE_BACKWARD
  FLASHATTENTION_DISABLE_DROPOUT
  FLASHATTENTION_DISABLE_UNEVEN_K
  FLASHATTENTION_DISABLE_PYBIND
  FLASHATTENTION_VARLEN_ONLY
  FLASHATTENTION_PACKGQA_ONLY
  FLASHATTENTION_DISABLE_CLUSTER
  FLASHATTENTION_DISABLE_SM8x
  FLASHATTENTION_DISABLE_APPENDKV
  CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  CUTLASS_ENABLE_GDC_FOR_SM90)
set(VFA_FA2_BASE_DEFINES
  FLASHATTENTION_DISABLE_BACKWARD
  FLASHATTENTION_DISABLE_DROPOUT
  FLASHATTENTION_DISABLE_PYBIND)

# Sets VFA_PRESET and each compiled family's selection knobs (cmake/knobs.json declares
# them: VFA_{FA2,FA3}_{HEAD_DIMS,DTYPES,FEATURES}): each list knob as given (checked and
# in canonical order by vfa_option; "none" means empty), else the preset's
# (VFA_PRESET_<preset>_<FAMILY>_<WHAT> above).
function(vfa_read_selection)
  vfa_option(VFA_PRESET)
  vfa_declared_families(families extension)
  foreach(family IN LISTS families)
    string(TOUPPER "${family}" part)
    foreach(field head_dims_knob dtypes_knob features_knob)
      vfa_family_field(knob ${family} ${field} "")
      if(knob STREQUAL "")
        continue()
      endif()
      string(REGEX REPLACE "_knob$" "" what "${field}")
      string(TOUPPER "${what}" what)
      vfa_option(${knob})
      set(values "${${knob}}")
      if(values STREQUAL "")
        set(values "${VFA_PRESET_${VFA_PRESET}_${part}_${what}}")
      elseif(values STREQUAL "none")
        set(values "")
      endif()
      set(${knob} "${values}" PARENT_SCOPE)
    endforeach()
  endforeach()
  set(VFA_PRESET "${VFA_PRESET}" PARENT_SCOPE)
endfunction()

# --- FA3 -------------------------------------------------------------------------

# The variant suffixes upstream instantiates for one (head dim, dtype).
# Equal head dims only come as PackGQA variants (FLASHATTENTION_PACKGQA_ONLY);
# the hdimdiff kernels also come without PackGQA.
function(vfa_fa3_variants out_var features hdimdiff)
  set(variants packgqa)
  if(hdimdiff)
    list(APPEND variants "")
  endif()
  if("split" IN_LIST features)
    list(APPEND variants split)
  endif()
  if("paged" IN_LIST features)
    list(APPEND variants paged)
    if("split" IN_LIST features)
      list(APPEND variants paged_split)
    endif()
  endif()
  if("softcap" IN_LIST features)
    set(with_softcap "")
    foreach(v IN LISTS variants)
      if(v STREQUAL "packgqa")
        list(APPEND with_softcap softcap_packgqa)
      elseif(v STREQUAL "")
        list(APPEND with_softcap softcap)
      else()
        list(APPEND with_softcap ${v}_softcap)
      endif()
    endforeach()
    list(APPEND variants ${with_softcap})
  endif()
  set(${out_var} "${variants}" PARENT_SCOPE)
endfunction()

# Sets VFA_FA3_INSTANTIATIONS (relative to the upstream root) and VFA_FA3_DEFINES.
function(vfa_fa3_selection head_dims dtypes features)
  if(NOT "bf16" IN_LIST dtypes)
    message(FATAL_ERROR
      "VFA_FA3_DTYPES must include bf16: upstream FA3 has no switch to leave bf16 out "
      "(its dispatcher always references the bf16 kernels).")
  endif()
  if(NOT head_dims)
    message(FATAL_ERROR "VFA_FA3_HEAD_DIMS is empty; pick at least one of: ${VFA_FA3_ALL_HEAD_DIMS}.")
  endif()
  set(files "")
  foreach(dtype IN LISTS dtypes)
    # (name in the file, is it an hdimdiff kernel)
    set(kernels "")
    foreach(hdim IN LISTS head_dims)
      list(APPEND kernels "${hdim}:0")
    endforeach()
    if("hdimdiff" IN_LIST features)
      if("64" IN_LIST head_dims AND NOT dtype STREQUAL "e4m3")
        list(APPEND kernels "64_256:1" "64_512:1")
      endif()
      if("192" IN_LIST head_dims)
        list(APPEND kernels "192_128:1")
      endif()
    endif()
    foreach(kernel IN LISTS kernels)
      string(REPLACE ":" ";" kernel "${kernel}")
      list(GET kernel 0 name)
      list(GET kernel 1 is_diff)
      vfa_fa3_variants(variants "${features}" ${is_diff})
      foreach(variant IN LISTS variants)
        if(variant STREQUAL "")
          list(APPEND files "hopper/instantiations/flash_fwd_hdim${name}_${dtype}_sm90.cu")
        else()
          list(APPEND files "hopper/instantiations/flash_fwd_hdim${name}_${dtype}_${variant}_sm90.cu")
        endif()
      endforeach()
    endforeach()
  endforeach()

  set(defines ${VFA_FA3_BASE_DEFINES})
  foreach(hdim IN LISTS VFA_FA3_ALL_HEAD_DIMS)
    if(NOT hdim IN_LIST head_dims)
      list(APPEND defines FLASHATTENTION_DISABLE_HDIM${hdim})
    endif()
  endforeach()
  if(NOT "fp16" IN_LIST dtypes)
    list(APPEND defines FLASHATTENTION_DISABLE_FP16)
  endif()
  if(NOT "e4m3" IN_LIST dtypes)
    list(APPEND defines FLASHATTENTION_DISABLE_FP8)
  endif()
  set(feature_defines_paged FLASHATTENTION_DISABLE_PAGEDKV)
  set(feature_defines_split FLASHATTENTION_DISABLE_SPLIT)
  set(feature_defines_softcap FLASHATTENTION_DISABLE_SOFTCAP)
  set(feature_defines_local FLASHATTENTION_DISABLE_LOCAL)
  set(feature_defines_hdimdiff FLASHATTENTION_DISABLE_HDIMDIFF64 FLASHATTENTION_DISABLE_HDIMDIFF192)
  foreach(feature IN LISTS VFA_FA3_ALL_FEATURES)
    if(NOT feature IN_LIST features)
      list(APPEND defines ${feature_defines_${feature}})
    endif()
  endforeach()
  # On by default, as upstream: without it FA3 accumulates P.V for FP8 inside the
  # tensor cores' reduced-precision accumulator across every KV block, and the error
  # grows with the context (measured on the H200 with value vectors of mean 0.5: 1.2 %
  # at 8k, 20 % at 128k; 0.2-0.3 % with it on; docs/PERFORMANCE.md). OFF is 13–26 %
  # faster FP8 (docs/PERFORMANCE.md, the speed table of that section), a trade a user
  # makes knowingly.
  vfa_option(VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION)
  if(NOT VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION)
    list(APPEND defines FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION)
  endif()
  set(VFA_FA3_INSTANTIATIONS "${files}" PARENT_SCOPE)
  set(VFA_FA3_DEFINES "${defines}" PARENT_SCOPE)
endfunction()

# --- FA2 -------------------------------------------------------------------------

# Sets VFA_FA2_INSTANTIATIONS and VFA_FA2_MISSING (the kernels to stub, as
# "kind:type:hdim:causal" records) and VFA_FA2_DEFINES.
function(vfa_fa2_selection head_dims dtypes features)
  set(files "")
  set(missing "")
  foreach(dtype IN LISTS VFA_FA2_ALL_DTYPES)
    foreach(hdim IN LISTS VFA_FA2_ALL_HEAD_DIMS)
      foreach(causal IN ITEMS 0 1)
        if(causal)
          set(suffix "_causal")
        else()
          set(suffix "")
        endif()
        if(dtype IN_LIST dtypes AND hdim IN_LIST head_dims)
          foreach(kind IN ITEMS fwd fwd_split fwd_split_align)
            list(APPEND files "csrc/flash_attn/src/flash_${kind}_hdim${hdim}_${dtype}${suffix}_sm80.cu")
          endforeach()
        else()
          list(APPEND missing "fwd:${dtype}:${hdim}:${causal}" "split:${dtype}:${hdim}:${causal}")
        endif()
        # Upstream has sparse kernels for head dim 128 only.
        if(hdim EQUAL 128)
          if("sparse" IN_LIST features AND dtype IN_LIST dtypes AND hdim IN_LIST head_dims)
            list(APPEND files "csrc/flash_attn/src/flash_fwd_sparse_hdim${hdim}_${dtype}${suffix}_sm80.cu")
          else()
            list(APPEND missing "sparse:${dtype}:${hdim}:${causal}")
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(VFA_FA2_INSTANTIATIONS "${files}" PARENT_SCOPE)
  set(VFA_FA2_MISSING "${missing}" PARENT_SCOPE)
  set(VFA_FA2_DEFINES ${VFA_FA2_BASE_DEFINES} PARENT_SCOPE)
endfunction()

# Writes <text> to <path> unless it holds exactly that already (so an unchanged
# file keeps its time and is not compiled again): every configure compares, so
# a file edited or cut short since the last one is written anew, never reused
# on the strength of its name. Through a temporary file read back before it is
# renamed into place: a write cut short (a full disk) stops here instead of
# leaving half a file.
#   vfa_write_generated_file(/build/generated/x.cpp "int x;\n")  ->  /build/generated/x.cpp
function(vfa_write_generated_file path text)
  if(EXISTS "${path}")
    file(READ "${path}" current)
    if(current STREQUAL text)
      return()
    endif()
  endif()
  get_filename_component(dir "${path}" DIRECTORY)
  file(MAKE_DIRECTORY "${dir}")
  string(RANDOM LENGTH 8 suffix)
  set(tmp "${path}.tmp-${suffix}")
  file(WRITE "${tmp}" "${text}")
  file(READ "${tmp}" written)
  if(NOT written STREQUAL text)
    file(REMOVE "${tmp}")
    message(FATAL_ERROR "Could not write '${path}' completely (is the disk under '${dir}' full?). "
      "Free some space in the build dir's filesystem and configure again.")
  endif()
  file(RENAME "${tmp}" "${path}")
endfunction()

# Writes the C++ definitions of the FA2 kernels left out to a content-addressed
# file under <dir>, the build dir's generated/ folder, and returns its path in
# <out_var>. In the build dir, not the shared source cache: a read-only cache
# works, and no file there is compiled that only its name vouches for. The cost:
# this one C++ unit misses the compiler cache in a new build dir (sccache keys
# on its absolute path; SCCACHE_BASEDIRS=<build dir> makes it hit, README).
#   vfa_write_fa2_stubs(stubs /build/generated)  ->  /build/generated/fa2_missing_kernels_6403d678242dd8c5.cpp
function(vfa_write_fa2_stubs out_var dir)
  set(body "")
  foreach(record IN LISTS VFA_FA2_MISSING)
    string(REPLACE ":" ";" record "${record}")
    list(GET record 0 kind)
    list(GET record 1 dtype)
    list(GET record 2 hdim)
    list(GET record 3 causal)
    if(dtype STREQUAL "bf16")
      set(type "cutlass::bfloat16_t")
    else()
      set(type "cutlass::half_t")
    endif()
    if(causal)
      set(causal_text "true")
    else()
      set(causal_text "false")
    endif()
    set(what "FA2 ${dtype} head dim ${hdim}")
    if(kind STREQUAL "fwd")
      set(sig "template<> void run_mha_fwd_<${type}, ${hdim}, ${causal_text}>(Flash_fwd_params &, cudaStream_t)")
    elseif(kind STREQUAL "split")
      set(sig "template<> void run_mha_fwd_splitkv_dispatch<${type}, ${hdim}, ${causal_text}>(Flash_fwd_params &, cudaStream_t)")
    else()
      set(sig "template<> void run_mha_fwd_sparse_<${type}, ${hdim}, ${causal_text}>(Flash_fwd_params_sparse &, cudaStream_t)")
      set(what "FA2 sparse ${dtype} head dim ${hdim}")
    endif()
    string(APPEND body "${sig} { VFA_NOT_BUILT(\"${what}\"); }\n")
  endforeach()
  set(text
"// Generated by vendored-flash-attn (cmake/KernelSelection.cmake): definitions
// for the FA2 kernels this build left out, so the module still loads. Calling
// one raises a clear error instead of failing at import with an undefined symbol.
#include <cutlass/numeric_types.h>
#include <torch/headeronly/util/Exception.h>
#include \"namespace_config.h\"
#include \"flash.h\"
#include \"flash_sparse.h\"

#define VFA_NOT_BUILT(what) STD_TORCH_CHECK(false, \"vendored-flash-attn: \" what \" kernels are not in this build; \" \\
  \"rebuild with VFA_PRESET=full or add them to VFA_FA2_HEAD_DIMS / VFA_FA2_DTYPES / VFA_FA2_FEATURES\")

namespace FLASH_NAMESPACE {
${body}}  // namespace FLASH_NAMESPACE
")
  string(MD5 digest "${text}")
  string(SUBSTRING "${digest}" 0 16 digest)
  set(path "${dir}/fa2_missing_kernels_${digest}.cpp")
  vfa_write_generated_file("${path}" "${text}")
  set(${out_var} "${path}" PARENT_SCOPE)
endfunction()

# Checks that every selected file exists in the upstream tree.
function(vfa_check_instantiations component root)
  set(missing "")
  foreach(rel IN LISTS ARGN)
    if(NOT EXISTS "${root}/${rel}")
      list(APPEND missing "${rel}")
    endif()
  endforeach()
  if(missing)
    list(LENGTH missing n)
    list(GET missing 0 first)
    message(FATAL_ERROR
      "${component}: ${n} selected instantiation file(s) do not exist in '${root}', e.g. "
      "${first}. The upstream commit does not match this build's kernel table "
      "(cmake/KernelSelection.cmake); check the pin or the source directory.")
  endif()
endfunction()
