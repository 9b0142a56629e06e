# Build info: what this build holds, written as build_info.json into the
# Python package, where the runtime selector and
# `python -m vendored_flash_attn info` read it.
#
# Two records. The wheel's holds what decides the wheel's content, and nothing that
# two builds of the same inputs (sources, selection, toolchain, knobs) would read
# differently: those give byte-identical wheels from any checkout path, build dir or
# machine (tests/build/test_wheel.py). The build dir's build_info.json holds all of
# it plus the readings of this machine and this moment, VFA_BUILD_INFO_MACHINE_KEYS:
#   build.jobs, build.jobs_reason, build.jobs_by_memory  chosen from the memory and
#                                                        cores found here
#   compiler_cache (and its dist block)                  what sccache and the
#                                                        sccache-dist cluster answered
#   options.<knob>.value of a default computed here      VFA_BUILD_MEMORY_MB
#   upstream/cutlass origin "fetched" (wheel: "cache")   whether the cache was warm
#   upstream/cutlass url (wheel: the pin's URL)          the mirror, or whoever filled
#                                                        a shared cache (scrubbed:
#                                                        cmake/vfa_build/url_secrets.py); `info`
#                                                        shows it from here (cli.py)

include_guard(GLOBAL)

set(VFA_BUILD_INFO_SCHEMA 1)
set(VFA_DECLARATION_FILE "${CMAKE_CURRENT_LIST_DIR}/knobs.json")
# JSON paths (dot-separated) that only the build dir's record holds.
set(VFA_BUILD_INFO_MACHINE_KEYS compiler_cache build.jobs build.jobs_reason build.jobs_by_memory)

function(vfa_json_array out_var)
  set(items "")
  foreach(item IN LISTS ARGN)
    if(item MATCHES "^[0-9]+$")
      list(APPEND items "${item}")
    else()
      string(REPLACE "\\" "\\\\" item "${item}")
      string(REPLACE "\"" "\\\"" item "${item}")
      list(APPEND items "\"${item}\"")
    endif()
  endforeach()
  string(JOIN ", " joined ${items})
  set(${out_var} "[${joined}]" PARENT_SCOPE)
endfunction()

function(vfa_json_string out_var value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  string(REPLACE "\n" "\\n" value "${value}")
  set(${out_var} "\"${value}\"" PARENT_SCOPE)
endfunction()

function(vfa_json_bool out_var value)
  if(value)
    set(${out_var} true PARENT_SCOPE)
  else()
    set(${out_var} false PARENT_SCOPE)
  endif()
endfunction()

# {"commit": ..., "pinned_commit": ..., "matches_pin": ..., ...} for one upstream.
function(vfa_json_source out_var component)
  set(json "{}")
  foreach(pair "commit;${VFA_${component}_COMMIT}" "pinned_commit;${VFA_PIN_${component}_COMMIT}"
               "url;${VFA_${component}_URL}" "origin;${VFA_${component}_ORIGIN}"
               "version;${VFA_PIN_${component}_VERSION}" "tag;${VFA_PIN_${component}_TAG}")
    list(GET pair 0 key)
    list(LENGTH pair n)
    set(value "")
    if(n GREATER 1)
      list(GET pair 1 value)
    endif()
    vfa_json_string(value "${value}")
    string(JSON json SET "${json}" ${key} "${value}")
  endforeach()
  vfa_json_bool(matches "${VFA_${component}_MATCHES_PIN}")
  string(JSON json SET "${json}" matches_pin ${matches})
  # verified: git compared the compiled paths with the commit; dirty: they
  # differ from it (null when unverified).
  vfa_json_bool(verified "${VFA_${component}_VERIFIED}")
  string(JSON json SET "${json}" verified ${verified})
  if(VFA_${component}_VERIFIED)
    vfa_json_bool(dirty "${VFA_${component}_DIRTY}")
  else()
    set(dirty null)
  endif()
  string(JSON json SET "${json}" dirty ${dirty})
  set(${out_var} "${json}" PARENT_SCOPE)
endfunction()

function(vfa_json_component out_var part module)
  set(json "{}")
  vfa_json_bool(built "${VFA_${part}_BUILT}")
  string(JSON json SET "${json}" built ${built})
  vfa_json_string(value "${module}")
  string(JSON json SET "${json}" module "${value}")
  vfa_json_string(value "${VFA_${part}_REASON}")
  string(JSON json SET "${json}" reason "${value}")
  foreach(key GENCODE HEAD_DIMS DTYPES FEATURES)
    string(TOLOWER "${key}" json_key)
    if(VFA_${part}_BUILT)
      vfa_json_array(value ${VFA_${part}_${key}})
    else()
      set(value "[]")
    endif()
    string(JSON json SET "${json}" ${json_key} "${value}")
  endforeach()
  get_property(defines GLOBAL PROPERTY VFA_${module}_DEFINES)
  get_property(driver GLOBAL PROPERTY VFA_${module}_DRIVER_CALL)
  vfa_json_array(value ${defines})
  string(JSON json SET "${json}" defines "${value}")
  vfa_json_string(value "${driver}")
  string(JSON json SET "${json}" cuda_driver_call "${value}")
  set(count 0)
  if(VFA_${part}_BUILT)
    set(count ${VFA_${part}_SOURCE_COUNT})
  endif()
  string(JSON json SET "${json}" sources ${count})
  set(${out_var} "${json}" PARENT_SCOPE)
endfunction()

function(vfa_write_build_info)
  set(json "{}")
  string(JSON json SET "${json}" schema ${VFA_BUILD_INFO_SCHEMA})
  # The wheel's full version (with its local label) when scikit-build-core builds.
  set(package_version "${PROJECT_VERSION}")
  if(DEFINED SKBUILD_PROJECT_VERSION_FULL AND NOT "${SKBUILD_PROJECT_VERSION_FULL}" STREQUAL "")
    set(package_version "${SKBUILD_PROJECT_VERSION_FULL}")
  endif()
  vfa_json_string(value "${package_version}")
  string(JSON json SET "${json}" package_version "${value}")
  vfa_json_string(value "${VFA_PRESET}")
  string(JSON json SET "${json}" preset "${value}")
  vfa_json_source(value flash_attention)
  string(JSON json SET "${json}" upstream "${value}")
  vfa_json_source(value cutlass)
  string(JSON json SET "${json}" cutlass "${value}")
  # A record per family whose declaration (cmake/knobs.json) puts it here, under its key
  # ("record": "build_info.json:fa2"); the others write their own (FA4: _fa4/build_info.json).
  vfa_declared_families(families)
  foreach(family IN LISTS families)
    vfa_family_field(record ${family} record "")
    if(record MATCHES "^build_info\\.json:(.+)$")
      set(key "${CMAKE_MATCH_1}")
      string(TOUPPER "${family}" part)
      vfa_family_field(module ${family} module "")
      vfa_json_component(value ${part} "${module}")
      string(JSON json SET "${json}" ${key} "${value}")
    endif()
  endforeach()

  vfa_json_array(archs ${VFA_CUDA_ARCHS})
  vfa_json_string(arch_list "${TORCH_CUDA_ARCH_LIST}")
  string(JSON json SET "${json}" cuda_arch_list "${arch_list}")
  string(JSON json SET "${json}" cuda_archs "${archs}")

  vfa_json_string(v "${VFA_TORCH_VERSION}")
  vfa_json_string(c "${VFA_TORCH_CUDA_VERSION}")
  string(JSON json SET "${json}" torch "{\"version\": ${v}, \"cuda\": ${c}}")
  vfa_json_string(v "${CMAKE_CUDA_COMPILER_VERSION}")
  string(JSON json SET "${json}" cuda "{\"version\": ${v}}")
  vfa_json_string(cxx "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  vfa_json_string(cuda "${CMAKE_CUDA_COMPILER_ID} ${CMAKE_CUDA_COMPILER_VERSION}")
  vfa_json_string(libstdcxx "${VFA_CXX_RUNTIME}")
  string(JSON json SET "${json}" compiler
    "{\"cxx\": ${cxx}, \"cuda\": ${cuda}, \"libstdcxx\": ${libstdcxx}}")

  vfa_json_bool(enabled "${VFA_COMPILER_CACHE_ENABLED}")
  get_filename_component(launcher "${VFA_COMPILER_CACHE_LAUNCHER}" NAME)
  vfa_json_string(launcher "${launcher}")
  vfa_json_string(note "${VFA_COMPILER_CACHE_NOTE}")
  # What sccache itself reported (cmake/CompilerCache.cmake): no local paths, no credentials.
  vfa_json_string(backend "${VFA_COMPILER_CACHE_BACKEND}")
  vfa_json_string(location "${VFA_COMPILER_CACHE_LOCATION}")
  vfa_json_string(rw_mode "${VFA_COMPILER_CACHE_RW_MODE}")
  vfa_json_string(dist_state "${VFA_DIST_STATE}")
  vfa_json_string(scheduler "${VFA_DIST_SCHEDULER}")
  vfa_json_bool(distributed "${VFA_DIST_REMOTE_JOBS}")
  # used, build: what the build did with the cluster, set at its end (compiler_cache_probe.py
  # stats); null until then.
  set(dist "{\"distributed\": ${distributed}, \"state\": ${dist_state}, \"scheduler\": ${scheduler}, \"server_cpus\": ${VFA_DIST_CPUS}, \"remote_jobs\": ${VFA_DIST_REMOTE_JOBS}, \"used\": null, \"build\": null}")
  string(JSON json SET "${json}" compiler_cache
    "{\"enabled\": ${enabled}, \"launcher\": ${launcher}, \"note\": ${note}, \"backend\": ${backend}, \"location\": ${location}, \"rw_mode\": ${rw_mode}, \"dist\": ${dist}}")

  vfa_json_string(build_type "${CMAKE_BUILD_TYPE}")
  vfa_json_string(jobs_reason "${VFA_JOBS_REASON}")
  string(JSON json SET "${json}" build
    "{\"build_type\": ${build_type}, \"jobs\": ${VFA_JOBS}, \"jobs_reason\": ${jobs_reason}, \"jobs_by_memory\": ${VFA_JOBS_BY_MEMORY}, \"nvcc_threads\": ${VFA_NVCC_THREADS}}")

  # nvcc --split-compile (cmake/SplitCompile.cmake): it decides the chosen units' objects, so
  # both records hold it.
  vfa_json_string(split_knob "${VFA_SPLIT_COMPILE_KNOB}")
  set(split_threads null)
  if(NOT "${VFA_SPLIT_COMPILE_THREADS}" STREQUAL "")
    set(split_threads ${VFA_SPLIT_COMPILE_THREADS})
  endif()
  set(split_units "")
  foreach(unit IN LISTS VFA_SPLIT_COMPILE_UNITS)
    vfa_json_string(u "${unit}")
    list(APPEND split_units "${u}")
  endforeach()
  string(JOIN ", " split_units ${split_units})
  vfa_json_string(split_reason "${VFA_SPLIT_COMPILE_REASON}")
  string(JSON json SET "${json}" split_compile
    "{\"knob\": ${split_knob}, \"threads\": ${split_threads}, \"units\": [${split_units}], \"reason\": ${split_reason}}")

  vfa_json_string(mode "${VFA_CUDA_DRIVER_CALL}")
  vfa_json_string(reason "${VFA_CUDA_DRIVER_CALL_REASON}")
  string(JSON json SET "${json}" cuda_driver_call "{\"mode\": ${mode}, \"reason\": ${reason}}")

  # Every build knob declared in cmake/knobs.json, its value and where it came from
  # (cmake, env:NAME or default). Knobs declared "record": false (paths of this
  # machine, URLs) keep their origin but not their value out of the wheel.
  set(options "{}")
  vfa_declared_knobs(names build)
  foreach(name IN LISTS names)
    vfa_option(${name})
    vfa_option_origin(origin ${name})
    vfa_knob_declaration(decl ${name})
    vfa_knob_field(record "${decl}" record ON)
    if(record)
      vfa_json_string(v "${${name}}")
    elseif("${${name}}" STREQUAL "")
      set(v "\"\"")
    else()
      set(v "\"(not recorded)\"")
    endif()
    vfa_json_string(o "${origin}")
    string(JSON options SET "${options}" ${name} "{\"value\": ${v}, \"origin\": ${o}}")
  endforeach()
  string(JSON json SET "${json}" options "${options}")

  # VFA_* settings that are no knob (typos): "<env|cmake>:<name>:<suggestion>".
  set(unknown "[]")
  get_property(records GLOBAL PROPERTY VFA_UNKNOWN_SETTINGS)
  foreach(record IN LISTS records)
    string(REGEX MATCH "^([a-z]+):([^:]*):(.*)$" _ "${record}")
    vfa_json_string(name "${CMAKE_MATCH_2}")
    vfa_json_string(source "${CMAKE_MATCH_1}")
    vfa_json_string(suggestion "${CMAKE_MATCH_3}")
    string(JSON n LENGTH "${unknown}")
    string(JSON unknown SET "${unknown}" ${n}
      "{\"name\": ${name}, \"source\": ${source}, \"did_you_mean\": ${suggestion}}")
  endforeach()
  string(JSON json SET "${json}" unknown_settings "${unknown}")

  set(path "${CMAKE_CURRENT_BINARY_DIR}/build_info.json")
  vfa_write_if_different("${path}" "${json}\n")
  vfa_wheel_build_info(wheel_json "${json}")
  set(wheel_path "${CMAKE_CURRENT_BINARY_DIR}/build_info.wheel.json")
  vfa_write_if_different("${wheel_path}" "${wheel_json}\n")
  install(FILES "${wheel_path}" DESTINATION vendored_flash_attn RENAME build_info.json)
  # The declaration the package reads its bool words and head dims from
  # (python/vendored_flash_attn/declaration/knob_values.py), as CMake read them.
  install(FILES "${VFA_DECLARATION_FILE}" DESTINATION vendored_flash_attn)
  message(STATUS "vendored-flash-attn: build info written to ${path} "
    "(the wheel gets ${wheel_path}: the same without this machine's readings)")
endfunction()

# <path> holds <text> afterwards; its time stamp changes only when its content does.
function(vfa_write_if_different path text)
  file(WRITE "${path}.tmp" "${text}")
  file(COPY_FILE "${path}.tmp" "${path}" ONLY_IF_DIFFERENT)
  file(REMOVE "${path}.tmp")
endfunction()

# A source record of vfa_json_source as the wheel holds it: a fetch into the cache reads
# as "cache" and the URL is the pin's (which mirror filled the cache, and whether it was
# warm, are this machine's readings). Any record in the wheel that names a source
# (FA4's too: cmake/FA4Package.cmake) goes through here.
#   vfa_json_source(s flash_attention)       # {"origin": "fetched", "url": "file:///mirror", ...}
#   vfa_wheel_source(s "${s}" flash_attention)  # {"origin": "cache", "url": "<pin URL>", ...}
function(vfa_wheel_source out_var source component)
  string(JSON origin GET "${source}" origin)
  if(origin STREQUAL "fetched")
    string(JSON source SET "${source}" origin "\"cache\"")
  endif()
  if(NOT origin STREQUAL "source_dir")
    vfa_json_string(url "${VFA_PIN_${component}_URL}")
    string(JSON source SET "${source}" url "${url}")
  endif()
  set(${out_var} "${source}" PARENT_SCOPE)
endfunction()

# The wheel's record: <json> (the build dir's) without the readings of this machine
# and this moment (the list at the top of this file).
function(vfa_wheel_build_info out_var json)
  foreach(key IN LISTS VFA_BUILD_INFO_MACHINE_KEYS)
    string(REPLACE "." ";" path "${key}")
    string(JSON json REMOVE "${json}" ${path})
  endforeach()
  foreach(pair "upstream;flash_attention" "cutlass;cutlass")
    list(GET pair 0 key)
    list(GET pair 1 component)
    string(JSON source GET "${json}" ${key})
    vfa_wheel_source(source "${source}" ${component})
    string(JSON json SET "${json}" ${key} "${source}")
  endforeach()
  vfa_declared_knobs(names build)
  foreach(name IN LISTS names)
    get_property(computed GLOBAL PROPERTY VFA_OPTION_COMPUTED_${name})
    if(computed)
      string(JSON json SET "${json}" options ${name} value "\"(not recorded)\"")
    endif()
  endforeach()
  set(${out_var} "${json}" PARENT_SCOPE)
endfunction()
