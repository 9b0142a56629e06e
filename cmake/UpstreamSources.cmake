# Upstream sources: read the pin, then resolve each pinned repository
# (flash-attention, CUTLASS) to a verified source directory.
#
# Order, per repository:
#   1. an explicit source directory: FLASH_ATTN_SRC_DIR / CUTLASS_SRC_DIR
#      (CMake variable or environment), or CMake's standard
#      FETCHCONTENT_SOURCE_DIR_FLASH_ATTENTION / FETCHCONTENT_SOURCE_DIR_CUTLASS.
#      Another commit than the pin builds, with a loud warning.
#   2. a verified checkout of the pinned commit in the source cache
#      (VFA_SOURCE_CACHE, default ~/.cache/vendored-flash-attn): no network.
#   3. a fetch of the pinned commit into that cache from the mirror
#      (FLASH_ATTN_MIRROR / CUTLASS_MIRROR), else from the canonical URL.
#
# The cache path depends only on the commit, never on where this project is
# checked out: sccache keys CUDA compiles on absolute source paths, so a stable
# location is what gives cache hits across checkouts, worktrees and CI agents.
#
# This file works in script mode too (cmake -P), which the tests use.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)
set(VFA_PROJECT_DIR "${CMAKE_CURRENT_LIST_DIR}/.." CACHE INTERNAL "")

set(VFA_SOURCE_MARKER ".vfa-source.json")
set(VFA_COMPONENTS flash_attention cutlass)
# Per component: environment/variable prefix, FetchContent name, folder name.
set(VFA_flash_attention_PREFIX FLASH_ATTN)
set(VFA_flash_attention_FC_NAME FLASH_ATTENTION)
set(VFA_flash_attention_DIRNAME flash-attention)
set(VFA_cutlass_PREFIX CUTLASS)
set(VFA_cutlass_FC_NAME CUTLASS)
set(VFA_cutlass_DIRNAME cutlass)

# --- the pin ---------------------------------------------------------------

# Reads the pin file into VFA_PIN_<component>_{URL,COMMIT,TAG,VERSION,PATHS,REQUIRED}.
function(vfa_read_pin pin_file)
  if(NOT EXISTS "${pin_file}")
    message(FATAL_ERROR "The pin file '${pin_file}' does not exist (VFA_PIN_FILE).")
  endif()
  file(READ "${pin_file}" json)
  foreach(component IN LISTS VFA_COMPONENTS)
    foreach(key url commit tag version)
      string(JSON value ERROR_VARIABLE err GET "${json}" ${component} ${key})
      if(err AND NOT key STREQUAL "tag" AND NOT key STREQUAL "version")
        message(FATAL_ERROR "The pin file '${pin_file}' has no ${component}.${key}: ${err}")
      endif()
      if(err)
        set(value "")
      endif()
      string(TOUPPER "${key}" upper_key)
      set(VFA_PIN_${component}_${upper_key} "${value}" PARENT_SCOPE)
    endforeach()
    string(JSON commit GET "${json}" ${component} commit)
    if(NOT commit MATCHES "^[0-9a-f]+$" OR NOT commit MATCHES "^.......................................")
      message(FATAL_ERROR
        "The pin file '${pin_file}': ${component}.commit must be a full 40-character "
        "commit hash (a pin names an immutable commit), got '${commit}'.")
    endif()
    foreach(list_key paths required_files)
      set(items "")
      string(JSON count ERROR_VARIABLE err LENGTH "${json}" ${component} ${list_key})
      if(NOT err AND count GREATER 0)
        math(EXPR last "${count} - 1")
        foreach(i RANGE ${last})
          string(JSON item GET "${json}" ${component} ${list_key} ${i})
          list(APPEND items "${item}")
        endforeach()
      endif()
      string(TOUPPER "${list_key}" upper_key)
      set(VFA_PIN_${component}_${upper_key} "${items}" PARENT_SCOPE)
    endforeach()
  endforeach()
endfunction()

# --- helpers -------------------------------------------------------------------

function(vfa_default_source_cache out_var)
  if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    set(root "$ENV{XDG_CACHE_HOME}")
  elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "")
    set(root "$ENV{HOME}/.cache")
  else()
    message(FATAL_ERROR
      "Neither XDG_CACHE_HOME nor HOME is set, so there is no default source cache. "
      "Set VFA_SOURCE_CACHE to a folder that stays put between builds.")
  endif()
  set(${out_var} "${root}/vendored-flash-attn" PARENT_SCOPE)
endfunction()

# Runs git; on failure either stores the error text in <err_var> or stops.
function(vfa_git result_var err_var)
  execute_process(
    COMMAND "${GIT_EXECUTABLE}" ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_STRIP_TRAILING_WHITESPACE
    TIMEOUT 1800)
  if(rc EQUAL 0)
    set(${result_var} "${out}" PARENT_SCOPE)
    set(${err_var} "" PARENT_SCOPE)
  else()
    set(${result_var} "" PARENT_SCOPE)
    if("${err}" STREQUAL "")
      set(err "git exited with '${rc}'")
    endif()
    set(${err_var} "${err}" PARENT_SCOPE)
  endif()
endfunction()

function(vfa_require_git component)
  if(NOT GIT_EXECUTABLE)
    find_package(Git QUIET)
  endif()
  if(NOT GIT_EXECUTABLE)
    set(prefix ${VFA_${component}_PREFIX})
    message(FATAL_ERROR
      "git is needed to fetch ${component} but was not found. Install git, or set "
      "${prefix}_SRC_DIR to a checkout of commit ${VFA_PIN_${component}_COMMIT}.")
  endif()
  set(GIT_EXECUTABLE "${GIT_EXECUTABLE}" PARENT_SCOPE)
endfunction()

# Which files of the pin's required list are missing under <dir>.
function(vfa_missing_files out_var dir component)
  set(missing "")
  foreach(rel IN LISTS VFA_PIN_${component}_REQUIRED_FILES)
    if(NOT EXISTS "${dir}/${rel}")
      list(APPEND missing "${rel}")
    endif()
  endforeach()
  set(${out_var} "${missing}" PARENT_SCOPE)
endfunction()

# The commit of a source directory: its own git checkout (not a parent
# repository's), else the marker a fetch left, else "unknown".
function(vfa_source_commit out_var dir)
  set(commit "unknown")
  if(EXISTS "${dir}/.git")
    if(NOT GIT_EXECUTABLE)
      find_package(Git QUIET)
    endif()
    if(GIT_EXECUTABLE)
      # safe.directory: a checkout copied from another user is still readable.
      vfa_git(head err -c "safe.directory=${dir}" -C "${dir}" rev-parse HEAD)
      if(NOT err)
        set(commit "${head}")
      endif()
    endif()
  endif()
  if(commit STREQUAL "unknown" AND EXISTS "${dir}/${VFA_SOURCE_MARKER}")
    file(READ "${dir}/${VFA_SOURCE_MARKER}" marker)
    string(JSON marked ERROR_VARIABLE err GET "${marker}" commit)
    if(NOT err)
      set(commit "${marked}")
    endif()
  endif()
  set(${out_var} "${commit}" PARENT_SCOPE)
endfunction()

# --- fetching into the cache ---------------------------------------------------

# Fetches <commit> (optionally through <tag>, which must resolve to it) from
# <url> into <dest>. Works in a private temporary folder and renames it into
# place only once verified, so <dest> is never half-written.
function(vfa_fetch_into_cache component url dest)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  set(tag "${VFA_PIN_${component}_TAG}")
  set(paths ${VFA_PIN_${component}_PATHS})
  set(prefix ${VFA_${component}_PREFIX})
  string(RANDOM LENGTH 8 suffix)
  set(tmp "${dest}.partial-${suffix}")
  file(REMOVE_RECURSE "${tmp}")
  get_filename_component(parent "${dest}" DIRECTORY)
  file(MAKE_DIRECTORY "${parent}")

  set(offline_hint
    "If this machine cannot reach ${url}, point ${prefix}_MIRROR at a mirror "
    "that has the commit, or ${prefix}_SRC_DIR at a local checkout of it.")
  string(JOIN "" offline_hint ${offline_hint})

  message(STATUS "vendored-flash-attn: fetching ${component} ${commit} from ${url}")
  vfa_git(ignored err init -q "${tmp}")
  if(err)
    message(FATAL_ERROR "Could not create '${tmp}' for the ${component} checkout: ${err}")
  endif()
  vfa_git(ignored err -C "${tmp}" remote add origin "${url}")
  if(paths)
    # Only the folders the build compiles: CUTLASS is large, and the upstream
    # repository carries big assets the build never reads.
    vfa_git(ignored err -C "${tmp}" sparse-checkout set ${paths})
    if(err)
      file(REMOVE_RECURSE "${tmp}")
      message(FATAL_ERROR "git sparse-checkout failed in '${tmp}': ${err}. git 2.25 or newer is needed.")
    endif()
  endif()
  set(fetch_args -c protocol.version=2 -C "${tmp}" fetch --quiet --no-tags --filter=blob:none)

  if(tag)
    vfa_git(ignored err ${fetch_args} --depth 1 origin "+refs/tags/${tag}:refs/tags/${tag}")
    if(err)
      file(REMOVE_RECURSE "${tmp}")
      message(FATAL_ERROR
        "Could not fetch tag '${tag}' of ${component} from ${url}:\n${err}\n${offline_hint}")
    endif()
    vfa_git(tagged err -C "${tmp}" rev-parse "refs/tags/${tag}^{commit}")
    if(NOT tagged STREQUAL commit)
      file(REMOVE_RECURSE "${tmp}")
      message(FATAL_ERROR
        "Tag '${tag}' of ${component} at ${url} now points at ${tagged}, but the pin "
        "names ${commit}. A moved tag is a supply-chain event, so the build stops here. "
        "Find out why the tag moved; then either drop the tag from the pin and keep the "
        "commit, or review the new commit and bump the pin (vendor/flash-attention/README.md).")
    endif()
  else()
    vfa_git(ignored err ${fetch_args} --depth 1 origin "${commit}")
    if(err)
      # Some servers refuse fetching an unadvertised commit; fall back to the
      # branches and tags and look for it there.
      vfa_git(ignored err2 ${fetch_args} --tags origin "+refs/heads/*:refs/remotes/origin/*")
      vfa_git(ignored err3 -C "${tmp}" cat-file -e "${commit}^{commit}")
      if(err2 OR err3)
        file(REMOVE_RECURSE "${tmp}")
        if(err2)
          set(why "${err}")
        else()
          set(why "the repository does not contain that commit")
        endif()
        message(FATAL_ERROR
          "Could not fetch ${component} commit ${commit} from ${url}:\n${why}\n${offline_hint}")
      endif()
    endif()
  endif()

  vfa_git(ignored err -C "${tmp}" -c advice.detachedHead=false checkout -q --detach "${commit}")
  vfa_git(head err2 -C "${tmp}" rev-parse HEAD)
  if(err OR NOT head STREQUAL commit)
    file(REMOVE_RECURSE "${tmp}")
    message(FATAL_ERROR
      "Could not check out ${component} commit ${commit} from ${url}: ${err}${err2}\n${offline_hint}")
  endif()
  vfa_missing_files(missing "${tmp}" ${component})
  if(missing)
    file(REMOVE_RECURSE "${tmp}")
    string(REPLACE ";" ", " missing "${missing}")
    message(FATAL_ERROR
      "${component} commit ${commit} from ${url} lacks files the build needs (${missing}). "
      "The pin and the build disagree: check vendor/flash-attention/pin.json.")
  endif()
  file(WRITE "${tmp}/${VFA_SOURCE_MARKER}"
    "{\"name\": \"${component}\", \"commit\": \"${commit}\", \"tag\": \"${tag}\", \"url\": \"${url}\"}\n")
  file(RENAME "${tmp}" "${dest}" RESULT rename_result)
  if(NOT rename_result STREQUAL "0")
    file(REMOVE_RECURSE "${tmp}")
    message(FATAL_ERROR "Could not move the ${component} checkout into '${dest}': ${rename_result}")
  endif()
endfunction()

# A cached checkout is usable when its marker names the pinned commit and
# every required file is there.
function(vfa_check_cached component dest ok_var)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  if(NOT EXISTS "${dest}")
    set(${ok_var} FALSE PARENT_SCOPE)
    return()
  endif()
  vfa_source_commit(found "${dest}")
  vfa_missing_files(missing "${dest}" ${component})
  if(NOT EXISTS "${dest}/${VFA_SOURCE_MARKER}" OR NOT found STREQUAL commit OR missing)
    if(missing)
      string(REPLACE ";" ", " missing "${missing}")
      set(detail "files are missing (${missing})")
    elseif(NOT EXISTS "${dest}/${VFA_SOURCE_MARKER}")
      set(detail "it has no ${VFA_SOURCE_MARKER} marker, so it was never completely fetched")
    else()
      set(detail "it holds commit ${found}, not ${commit}")
    endif()
    message(FATAL_ERROR
      "The cached ${component} checkout '${dest}' is not usable: ${detail}. "
      "It was probably left by an interrupted fetch or changed by hand. "
      "Remove that folder and build again; it will be fetched anew.")
  endif()
  set(${ok_var} TRUE PARENT_SCOPE)
endfunction()

# --- resolution ----------------------------------------------------------------

# Sets, for <component>, in the caller's scope:
#   VFA_<component>_SOURCE_DIR, _COMMIT, _MATCHES_PIN, _ORIGIN, _URL
function(vfa_resolve_source component)
  set(prefix ${VFA_${component}_PREFIX})
  set(fc_name ${VFA_${component}_FC_NAME})
  set(pinned "${VFA_PIN_${component}_COMMIT}")

  vfa_option(${prefix}_SRC_DIR)
  set(src_dir "${${prefix}_SRC_DIR}")
  set(src_var "${prefix}_SRC_DIR")
  if(src_dir STREQUAL "" AND DEFINED FETCHCONTENT_SOURCE_DIR_${fc_name}
     AND NOT "${FETCHCONTENT_SOURCE_DIR_${fc_name}}" STREQUAL "")
    set(src_dir "${FETCHCONTENT_SOURCE_DIR_${fc_name}}")
    set(src_var "FETCHCONTENT_SOURCE_DIR_${fc_name}")
  endif()
  # A recursive checkout of flash-attention carries CUTLASS as a submodule.
  if(src_dir STREQUAL "" AND component STREQUAL "cutlass" AND VFA_flash_attention_ORIGIN STREQUAL "source_dir"
     AND EXISTS "${VFA_flash_attention_SOURCE_DIR}/csrc/cutlass/include/cutlass/cutlass.h")
    set(src_dir "${VFA_flash_attention_SOURCE_DIR}/csrc/cutlass")
    set(src_var "FLASH_ATTN_SRC_DIR (its csrc/cutlass submodule)")
  endif()

  if(NOT src_dir STREQUAL "")
    get_filename_component(src_dir "${src_dir}" ABSOLUTE)
    if(NOT IS_DIRECTORY "${src_dir}")
      message(FATAL_ERROR
        "${src_var} points to '${src_dir}', which does not exist. Point it at a checkout "
        "of ${VFA_PIN_${component}_URL} at commit ${pinned}, or unset it to fetch the pin.")
    endif()
    vfa_missing_files(missing "${src_dir}" ${component})
    if(missing)
      string(REPLACE ";" ", " missing "${missing}")
      message(FATAL_ERROR
        "${src_var}='${src_dir}' is not a complete ${component} source tree: missing ${missing}. "
        "It may be a half-fetched checkout, a sparse checkout without those folders, or the "
        "wrong folder. Point it at a full checkout of commit ${pinned}.")
    endif()
    vfa_source_commit(commit "${src_dir}")
    if(commit STREQUAL pinned)
      set(matches TRUE)
    else()
      set(matches FALSE)
      message(WARNING
        "\n"
        "==========================================================================\n"
        " ${src_var}='${src_dir}'\n"
        " is at commit ${commit}, but the pin names ${pinned}.\n"
        " Building it anyway; the build info records matches_pin=false.\n"
        " Wheels for release must be built from the pinned commit.\n"
        "==========================================================================")
    endif()
    set(VFA_${component}_SOURCE_DIR "${src_dir}" PARENT_SCOPE)
    set(VFA_${component}_COMMIT "${commit}" PARENT_SCOPE)
    set(VFA_${component}_MATCHES_PIN ${matches} PARENT_SCOPE)
    set(VFA_${component}_ORIGIN "source_dir" PARENT_SCOPE)
    set(VFA_${component}_URL "" PARENT_SCOPE)
    return()
  endif()

  set(cache "${VFA_SOURCE_CACHE}")
  string(SUBSTRING "${pinned}" 0 12 short)
  set(dest "${cache}/src/${VFA_${component}_DIRNAME}-${short}")

  vfa_option(${prefix}_MIRROR)
  if(${prefix}_MIRROR STREQUAL "")
    set(url "${VFA_PIN_${component}_URL}")
  else()
    set(url "${${prefix}_MIRROR}")
  endif()

  file(MAKE_DIRECTORY "${cache}/src")
  # Builds running side by side share the cache: one fetches, the others wait.
  file(LOCK "${cache}/src/.${VFA_${component}_DIRNAME}-${short}.lock"
    GUARD FUNCTION TIMEOUT 3600 RESULT_VARIABLE lock_result)
  if(NOT lock_result STREQUAL "0")
    message(FATAL_ERROR "Could not lock the source cache '${cache}': ${lock_result}")
  endif()

  vfa_check_cached(${component} "${dest}" cached)
  if(cached)
    set(origin "cache")
    file(READ "${dest}/${VFA_SOURCE_MARKER}" marker)
    string(JSON url GET "${marker}" url)
  else()
    vfa_option(FETCHCONTENT_FULLY_DISCONNECTED)
    if(FETCHCONTENT_FULLY_DISCONNECTED)
      message(FATAL_ERROR
        "FETCHCONTENT_FULLY_DISCONNECTED is set, so ${component} is not fetched, and the "
        "cache has no checkout of ${pinned} at '${dest}'. Set ${prefix}_SRC_DIR, or "
        "allow the fetch once.")
    endif()
    vfa_require_git(${component})
    vfa_fetch_into_cache(${component} "${url}" "${dest}")
    set(origin "fetched")
  endif()
  set(VFA_${component}_SOURCE_DIR "${dest}" PARENT_SCOPE)
  set(VFA_${component}_COMMIT "${pinned}" PARENT_SCOPE)
  set(VFA_${component}_MATCHES_PIN TRUE PARENT_SCOPE)
  set(VFA_${component}_ORIGIN "${origin}" PARENT_SCOPE)
  set(VFA_${component}_URL "${url}" PARENT_SCOPE)
endfunction()

# Resolves every pinned component; sets VFA_<component>_* in the caller.
macro(vfa_resolve_upstream_sources)
  # Path knobs come back absolute, relative ones taken from the project root.
  vfa_option(VFA_PIN_FILE)
  vfa_option(VFA_SOURCE_CACHE)
  if(VFA_SOURCE_CACHE STREQUAL "")
    vfa_default_source_cache(VFA_SOURCE_CACHE)
  endif()
  vfa_read_pin("${VFA_PIN_FILE}")
  foreach(_vfa_component IN LISTS VFA_COMPONENTS)
    vfa_resolve_source(${_vfa_component})
    message(STATUS "vendored-flash-attn: ${_vfa_component} ${VFA_${_vfa_component}_COMMIT} "
      "(${VFA_${_vfa_component}_ORIGIN}) at ${VFA_${_vfa_component}_SOURCE_DIR}")
  endforeach()
  vfa_check_cutlass_matches_submodule()
endmacro()

# flash-attention records the CUTLASS it was developed against as a submodule.
# When both pins disagree, say so: the bump was likely half done.
function(vfa_check_cutlass_matches_submodule)
  if(NOT VFA_flash_attention_ORIGIN STREQUAL "source_dir" AND EXISTS "${VFA_flash_attention_SOURCE_DIR}/.git")
    vfa_git(line err -c "safe.directory=${VFA_flash_attention_SOURCE_DIR}" -C "${VFA_flash_attention_SOURCE_DIR}"
            ls-tree HEAD csrc/cutlass)
    if(NOT err AND line MATCHES "commit ([0-9a-f]+)")
      set(submodule "${CMAKE_MATCH_1}")
      if(NOT submodule STREQUAL VFA_PIN_cutlass_COMMIT)
        message(WARNING
          "flash-attention ${VFA_flash_attention_COMMIT} pins CUTLASS ${submodule} as its "
          "csrc/cutlass submodule, but the pin file names CUTLASS ${VFA_PIN_cutlass_COMMIT}. "
          "Bump both together (vendor/flash-attention/README.md).")
      endif()
    endif()
  endif()
endfunction()
