# The pin (vendor/flash-attention/pin.json): what each upstream repository is
# (URL, commit, tag), which folders the build compiles (`paths`, all that is
# checked out and verified) and which files must exist (`required_files`).
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

# Reads the pin file into VFA_PIN_<component>_{URL,COMMIT,TAG,VERSION,PATHS,REQUIRED_FILES};
# stops on anything malformed, naming the file and the key.
function(vfa_read_pin pin_file)
  set(bump_doc "vendor/flash-attention/README.md describes the format")
  if(NOT EXISTS "${pin_file}")
    message(FATAL_ERROR "The pin file '${pin_file}' does not exist (VFA_PIN_FILE).")
  endif()
  file(READ "${pin_file}" json)
  string(JSON kind ERROR_VARIABLE err TYPE "${json}")
  if(err OR NOT kind STREQUAL "OBJECT")
    message(FATAL_ERROR "The pin file '${pin_file}' is not a JSON object: ${err}. Fix its syntax (${bump_doc}).")
  endif()
  foreach(component IN LISTS VFA_COMPONENTS)
    foreach(key url commit tag version paths required_files)
      string(JSON kind ERROR_VARIABLE err TYPE "${json}" ${component} ${key})
      set(where "The pin file '${pin_file}': ${component}.${key}")
      if(err)
        if(key STREQUAL "tag" OR key STREQUAL "version")
          set(kind "NULL")
        else()
          message(FATAL_ERROR "${where} is missing (${bump_doc}).")
        endif()
      endif()
      string(TOUPPER "${key}" upper_key)
      set(value "")
      if(key STREQUAL "paths" OR key STREQUAL "required_files")
        if(NOT kind STREQUAL "ARRAY")
          message(FATAL_ERROR "${where} must be a list of relative paths, got a ${kind} (${bump_doc}).")
        endif()
        string(JSON count LENGTH "${json}" ${component} ${key})
        if(count EQUAL 0 AND key STREQUAL "paths")
          message(FATAL_ERROR "${where} is empty: it must list the folders the build compiles.")
        endif()
        if(count GREATER 0)
          math(EXPR last "${count} - 1")
          foreach(i RANGE ${last})
            string(JSON item_kind TYPE "${json}" ${component} ${key} ${i})
            string(JSON item GET "${json}" ${component} ${key} ${i})
            # Plain relative paths only: no options, pathspec magic or '..'.
            if(NOT item_kind STREQUAL "STRING" OR NOT item MATCHES "^[A-Za-z0-9_][A-Za-z0-9_./-]*$"
               OR item MATCHES "(^|/)\\.\\.(/|$)")
              message(FATAL_ERROR "${where}[${i}] must be a relative path inside the repository "
                "(letters, digits, '_', '.', '-', '/'), got ${item_kind} '${item}'.")
            endif()
            list(APPEND value "${item}")
          endforeach()
        endif()
      elseif(NOT kind STREQUAL "NULL")
        if(NOT kind STREQUAL "STRING")
          message(FATAL_ERROR "${where} must be a string, got a ${kind} (${bump_doc}).")
        endif()
        string(JSON value GET "${json}" ${component} ${key})
      endif()
      set(VFA_PIN_${component}_${upper_key} "${value}" PARENT_SCOPE)
      set(${key} "${value}")
    endforeach()
    string(LENGTH "${commit}" length)
    if(NOT length EQUAL 40 OR NOT commit MATCHES "^[0-9a-f]+$")
      message(FATAL_ERROR
        "The pin file '${pin_file}': ${component}.commit must be a full 40-character "
        "commit hash in lower case (a pin names an immutable commit), got '${commit}' "
        "(${length} characters).")
    endif()
    if(url STREQUAL "")
      message(FATAL_ERROR "The pin file '${pin_file}': ${component}.url is empty.")
    endif()
  endforeach()
endfunction()

# Which files of the pin's required list are missing under <dir>.
#   vfa_missing_files(missing /src/fa flash_attention)  ->  hopper/flash_api.cpp (or "")
function(vfa_missing_files out_var dir component)
  set(missing "")
  foreach(rel IN LISTS VFA_PIN_${component}_REQUIRED_FILES)
    if(NOT EXISTS "${dir}/${rel}")
      list(APPEND missing "${rel}")
    endif()
  endforeach()
  set(${out_var} "${missing}" PARENT_SCOPE)
endfunction()

# "" when the checkout of the pinned commit in <dir> has every file the pin
# requires of <component>, else what is wrong. The commit itself lacks them, so
# the pin is wrong, not the checkout: the text names the pin file to fix.
#   vfa_pin_commit_lacks_files(problem cutlass /cache/src/cutlass-62750a2b75c8)
#     ->  "cutlass commit 62750a2b... lacks files the build needs (include/cutlass/gemm/gemm.h).
#          The pin and the build disagree: check cutlass.commit and cutlass.required_files
#          in the pin file '<VFA_PIN_FILE>'."
function(vfa_pin_commit_lacks_files out_var component dir)
  vfa_missing_files(missing "${dir}" ${component})
  set(text "")
  if(missing)
    string(REPLACE ";" ", " missing "${missing}")
    string(CONCAT text "${component} commit ${VFA_PIN_${component}_COMMIT} lacks files the build needs "
      "(${missing}). The pin and the build disagree: check ${component}.commit and "
      "${component}.required_files in the pin file '${VFA_PIN_FILE}'.")
  endif()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()
