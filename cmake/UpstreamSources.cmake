# Upstream sources: read the pin, then resolve each pinned repository
# (flash-attention, CUTLASS) to a source directory whose content is verified.
#
# Order, per repository:
#   1. an explicit source directory: FLASH_ATTN_SRC_DIR / CUTLASS_SRC_DIR
#      (CMake variable or environment), or CMake's standard
#      FETCHCONTENT_SOURCE_DIR_FLASH_ATTENTION / FETCHCONTENT_SOURCE_DIR_CUTLASS.
#      Another commit than the pin, or files that differ from its commit
#      (dirty), or a folder git cannot verify: builds, with a loud warning,
#      and the build info says matches_pin=false.
#   2. a checkout of the pinned commit in the source cache (VFA_SOURCE_CACHE,
#      default ~/.cache/vendored-flash-attn): no network, no lock, no write,
#      so a read-only cache works. Its content must equal the pinned commit's
#      tree, else it is refused with the folder to remove.
#   3. a fetch of the pinned commit into that cache from the mirror
#      (FLASH_ATTN_MIRROR / CUTLASS_MIRROR), else from the canonical URL, under
#      a per-entry lock, every git call bounded by VFA_FETCH_TIMEOUT and
#      VFA_FETCH_STALL_TIMEOUT.
#
# Content, not only the commit: "matches_pin" means that every file under the
# pin's `paths` (what the build compiles) is recorded in the pinned commit's tree as
# it is on disk: bytes (no filter, no end-of-line conversion), mode, and a symlink as
# a link (cmake/UpstreamVerify.cmake, vfa_compare_with_commit), into a throwaway
# index, with a git that reads no configuration (nothing the checkout's repository
# or the user configures runs or changes the hashes; never the checkout's own index,
# whose stat cache an edit that keeps size and mtime would fool). It runs on every
# configure and, as the target vfa_verified_sources, on every build
# (cmake/UpstreamBuildCheck.cmake), never cached: a cache keyed on file stats would
# let such an edit through (its cost, 0.2-0.4 s on a loaded 2-core machine: docs/trust.md).
# It trusts the checkout's object store (replace refs are ignored).
# The compile sees only verified folders (vfa_verified_include_dirs), and what
# the build generates lives in the build dir, never in the shared cache.
#
# Credentials: a mirror URL's user, password and query are scrubbed from every
# message, the cache's marker and the build info (cmake/vfa_build/url_secrets.py, the
# project's one scrubber); in a -D they are refused (printed on pip's RUN: line).
#
# A failure of one repository does not hide the other: both are resolved,
# then one message says what each needs.
#
# Relative paths (VFA_SOURCE_CACHE, VFA_PIN_FILE, *_SRC_DIR, a *_MIRROR that is
# a local path) are taken from the project directory, in a configure and in
# `cmake -P` alike.
#
# The cache path depends only on the commit, never on where this project is
# checked out: sccache keys CUDA compiles on absolute source paths, so a stable
# location is what gives cache hits across checkouts, worktrees and CI agents.
#
# This file works in script mode too (cmake -P), which the tests use.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)
get_filename_component(VFA_PROJECT_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(VFA_PROJECT_DIR "${VFA_PROJECT_DIR}" CACHE INTERNAL "")

set(VFA_SOURCE_MARKER ".vfa-source.json")
set(VFA_COMPONENTS flash_attention cutlass)
# Per component: environment/variable prefix, FetchContent name, folder name.
set(VFA_flash_attention_PREFIX FLASH_ATTN)
set(VFA_flash_attention_FC_NAME FLASH_ATTENTION)
set(VFA_flash_attention_DIRNAME flash-attention)
set(VFA_cutlass_PREFIX CUTLASS)
set(VFA_cutlass_FC_NAME CUTLASS)
set(VFA_cutlass_DIRNAME cutlass)
# How many differing paths a message lists before "and N more".
set(VFA_SHOWN_PATHS 5)
# Environment that would point git at another repository or index than the
# one named on its command line (a build started from a git hook has GIT_DIR).
set(VFA_GIT_LOCATION_ENV GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
    GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR GIT_NAMESPACE)

# The parts, by concern (each function says its inputs, its output and an example).
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamPin.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamGit.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamVerify.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamLock.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamFetch.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamReport.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamBuildCheck.cmake)

# Sets the member <keys...> of the JSON held in <json_var> to the string <text>, written
# by CMake's JSON writer (jsoncpp), which escapes every control character: only the
# quote and the backslash need escaping for it to read <text> as one string. Markers,
# the build-time check's spec and the script's VFA_SOURCE lines are written this way, so
# a '\' or a '"' in a URL or a path cannot make them unreadable.
#   vfa_json_set_text(marker "C:\\mirrors\\fa" url)  ->  marker = {"url" : "C:\\\\mirrors\\\\fa"}
function(vfa_json_set_text json_var text)
  string(REPLACE "\\" "\\\\" quoted "${text}")
  string(REPLACE "\"" "\\\"" quoted "${quoted}")
  string(JSON json SET "${${json_var}}" ${ARGN} "\"${quoted}\"")
  set(${json_var} "${json}" PARENT_SCOPE)
endfunction()

# Reads the network and lock knobs into the caller's scope.
#   vfa_read_source_knobs()  ->  VFA_FETCH_TIMEOUT=600, VFA_FETCH_STALL_TIMEOUT=60, ...
macro(vfa_read_source_knobs)
  # Types and ranges (whole seconds, 1 to 86400) are checked by vfa_option (cmake/knobs.json).
  vfa_option(VFA_FETCH_TIMEOUT)
  vfa_option(VFA_FETCH_STALL_TIMEOUT)
  vfa_option(VFA_SOURCE_LOCK_TIMEOUT)
  vfa_option(FETCHCONTENT_FULLY_DISCONNECTED)
  set(VFA_FULLY_DISCONNECTED ${FETCHCONTENT_FULLY_DISCONNECTED})
endmacro()

# An absolute path for a path knob. A relative one is taken from the project
# directory, whatever directory cmake runs in: pip and python -m build run it
# in the project directory, plain cmake where the shell is, and `cmake -P`
# would otherwise take the shell's; one rule for all, as versioning.py reads
# VFA_PIN_FILE.
#   vfa_absolute_path(dir "../fa")  ->  <project>/../fa
function(vfa_absolute_path out_var path)
  get_filename_component(path "${path}" ABSOLUTE BASE_DIR "${VFA_PROJECT_DIR}")
  set(${out_var} "${path}" PARENT_SCOPE)
endfunction()

# The default source cache: $XDG_CACHE_HOME/vendored-flash-attn, else
# $HOME/.cache/vendored-flash-attn. A relative XDG_CACHE_HOME is ignored, as the
# XDG spec says (it would put checkouts wherever cmake runs); a relative HOME
# gives no default.
#   vfa_default_source_cache(dir)  ->  /home/me/.cache/vendored-flash-attn
function(vfa_default_source_cache out_var)
  set(root "")
  set(xdg "$ENV{XDG_CACHE_HOME}")
  if(NOT xdg STREQUAL "" AND IS_ABSOLUTE "${xdg}")
    set(root "${xdg}")
  else()
    if(NOT xdg STREQUAL "")
      message(WARNING "XDG_CACHE_HOME='${xdg}' is not an absolute path, so it is ignored (the XDG "
        "base directory spec says so) and the source cache defaults to \$HOME/.cache. Set "
        "XDG_CACHE_HOME to an absolute path, or VFA_SOURCE_CACHE.")
    endif()
    if(IS_ABSOLUTE "$ENV{HOME}")
      set(root "$ENV{HOME}/.cache")
    endif()
  endif()
  if(root STREQUAL "")
    message(FATAL_ERROR
      "Neither XDG_CACHE_HOME nor HOME is an absolute path (HOME='$ENV{HOME}'), so there is no "
      "default source cache. Set VFA_SOURCE_CACHE to a folder that stays put between builds.")
  endif()
  set(${out_var} "${root}/vendored-flash-attn" PARENT_SCOPE)
endfunction()

# "" unless the URL knob <name> was given as a CMake definition (-D, or pip's
# -C cmake.define.) and carries credentials; then why that is refused and what
# to do instead. A definition is printed on scikit-build-core's "RUN:" line
# (pip -v, CI logs) and shown by `ps` while CMake runs; the environment is
# neither. Its value is scrubbed everywhere this project prints or records it.
#   vfa_refuse_credentials_in_a_definition(err FLASH_ATTN_MIRROR)  with
#   -DFLASH_ATTN_MIRROR=https://ci:s3cret@git.example/fa.git  ->  "FLASH_ATTN_MIRROR was given ..."
function(vfa_refuse_credentials_in_a_definition out_var name)
  set(${out_var} "" PARENT_SCOPE)
  vfa_option_origin(origin ${name})
  if(NOT origin STREQUAL "cmake")
    return()
  endif()
  vfa_url_secrets(secrets secrets "${${name}}")
  if(NOT secrets)
    return()
  endif()
  string(REPLACE ";" " and " secrets "${secrets}")
  vfa_shown_url(shown "${${name}}")
  string(CONCAT text "${name} was given as a CMake definition (-D, or pip's -C cmake.define.) "
    "with ${secrets} in its URL. A definition is printed on scikit-build-core's RUN: line "
    "(pip -v, CI logs) and shown to every local user by `ps`, so it is refused: treat that "
    "credential as exposed. Give ${name}=${shown} and let git supply the credentials "
    "(a credential helper: git config --global credential.helper <helper>, or your CI's), or "
    "set ${name} with the credentials in the environment instead (${name}=... pip wheel .): the "
    "environment is not printed, and the URL is scrubbed from every log, the source cache and "
    "the build info. docs/trust.md: Where the upstream comes from.")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# Sets, for <component>, in the caller's scope:
#   VFA_<component>_SOURCE_DIR, _COMMIT, _MATCHES_PIN, _VERIFIED, _DIRTY, _ORIGIN, _URL
# or VFA_<component>_ERROR (what went wrong and how to fix it).
function(vfa_resolve_source component)
  set(prefix ${VFA_${component}_PREFIX})
  set(fc_name ${VFA_${component}_FC_NAME})
  set(pinned "${VFA_PIN_${component}_COMMIT}")
  set(VFA_${component}_ERROR "" PARENT_SCOPE)

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
    vfa_absolute_path(src_dir "${src_dir}")
    set(err "")
    vfa_use_source_dir(${component} "${src_dir}" "${src_var}" err)
    if(err)
      set(VFA_${component}_ERROR "${err}" PARENT_SCOPE)
      return()
    endif()
    foreach(key SOURCE_DIR FROM_DIR COMMIT MATCHES_PIN VERIFIED DIRTY ORIGIN URL)
      set(VFA_${component}_${key} "${VFA_${component}_${key}}" PARENT_SCOPE)
    endforeach()
    return()
  endif()

  string(SUBSTRING "${pinned}" 0 12 short)
  set(dest "${VFA_SOURCE_CACHE}/src/${VFA_${component}_DIRNAME}-${short}")
  vfa_option(${prefix}_MIRROR)
  if(${prefix}_MIRROR STREQUAL "")
    set(url "${VFA_PIN_${component}_URL}")
  else()
    vfa_mirror_url(url "${${prefix}_MIRROR}")
    vfa_refuse_credentials_in_a_definition(err ${prefix}_MIRROR)
    if(err)
      set(VFA_${component}_ERROR "${err}" PARENT_SCOPE)
      return()
    endif()
  endif()
  set_property(GLOBAL APPEND PROPERTY VFA_SOURCE_URLS "${url}")

  # Check first, lock only to fetch: a complete cache on a read-only path works.
  set(err "")
  if(EXISTS "${dest}")
    set(origin "cache")
  elseif(VFA_FULLY_DISCONNECTED)
    string(CONCAT err "FETCHCONTENT_FULLY_DISCONNECTED is set, so ${component} is not fetched, and "
      "the cache has no checkout of ${pinned} at '${dest}'. Set ${prefix}_SRC_DIR to a checkout "
      "of it, or allow the fetch once (cmake -P cmake/fetch_sources.cmake fills the cache).")
  else()
    vfa_fetch_into_cache(${component} "${url}" "${dest}" origin err)
  endif()
  if(NOT err)
    vfa_check_cached(${component} "${dest}" marked_url staged err)
    if(origin STREQUAL "cache")
      set(url "${marked_url}")  # whoever filled the cache
    endif()
  endif()
  if(err)
    set(VFA_${component}_ERROR "${err}" PARENT_SCOPE)
    return()
  endif()
  set(VFA_${component}_SOURCE_DIR "${staged}" PARENT_SCOPE)
  set(VFA_${component}_FROM_DIR "${dest}" PARENT_SCOPE)
  set(VFA_${component}_COMMIT "${pinned}" PARENT_SCOPE)
  set(VFA_${component}_MATCHES_PIN TRUE PARENT_SCOPE)
  set(VFA_${component}_VERIFIED TRUE PARENT_SCOPE)
  set(VFA_${component}_DIRTY FALSE PARENT_SCOPE)
  set(VFA_${component}_ORIGIN "${origin}" PARENT_SCOPE)
  vfa_shown_url(url "${url}")
  set(VFA_${component}_URL "${url}" PARENT_SCOPE)
endfunction()

# Resolves every pinned component; sets VFA_<component>_* in the caller.
# When any fails, one message says, for every component, what it needs.
macro(vfa_resolve_upstream_sources)
  vfa_read_source_knobs()
  # Path knobs come back absolute, relative ones taken from the project root.
  vfa_option(VFA_PIN_FILE)
  vfa_option(VFA_SOURCE_CACHE)
  vfa_option(VFA_STAGED_SOURCES)
  if(VFA_SOURCE_CACHE STREQUAL "" OR VFA_STAGED_SOURCES STREQUAL "")
    vfa_default_source_cache(_vfa_default_cache)
  endif()
  if(VFA_SOURCE_CACHE STREQUAL "")
    set(VFA_SOURCE_CACHE "${_vfa_default_cache}")
  endif()
  # Per user, never the shared cache's: a read-only or shared source cache is read only through it.
  if(VFA_STAGED_SOURCES STREQUAL "")
    set(VFA_STAGED_SOURCES "${_vfa_default_cache}/staged")
  endif()
  vfa_read_pin("${VFA_PIN_FILE}")

  # Git runs for these repositories only, never prompts, and never sees
  # environment that points it elsewhere; restored afterwards.
  foreach(_vfa_name IN LISTS VFA_GIT_LOCATION_ENV ITEMS GIT_TERMINAL_PROMPT GIT_ATTR_NOSYSTEM GIT_NO_LAZY_FETCH)
    set(_vfa_saved_${_vfa_name} "$ENV{${_vfa_name}}")
    set(_vfa_had_${_vfa_name} FALSE)
    if(DEFINED ENV{${_vfa_name}})
      set(_vfa_had_${_vfa_name} TRUE)
    endif()
    unset(ENV{${_vfa_name}})
  endforeach()
  set(ENV{GIT_TERMINAL_PROMPT} 0)
  set(ENV{GIT_ATTR_NOSYSTEM} 1)
  # No git of a fetch fetches on its own (a partial clone's lazy fetch starts git again for
  # each object it lacks): the fetch asks for every object it needs, in bounded steps.
  set(ENV{GIT_NO_LAZY_FETCH} 1)

  set(_vfa_failed FALSE)
  foreach(_vfa_component IN LISTS VFA_COMPONENTS)
    vfa_resolve_source(${_vfa_component})
    if(VFA_${_vfa_component}_ERROR)
      set(_vfa_failed TRUE)
    else()
      set(_vfa_from "")
      if(NOT VFA_${_vfa_component}_FROM_DIR STREQUAL VFA_${_vfa_component}_SOURCE_DIR)
        set(_vfa_from ", staged from ${VFA_${_vfa_component}_FROM_DIR}")
      endif()
      message(STATUS "vendored-flash-attn: ${_vfa_component} ${VFA_${_vfa_component}_COMMIT} "
        "(${VFA_${_vfa_component}_ORIGIN}) at ${VFA_${_vfa_component}_SOURCE_DIR}${_vfa_from}")
    endif()
  endforeach()

  if(_vfa_failed)
    vfa_report_source_failures()
  endif()
  vfa_check_cutlass_matches_submodule()
  foreach(_vfa_name IN LISTS VFA_GIT_LOCATION_ENV ITEMS GIT_TERMINAL_PROMPT GIT_ATTR_NOSYSTEM GIT_NO_LAZY_FETCH)
    if(_vfa_had_${_vfa_name})
      set(ENV{${_vfa_name}} "${_vfa_saved_${_vfa_name}}")
    else()
      unset(ENV{${_vfa_name}})
    endif()
  endforeach()
endmacro()
