# One target function for every compiled kernel family (cmake/knobs.json, "made": "extension"),
# as vLLM's cmake/utils.cmake has one extension function: everything that differs between
# families is data of the family's declaration ("build": sources, include dirs, defines, the
# kernel rule, memory class, unit kinds; "module"), so this file names no family.
#
# vfa_add_family_target(<family> GENCODE <codes...> HEAD_DIMS <...> DTYPES <...> FEATURES <...>)
#   Inputs:  <family>  a compiled family of the declaration
#            GENCODE   its code names (cmake/CudaArchs.cmake: VFA_<NAME>_GENCODE)
#            HEAD_DIMS, DTYPES, FEATURES  its selection (cmake/KernelSelection.cmake: the values of
#                      its selection knobs, vfa_read_selection)
#            the verified upstream sources (VFA_<component>_SOURCE_DIR, cmake/UpstreamSources.cmake)
#   Output:  the target <module> (families.<name>.module): a torch-stable-ABI Python extension
#            (vfa_add_torch_extension) of the family's fixed sources, the instantiation files of its
#            selection and, where its rule stubs the kernels left out, one generated file of stubs;
#            with its memory class (VFA_CUDA_UNIT_MEMORY_SIXTEENTHS, cmake/Parallelism.cmake) and
#            kinds of units (vfa_unit_kind, cmake/BuildProgress.cmake);
#            in the caller VFA_<NAME>_SOURCE_COUNT (its instantiation files), VFA_<NAME>_INSTANTIATIONS
#            and VFA_<NAME>_DEFINES.
#
# Example, the family built from upstream's hopper/ in the `minimal` preset (this file names no
# family; the declaration does):
#   vfa_add_family_target(<name> GENCODE sm_90a HEAD_DIMS 128 DTYPES bf16 e4m3 FEATURES paged split local)
#   ->  target <module>: hopper/flash_api.cpp, hopper/flash_api_torch_lib.cpp,
#       hopper/flash_fwd_combine.cu, hopper/flash_prepare_scheduler.cu and 8 instantiations
#       (hopper/instantiations/flash_fwd_hdim128_{bf16,e4m3}_{packgqa,split,paged,paged_split}_sm90.cu),
#       -gencode arch=compute_90a,code=sm_90a, the declared defines + FLASHATTENTION_DISABLE_HDIM64, ...,
#       include dirs <upstream>/hopper, <upstream>/csrc/common, <cutlass>/include; CUDA units budgeted
#       at 16/16 of VFA_JOB_MEMORY_MB; VFA_<NAME>_SOURCE_COUNT=8.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/KernelSelection.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/TorchExtension.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/BuildProgress.cmake)

function(vfa_add_family_target family)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "GENCODE;HEAD_DIMS;DTYPES;FEATURES")
  string(TOUPPER "${family}" part)
  set(root "${VFA_flash_attention_SOURCE_DIR}")
  vfa_family_selection(${family} "${arg_HEAD_DIMS}" "${arg_DTYPES}" "${arg_FEATURES}")
  vfa_check_instantiations(${part} "${root}" ${VFA_${part}_INSTANTIATIONS})
  vfa_family_field(fixed ${family} "build;sources" "")
  # Each source must be a file the source check covers: in the staged copy, an anchored file.
  vfa_verified_sources_of(sources ${family} "build.sources" ${fixed})
  vfa_verified_sources_of(kernels ${family} "build.kernels" ${VFA_${part}_INSTANTIATIONS})
  list(APPEND sources ${kernels})
  if(VFA_${part}_MISSING)
    vfa_write_family_stubs(stubs ${family})
    # Verified at build time like the sources (cmake/UpstreamBuildCheck.cmake).
    set_property(GLOBAL APPEND PROPERTY VFA_GENERATED_SOURCES "${stubs}")
    list(APPEND sources "${stubs}")
    # Its error messages name it (__FILE__, in STD_TORCH_CHECK): by a path that is the same
    # for every user's store, or two builds of one selection differ in their bytes.
    get_filename_component(stubs_dir "${stubs}" DIRECTORY)
    set_source_files_properties("${stubs}" PROPERTIES COMPILE_OPTIONS
      "$<$<CXX_COMPILER_ID:GNU,Clang>:-fmacro-prefix-map=${stubs_dir}=vendored-flash-attn-generated>")
  endif()
  # Include dirs: [component, folders...] in order, each folder verified against the pin
  # (cmake/UpstreamVerify.cmake: never a folder nobody checked, such as csrc/ itself).
  vfa_family_field(build ${family} build "{}")
  vfa_json_elements(groups "${build}" include_dirs)
  set(includes "")
  foreach(group IN LISTS groups)
    vfa_knob_field(items "{\"g\": ${group}}" g "")
    list(POP_FRONT items component)
    vfa_verified_include_dirs(dirs ${component} "families.${family}.build.include_dirs" ${items})
    list(APPEND includes ${dirs})
  endforeach()
  vfa_family_field(module ${family} module "")
  vfa_add_torch_extension(${module}
    SOURCES ${sources}
    GENCODE ${arg_GENCODE}
    DEFINES ${VFA_${part}_DEFINES}
    INCLUDE_DIRS ${includes})
  # Its memory class: cmake/Parallelism.cmake budgets its CUDA units at this many sixteenths of
  # VFA_JOB_MEMORY_MB (the declaration's build.why says what was measured).
  vfa_family_field(sixteenths ${family} "build;memory_sixteenths" 16)
  set_property(TARGET ${module} PROPERTY VFA_CUDA_UNIT_MEMORY_SIXTEENTHS ${sixteenths})
  # Its kinds of units for the progress estimate, in order (the first that matches wins).
  vfa_json_elements(kinds "${build}" unit_kinds)
  foreach(kind IN LISTS kinds)
    foreach(i 0 1 2 3)
      string(JSON field_${i} GET "${kind}" ${i})
    endforeach()
    vfa_unit_kind(${module} "${field_0}" "${field_1}" "${field_2}" "${field_3}")
  endforeach()
  list(LENGTH VFA_${part}_INSTANTIATIONS n)
  set(VFA_${part}_SOURCE_COUNT ${n} PARENT_SCOPE)
  set(VFA_${part}_INSTANTIATIONS "${VFA_${part}_INSTANTIATIONS}" PARENT_SCOPE)
  set(VFA_${part}_DEFINES "${VFA_${part}_DEFINES}" PARENT_SCOPE)
endfunction()
