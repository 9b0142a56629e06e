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
# pin's `paths` (what the build compiles) hashes to the pinned commit's tree.
# The check hashes the work tree into a throwaway index (never the checkout's
# own index, whose stat cache an edit that keeps size and mtime would fool)
# and compares it with the commit's trees. It costs 0.2-0.35 s for both
# repositories on a loaded 2-core machine (README), so it runs on every
# configure, never cached: a cache keyed on file stats would let such an edit
# through.
# It trusts the checkout's object store (replace refs are ignored).
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

# --- knobs -----------------------------------------------------------------

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

# A mirror as git is to be given it. A URL (scheme://...) or an scp-like address
# (host:path, no '/' before the ':') stays as it is; anything else is a local
# path, taken from the project directory like the path knobs (git would take it
# from the folder it runs in: the shell's for the first contact, the temporary
# checkout's for the fetch).
#   vfa_mirror_url(url "../mirrors/fa.git")           ->  <project>/../mirrors/fa.git
#   vfa_mirror_url(url "git@git.example:fa.git")      ->  git@git.example:fa.git (as given)
#   vfa_mirror_url(url "https://git.example/fa.git")  ->  https://git.example/fa.git (as given)
function(vfa_mirror_url out_var mirror)
  if(NOT mirror MATCHES "^[A-Za-z][A-Za-z0-9+.-]*://" AND NOT mirror MATCHES "^[^/]+:")
    vfa_absolute_path(mirror "${mirror}")
  endif()
  set(${out_var} "${mirror}" PARENT_SCOPE)
endfunction()

# The Python that runs the project's helper scripts at configure: the build's
# (Python_EXECUTABLE: scikit-build-core and the tests pass it), else python3 or
# python on PATH; "" when there is none.
#   vfa_script_python(python)  ->  /venv/bin/python
function(vfa_script_python out_var)
  if(Python_EXECUTABLE)
    set(${out_var} "${Python_EXECUTABLE}" PARENT_SCOPE)
    return()
  endif()
  find_program(_vfa_script_python NAMES python3 python NO_CACHE)
  set(${out_var} "${_vfa_script_python}" PARENT_SCOPE)
endfunction()

# Asks cmake/url_secrets.py, the project's one URL scrubber (the compiler-cache
# probe imports it too), about <text>, passed through the environment, never on
# a command line. <mode>: url (one URL, scrubbed), text (every URL in it
# scrubbed) or secrets (what one URL carries that is secret, as a list).
# In text mode the secret pieces of every URL this configure used (the global
# property VFA_SOURCE_URLS) are removed too, wherever they appear.
# Without a Python nothing is shown of it.
#   vfa_url_secrets(out url "https://ci:p@ss@git.example/fa.git?token=x")  ->  https://git.example/fa.git
#   vfa_url_secrets(out secrets "https://ci:s3cret@git.example/fa.git")     ->  a password
function(vfa_url_secrets out_var mode text)
  get_property(known GLOBAL PROPERTY VFA_SOURCE_URLS)
  string(REPLACE ";" "\n" known "${known}")
  string(SHA256 key "${mode}:${text}:${known}")
  get_property(answered GLOBAL PROPERTY VFA_URL_SECRETS_${key} SET)
  if(answered)
    get_property(answer GLOBAL PROPERTY VFA_URL_SECRETS_${key})
    set(${out_var} "${answer}" PARENT_SCOPE)
    return()
  endif()
  vfa_script_python(python)
  set(rc 1)
  if(python)
    set(ENV{VFA_URL_TEXT} "${text}")
    set(ENV{VFA_URL_KNOWN} "${known}")
    execute_process(COMMAND "${python}" -E -s -S "${VFA_PROJECT_DIR}/cmake/url_secrets.py" ${mode}
      OUTPUT_VARIABLE answer RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 60)
    unset(ENV{VFA_URL_TEXT})
    unset(ENV{VFA_URL_KNOWN})
  endif()
  if(NOT rc EQUAL 0)
    set(answer "(not shown: no Python to remove credentials from it: ${python} ${err})")
    if(mode STREQUAL "secrets")
      set(answer "")
    endif()
  elseif(mode STREQUAL "secrets")
    string(REPLACE "\n" ";" answer "${answer}")
  endif()
  set_property(GLOBAL PROPERTY VFA_URL_SECRETS_${key} "${answer}")
  set(${out_var} "${answer}" PARENT_SCOPE)
endfunction()

# A URL as it may be shown and recorded: without the user, password, query and
# fragment a mirror URL may carry, which would otherwise end up in logs, the
# cache's marker and the wheel's build info.
#   vfa_shown_url(out "https://ci:s3cret@git.example/fa.git")  ->  https://git.example/fa.git
function(vfa_shown_url out_var url)
  vfa_url_secrets(url url "${url}")
  set(${out_var} "${url}" PARENT_SCOPE)
endfunction()

# --- the pin -----------------------------------------------------------------

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

# --- helpers -------------------------------------------------------------------

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

# What git writes is the commit's bytes, whatever the user's git config says:
# the user's config stays (credential helpers, proxies, insteadOf rewrites for
# the fetch), but no end-of-line conversion (core.autocrlf=true wrote CRLF files
# that every other user of the cache then saw as edited), no attributes file of
# the user's (nor the system's: GIT_ATTR_NOSYSTEM, set while resolving), no hook,
# no fsmonitor command. A filter or eol rule in the fetched repository's own
# .gitattributes still applies; the check after the fetch refuses what it rewrote.
set(VFA_GIT_CONTENT_SETTINGS
  -c core.autocrlf=false -c core.eol=lf -c core.safecrlf=false -c core.attributesFile=/dev/null
  -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.symlinks=true -c core.ignoreCase=false
  -c core.precomposeUnicode=false -c submodule.recurse=false)

# Runs git with VFA_GIT_CONTENT_SETTINGS, stopped after VFA_FETCH_TIMEOUT
# seconds, an http(s) transfer also when it stays below 1 KB/s for
# VFA_FETCH_STALL_TIMEOUT seconds (no effect on local commands); on failure
# stores the error text in <err_var>.
#   vfa_git(head err -C /src rev-parse HEAD)  ->  head=617264c1..., err=""
function(vfa_git result_var err_var)
  execute_process(
    COMMAND "${GIT_EXECUTABLE}" -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=${VFA_FETCH_STALL_TIMEOUT}
            ${VFA_GIT_CONTENT_SETTINGS} ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_STRIP_TRAILING_WHITESPACE
    TIMEOUT ${VFA_FETCH_TIMEOUT})
  if(rc EQUAL 0)
    set(${result_var} "${out}" PARENT_SCOPE)
    set(${err_var} "" PARENT_SCOPE)
    return()
  endif()
  set(${result_var} "" PARENT_SCOPE)
  vfa_stop_if_interrupted("${rc}" "running git ${ARGN}")
  if(NOT rc MATCHES "^[0-9]+$")
    # "Process terminated due to timeout": a server that accepts and never answers.
    string(CONCAT err "git did not finish within VFA_FETCH_TIMEOUT=${VFA_FETCH_TIMEOUT} s (${rc}); "
      "a server that accepts connections but does not answer looks like this. "
      "Raise VFA_FETCH_TIMEOUT for a slow but working link. ${err}")
  elseif(err MATCHES "Operation too slow|curl 28")
    string(CONCAT err "${err}\n(the transfer stayed below 1 KB/s for "
      "VFA_FETCH_STALL_TIMEOUT=${VFA_FETCH_STALL_TIMEOUT} s; raise it for a slow but working link)")
  elseif("${err}" STREQUAL "")
    set(err "git exited with '${rc}'")
  endif()
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# Stops the configure when a child process ended by an interrupt (Ctrl-C, a
# SIGINT to the process group): CMake itself survives it and would otherwise
# read it as a failure of that step (a timeout, an unreachable server) and go on
# to the next repository. <rc> is execute_process's result, <doing> what was
# under way. A fetch's temporary folder is left; the next fetch removes it.
#   vfa_stop_if_interrupted("User interrupt" "fetching cutlass")  ->  FATAL_ERROR "Interrupted ..."
function(vfa_stop_if_interrupted rc doing)
  if(rc STREQUAL "Process terminated due to timeout" OR rc MATCHES "^[0-9]+$")
    return()
  endif()
  vfa_url_secrets(doing text "${doing}")
  message(FATAL_ERROR "vendored-flash-attn: interrupted (${rc}) while ${doing}; stopped here. "
    "Nothing half-done is used: the next configure (or `cmake -P cmake/fetch_sources.cmake`) "
    "removes an unfinished fetch's <entry>.partial-* folder and starts again.")
endfunction()

function(vfa_find_git)
  if(NOT GIT_EXECUTABLE)
    find_package(Git QUIET)
  endif()
  set(GIT_EXECUTABLE "${GIT_EXECUTABLE}" PARENT_SCOPE)
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

# The first VFA_SHOWN_PATHS items of a list, and how many more.
#   vfa_few(text a b c d e f g)  ->  "a, b, c, d, e and 2 more"
function(vfa_few out_var)
  set(items ${ARGN})
  list(LENGTH items n)
  if(n GREATER VFA_SHOWN_PATHS)
    list(SUBLIST items 0 ${VFA_SHOWN_PATHS} shown)
    math(EXPR rest "${n} - ${VFA_SHOWN_PATHS}")
    string(JOIN ", " text ${shown})
    set(text "${text} and ${rest} more")
  else()
    string(JOIN ", " text ${items})
  endif()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# A folder for this process's scratch files (TMPDIR, else /tmp), made anew.
#   vfa_scratch_dir(dir vfa-verify)  ->  /tmp/vfa-verify-k3J9x0aQ2mZp
function(vfa_scratch_dir out_var prefix)
  if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
    set(tmp "$ENV{TMPDIR}")
  else()
    set(tmp "/tmp")
  endif()
  string(RANDOM LENGTH 12 suffix)
  set(dir "${tmp}/${prefix}-${suffix}")
  file(MAKE_DIRECTORY "${dir}")
  set(${out_var} "${dir}" PARENT_SCOPE)
endfunction()

# The command prefix of a git that reads no configuration at all (no system,
# global or repository config, no attributes file of the user or the system)
# and works on <work_tree> with a scratch repository <scratch> whose objects
# are those of <objects>: a repository's own config and the user's cannot make
# it run a command (a filter, an fsmonitor hook) or change what it hashes.
#   vfa_isolated_git(git /tmp/vfa-verify-x /cache/src/fa-617264c1c795 /cache/src/fa-617264c1c795/.git/objects)
#     ->  cmake -E env GIT_DIR=/tmp/vfa-verify-x ... git
function(vfa_isolated_git out_var scratch work_tree objects)
  # A repository without a config file: HEAD, objects, refs are all git asks for.
  file(WRITE "${scratch}/HEAD" "ref: refs/heads/none\n")
  file(MAKE_DIRECTORY "${scratch}/objects" "${scratch}/refs")
  set(${out_var} "${CMAKE_COMMAND}" -E env
    "GIT_DIR=${scratch}" "GIT_WORK_TREE=${work_tree}" "GIT_OBJECT_DIRECTORY=${objects}"
    "GIT_INDEX_FILE=${scratch}/index" --unset=GIT_ALTERNATE_OBJECT_DIRECTORIES --unset=GIT_COMMON_DIR
    GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "HOME=${scratch}" "XDG_CONFIG_HOME=${scratch}"
    --unset=GIT_CONFIG_PARAMETERS --unset=GIT_CONFIG_COUNT
    GIT_ATTR_NOSYSTEM=1 GIT_NO_REPLACE_OBJECTS=1 GIT_LITERAL_PATHSPECS=1 GIT_NO_LAZY_FETCH=1
    GIT_OPTIONAL_LOCKS=0 "${GIT_EXECUTABLE}" PARENT_SCOPE)
endfunction()

# Compares the files under the pin's paths in <dir> with the trees of <commit>.
# Sets <out_var> to "" when they are equal, else to a text such as
# "1 file changed (hopper/flash_api.cpp); 141 files missing (include/cutlass/gemm/..., and 136 more)",
# or <err_var> when git cannot tell (no such commit, not a checkout).
# Every file's bytes are hashed as they are (git hash-object --no-filters: no
# filter, no end-of-line or encoding conversion), by a git that reads no
# configuration (vfa_isolated_git), into a throwaway index; nothing is written
# into <dir>, and nothing <dir>'s repository configures runs. An edit that keeps
# size and mtime is seen; the executable bit is ignored. The only git run with
# <dir>'s own config is `rev-parse`, which reads refs and runs no configured command.
#   vfa_compare_with_commit(diff err /cache/src/cutlass-62750a2b75c8 62750a2b... cutlass)
function(vfa_compare_with_commit out_var err_var dir commit component)
  set(paths ${VFA_PIN_${component}_PATHS})
  # Where the checkout keeps its objects (a worktree or a submodule has a .git file).
  vfa_git(common err -c "safe.directory=${dir}" -C "${dir}" rev-parse --git-common-dir)
  if(err)
    set(${out_var} "" PARENT_SCOPE)
    set(${err_var} "git could not compare its files with commit ${commit}: ${err}" PARENT_SCOPE)
    return()
  endif()
  get_filename_component(objects "${common}/objects" ABSOLUTE BASE_DIR "${dir}")
  vfa_scratch_dir(scratch vfa-verify)
  vfa_isolated_git(git "${scratch}" "${dir}" "${objects}")
  # Every file under the paths (none is tracked in the empty index, so all are
  # "others", ignored ones included), C-quoted one a line as hash-object and
  # update-index read them back; their hashes; both into the index.
  # Through files: an execute_process pipe costs ~40 ms more here.
  execute_process(COMMAND ${git} ls-files --others -- ${paths} WORKING_DIRECTORY "${dir}"
    OUTPUT_FILE "${scratch}/files" RESULT_VARIABLE rc ERROR_VARIABLE hash_err ERROR_STRIP_TRAILING_WHITESPACE
    TIMEOUT ${VFA_FETCH_TIMEOUT})
  if(rc EQUAL 0)
    execute_process(COMMAND ${git} hash-object --no-filters --stdin-paths WORKING_DIRECTORY "${dir}"
      INPUT_FILE "${scratch}/files" OUTPUT_FILE "${scratch}/hashes"
      RESULT_VARIABLE rc ERROR_VARIABLE hash_err ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT ${VFA_FETCH_TIMEOUT})
  endif()
  if(rc EQUAL 0)
    # "100644 <hash>\t<path>": the mode does not matter (only the executable bit
    # would differ, and that is ignored below).
    execute_process(COMMAND paste "${scratch}/hashes" "${scratch}/files" COMMAND sed "s/^/100644 /"
      COMMAND ${git} update-index --index-info WORKING_DIRECTORY "${dir}"
      RESULTS_VARIABLE rcs ERROR_VARIABLE hash_err ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT ${VFA_FETCH_TIMEOUT})
    set(rc 0)
    foreach(one IN LISTS rcs)
      if(NOT one EQUAL 0)
        set(rc "${one}")
      endif()
    endforeach()
  endif()
  set(raw "")
  if(rc EQUAL 0)
    execute_process(
      COMMAND ${git} diff-index --cached --raw --no-renames "${commit}" -- ${paths} WORKING_DIRECTORY "${dir}"
      RESULT_VARIABLE rc OUTPUT_VARIABLE raw ERROR_VARIABLE hash_err
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE
      TIMEOUT ${VFA_FETCH_TIMEOUT})
  endif()
  file(REMOVE_RECURSE "${scratch}")
  vfa_stop_if_interrupted("${rc}" "checking the files of '${dir}'")
  if(NOT rc EQUAL 0)
    if(hash_err STREQUAL "")
      set(hash_err "git exited with '${rc}'")
    endif()
    set(${out_var} "" PARENT_SCOPE)
    set(${err_var} "git could not compare its files with commit ${commit}: ${hash_err}" PARENT_SCOPE)
    return()
  endif()

  set(changed "")
  set(missing "")
  set(added "")
  string(REPLACE ";" "\\;" raw "${raw}")
  string(REPLACE "\n" ";" lines "${raw}")
  foreach(line IN LISTS lines)
    # :<old mode> <new mode> <old blob> <new blob> <status>\t<path>
    if(NOT line MATCHES "^:([0-7]+) ([0-7]+) ([0-9a-f]+) ([0-9a-f]+) ([A-Z])[0-9]*\t(.*)$")
      continue()
    endif()
    set(old_mode "${CMAKE_MATCH_1}")
    set(new_mode "${CMAKE_MATCH_2}")
    set(same_blob FALSE)
    if(CMAKE_MATCH_3 STREQUAL CMAKE_MATCH_4)
      set(same_blob TRUE)
    endif()
    set(status "${CMAKE_MATCH_5}")
    set(path "${CMAKE_MATCH_6}")
    if(status STREQUAL "D")
      list(APPEND missing "${path}")
    elseif(status STREQUAL "A")
      list(APPEND added "${path}")
    elseif(same_blob AND old_mode MATCHES "^1006|^1007" AND new_mode MATCHES "^1006|^1007")
      # Only the executable bit: a copy that lost it compiles the same.
    else()
      list(APPEND changed "${path}")
    endif()
  endforeach()
  set(parts "")
  foreach(kind changed missing added)
    if(${kind})
      list(LENGTH ${kind} n)
      vfa_few(few ${${kind}})
      set(files "files")
      if(n EQUAL 1)
        set(files "file")
      endif()
      list(APPEND parts "${n} ${files} ${kind} (${few})")
    endif()
  endforeach()
  string(JOIN "; " text ${parts})
  set(${out_var} "${text}" PARENT_SCOPE)
  set(${err_var} "" PARENT_SCOPE)
endfunction()

# The absolute include directories <rel_dirs> of <component>'s resolved source
# tree, each checked to lie under a folder of the pin's `paths`, the only
# folders whose every file is verified: a folder above them (csrc/) could hold
# files no check has seen, which would shadow a header of the same name found
# later on the include path (csrc/cutlass/numeric_types.h before CUTLASS's).
# Stops, naming the folder and the pin file, when one is not.
#   vfa_verified_include_dirs(dirs flash_attention csrc/flash_attn/src hopper)
#     ->  /cache/src/flash-attention-617264c1c795/csrc/flash_attn/src;/cache/.../hopper
#   vfa_verified_include_dirs(dirs flash_attention csrc)  ->  FATAL_ERROR "... the include
#     directory '/cache/.../csrc' is not under flash_attention.paths (csrc/flash_attn, ...) ..."
function(vfa_verified_include_dirs out_var component)
  set(root "${VFA_${component}_SOURCE_DIR}")
  set(dirs "")
  foreach(rel IN LISTS ARGN)
    set(verified FALSE)
    foreach(path IN LISTS VFA_PIN_${component}_PATHS)
      string(FIND "${rel}/" "${path}/" at)
      if(at EQUAL 0)
        set(verified TRUE)
      endif()
    endforeach()
    if(NOT verified)
      string(REPLACE ";" ", " paths "${VFA_PIN_${component}_PATHS}")
      message(FATAL_ERROR
        "The build would compile files nobody verified: the include directory '${root}/${rel}' "
        "is not under ${component}.paths (${paths}) of the pin file '${VFA_PIN_FILE}', whose every "
        "file is checked against the pinned commit. Add '${rel}' (or a folder above it) to "
        "${component}.paths (vendor/flash-attention/README.md).")
    endif()
    list(APPEND dirs "${root}/${rel}")
  endforeach()
  set(${out_var} "${dirs}" PARENT_SCOPE)
endfunction()

# --- one explicit source directory -----------------------------------------

# Verifies <dir> given by <src_var>; sets VFA_<component>_* in the caller.
# Never refuses a readable tree: another commit, a dirty tree or one git
# cannot verify builds with a loud warning, and the build info says so.
# <err_var>: why <dir> cannot be used at all (missing, or lacking required files).
#   vfa_use_source_dir(flash_attention /src/fa FLASH_ATTN_SRC_DIR err)  ->  with an edited
#   hopper/flash_api.cpp: VFA_flash_attention_MATCHES_PIN=FALSE, _DIRTY=TRUE, a warning
function(vfa_use_source_dir component dir src_var err_var)
  set(pinned "${VFA_PIN_${component}_COMMIT}")
  if(EXISTS "${dir}" AND NOT IS_DIRECTORY "${dir}")
    string(CONCAT message
      "${src_var} points to '${dir}', which is a file, not a folder. Point it at the top folder of a "
      "checkout of ${VFA_PIN_${component}_URL} at commit ${pinned} (an archive must be unpacked "
      "first), or unset it to fetch the pin.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  elseif(NOT IS_DIRECTORY "${dir}")
    string(CONCAT message
      "${src_var} points to '${dir}', which does not exist (a relative path is taken from "
      "the project directory). Point it at a checkout of "
      "${VFA_PIN_${component}_URL} at commit ${pinned}, or unset it to fetch the pin.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  vfa_missing_files(missing "${dir}" ${component})
  if(missing)
    string(REPLACE ";" ", " missing "${missing}")
    string(CONCAT message
      "${src_var}='${dir}' is not a complete ${component} source tree: missing ${missing}. "
      "It may be a half-fetched checkout, a sparse checkout without those folders, or the "
      "wrong folder. Point it at a full checkout of commit ${pinned}.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()

  set(commit "unknown")
  set(verified FALSE)
  set(dirty "")
  set(why "")
  vfa_find_git()
  if(NOT EXISTS "${dir}/.git")
    set(why "it is not a git checkout (no .git), so its content cannot be verified against the pin")
  elseif(NOT GIT_EXECUTABLE)
    set(why "git was not found, so its content cannot be verified against the pin")
  else()
    # safe.directory: a checkout copied from another user is still readable.
    vfa_git(head err -c "safe.directory=${dir}" -C "${dir}" rev-parse --verify "HEAD^{commit}")
    if(err)
      set(why "git cannot read its HEAD (${err}), so its content cannot be verified against the pin")
    else()
      set(commit "${head}")
      vfa_compare_with_commit(diff err "${dir}" "${commit}" ${component})
      if(err)
        set(why "${err}")
      else()
        set(verified TRUE)
        if(diff)
          set(dirty TRUE)
          set(why "its files differ from its commit ${commit}: ${diff}")
        else()
          set(dirty FALSE)
        endif()
      endif()
    endif()
  endif()
  if(commit STREQUAL "unknown" AND EXISTS "${dir}/${VFA_SOURCE_MARKER}")
    # A copied cache entry: its marker says which commit was fetched (not verified).
    file(READ "${dir}/${VFA_SOURCE_MARKER}" marker)
    string(JSON marked ERROR_VARIABLE marker_err GET "${marker}" commit)
    if(NOT marker_err)
      set(commit "${marked}")
    endif()
  endif()

  set(matches FALSE)
  if(verified AND NOT dirty AND commit STREQUAL pinned)
    set(matches TRUE)
  endif()
  if(NOT matches)
    set(problems "")
    if(NOT commit STREQUAL pinned)
      string(APPEND problems " is at commit ${commit}, but the pin names ${pinned}.\n")
    endif()
    if(why)
      string(APPEND problems " ${why}.\n")
    endif()
    message(WARNING
      "\n"
      "==========================================================================\n"
      " ${src_var}='${dir}'\n"
      "${problems}"
      " Building it anyway; the build info records matches_pin=false.\n"
      " Wheels for release must be built from the pinned commit, unmodified.\n"
      "==========================================================================")
  endif()
  set(VFA_${component}_SOURCE_DIR "${dir}" PARENT_SCOPE)
  set(VFA_${component}_COMMIT "${commit}" PARENT_SCOPE)
  set(VFA_${component}_MATCHES_PIN ${matches} PARENT_SCOPE)
  set(VFA_${component}_VERIFIED ${verified} PARENT_SCOPE)
  set(VFA_${component}_DIRTY "${dirty}" PARENT_SCOPE)
  set(VFA_${component}_ORIGIN "source_dir" PARENT_SCOPE)
  set(VFA_${component}_URL "" PARENT_SCOPE)
endfunction()

# --- the source cache ------------------------------------------------------------

# Checks a cache entry: its marker names the pinned commit and its content
# equals that commit's tree. Sets <url_var> to the URL it was fetched from,
# or <err_var> to why it is refused and how to fix it. Reads only.
#   vfa_check_cached(cutlass /cache/src/cutlass-62750a2b75c8 url err)
#     ->  url=https://github.com/NVIDIA/cutlass.git, err="" (or "The cached cutlass
#         checkout '...' does not hold commit ...: 1 file changed (...). ... Remove that folder ...")
function(vfa_check_cached component dest url_var err_var)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  set(fix "Remove that folder (rm -rf '${dest}') and build again; it will be fetched anew.")
  set(marker_file "${dest}/${VFA_SOURCE_MARKER}")
  if(NOT EXISTS "${marker_file}")
    string(CONCAT message "The cached ${component} checkout '${dest}' is not usable: it has no "
      "${VFA_SOURCE_MARKER} marker, so it was never completely fetched (an interrupted fetch "
      "of an older version, or a folder made by hand). ${fix}")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  file(READ "${marker_file}" marker)
  string(JSON marked ERROR_VARIABLE json_err GET "${marker}" commit)
  string(JSON url ERROR_VARIABLE json_err2 GET "${marker}" url)
  if(json_err OR json_err2)
    string(CONCAT message "The cached ${component} checkout '${dest}' is not usable: its marker "
      "'${marker_file}' is not the JSON a fetch writes (${json_err}${json_err2}). ${fix}")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  if(NOT marked STREQUAL commit)
    string(CONCAT message "The cached ${component} checkout '${dest}' is not usable: its marker says "
      "commit ${marked}, not ${commit}. ${fix}")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  if(NOT EXISTS "${dest}/.git")
    set(${err_var} "The cached ${component} checkout '${dest}' has no .git, so it cannot be verified. ${fix}"
        PARENT_SCOPE)
    return()
  endif()
  vfa_find_git()
  if(NOT GIT_EXECUTABLE)
    string(CONCAT message "git is needed to verify the cached ${component} checkout '${dest}' but was "
      "not found. Install git, or set ${VFA_${component}_PREFIX}_SRC_DIR to that folder "
      "(it then builds unverified, with matches_pin=false).")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  vfa_compare_with_commit(diff err "${dest}" "${commit}" ${component})
  if(err)
    set(${err_var} "The cached ${component} checkout '${dest}' is not usable: ${err}. ${fix}" PARENT_SCOPE)
    return()
  endif()
  if(diff)
    string(CONCAT message "The cached ${component} checkout '${dest}' does not hold commit ${commit} "
      "unmodified: ${diff}. Something edited it after the fetch. ${fix}")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  # Unmodified, but the pin asks for files its commit does not have.
  vfa_pin_commit_lacks_files(problem ${component} "${dest}")
  if(problem)
    set(${err_var} "${problem}" PARENT_SCOPE)
    return()
  endif()
  vfa_shown_url(url "${url}")
  set(${url_var} "${url}" PARENT_SCOPE)
endfunction()

# Fetches the pinned commit of <component> from <url> into <dest>, under the
# entry's lock, in a private temporary folder renamed into place only once
# verified, so <dest> is never half-written. Stale temporary folders of the
# same entry (from a fetch that was killed) are removed first. Sets <err_var>
# on failure, with what to do.
#   vfa_fetch_into_cache(cutlass https://github.com/NVIDIA/cutlass.git /cache/src/cutlass-62750a2b75c8 err)
function(vfa_fetch_into_cache component url dest err_var)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  set(prefix ${VFA_${component}_PREFIX})
  vfa_shown_url(shown "${url}")
  get_filename_component(parent "${dest}" DIRECTORY)
  get_filename_component(name "${dest}" NAME)
  vfa_find_git()
  if(NOT GIT_EXECUTABLE)
    string(CONCAT message "git is needed to fetch ${component} but was not found. Install git, or set "
      "${prefix}_SRC_DIR to a checkout of commit ${commit}.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  # The cache must be writable to fetch into it (checked before the lock,
  # whose creation would fail with a less helpful message).
  set(lock_file "${parent}/.${name}.lock")
  set(holder_file "${parent}/.${name}.holder")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E make_directory "${parent}"
                  RESULT_VARIABLE rc ERROR_VARIABLE touch_err ERROR_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    execute_process(COMMAND "${CMAKE_COMMAND}" -E touch "${lock_file}"
                    RESULT_VARIABLE rc ERROR_VARIABLE touch_err ERROR_STRIP_TRAILING_WHITESPACE)
  endif()
  if(NOT rc EQUAL 0)
    string(CONCAT message "The source cache '${parent}' is not writable (${touch_err}), so ${component} "
      "cannot be fetched into it. Set VFA_SOURCE_CACHE to a writable folder, or ${prefix}_SRC_DIR "
      "to a checkout of commit ${commit}.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()

  # Builds running side by side share the cache: one fetches, the others wait,
  # saying for whom, and not forever. The holder is written to a sidecar file:
  # writing the lock file itself would release the lock.
  set(holder "another build (it did not say who)")
  file(LOCK "${lock_file}" GUARD FUNCTION TIMEOUT 0 RESULT_VARIABLE lock_result)
  if(NOT lock_result STREQUAL "0")
    if(EXISTS "${holder_file}")
      file(READ "${holder_file}" holder)
      string(STRIP "${holder}" holder)
    endif()
    message(STATUS "vendored-flash-attn: waiting up to ${VFA_SOURCE_LOCK_TIMEOUT} s "
      "(VFA_SOURCE_LOCK_TIMEOUT) for '${lock_file}', held by ${holder}")
    file(LOCK "${lock_file}" GUARD FUNCTION TIMEOUT ${VFA_SOURCE_LOCK_TIMEOUT} RESULT_VARIABLE lock_result)
  endif()
  if(NOT lock_result STREQUAL "0")
    string(CONCAT message "Gave up after VFA_SOURCE_LOCK_TIMEOUT=${VFA_SOURCE_LOCK_TIMEOUT} s waiting for "
      "the lock '${lock_file}' (${lock_result}), held by ${holder}. If that process still runs, "
      "let it finish or stop it; a lock is released when its process exits (on a network "
      "filesystem the lock of a dead host can stay: then delete '${lock_file}'). Raise "
      "VFA_SOURCE_LOCK_TIMEOUT to wait longer.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  # Another build may have fetched it while this one waited.
  if(EXISTS "${dest}")
    vfa_check_cached(${component} "${dest}" cached_url err)
    set(${err_var} "${err}" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND sh -c "echo $PPID" OUTPUT_VARIABLE pid OUTPUT_STRIP_TRAILING_WHITESPACE)
  cmake_host_system_information(RESULT host QUERY HOSTNAME)
  string(TIMESTAMP now "%Y-%m-%dT%H:%M:%SZ" UTC)
  file(WRITE "${holder_file}"
    "pid ${pid} on host ${host} since ${now} (fetching ${component} ${commit} from ${shown})\n")
  file(GLOB stale LIST_DIRECTORIES true "${dest}.partial-*")
  foreach(folder IN LISTS stale)
    message(STATUS "vendored-flash-attn: removing '${folder}', left by a fetch that did not finish")
    file(REMOVE_RECURSE "${folder}")
  endforeach()

  string(RANDOM LENGTH 8 suffix)
  set(tmp "${dest}.partial-${suffix}")
  message(STATUS "vendored-flash-attn: fetching ${component} ${commit} from ${shown}")
  vfa_checkout_pinned(${component} "${url}" "${tmp}" err)
  if(NOT err)
    file(RENAME "${tmp}" "${dest}" RESULT rename_result)
    if(NOT rename_result STREQUAL "0")
      set(err "Could not move the ${component} checkout into '${dest}': ${rename_result}")
    endif()
  endif()
  if(err)
    file(REMOVE_RECURSE "${tmp}")
    set(${err_var} "${err}" PARENT_SCOPE)
  endif()
endfunction()

# git's words for a write that failed on this machine (a full disk, a quota, a
# read-only mount), as opposed to a server that could not be reached.
set(VFA_GIT_LOCAL_WRITE_ERRORS "No space left on device|Out of diskspace|Disk quota exceeded|Read-only file system|unable to write|could not write|couldn't write|cannot create directory|write error|short write")
# How many lines of git's error text a message quotes.
set(VFA_SHOWN_GIT_LINES 6)

# The text for a failed git step of a fetch into <dir>: <what> failed, git's
# own words (the first VFA_SHOWN_GIT_LINES lines), then the likely cause: this
# machine's disk when git says a write failed, else <network_hint>.
#   vfa_git_failure(text "Could not check out cutlass commit 62750a2b..." "error: unable to write
#     file include/cute/tensor.hpp ..." /cache/src/cutlass-62750a2b75c8.partial-x "If this machine ...")
#     ->  "Could not ...:\nerror: unable to write file ...\ngit could not write into '/cache/src' ..."
function(vfa_git_failure out_var what err dir network_hint)
  string(REPLACE ";" "\\;" lines "${err}")
  string(REPLACE "\n" ";" lines "${lines}")
  list(LENGTH lines n)
  if(n GREATER VFA_SHOWN_GIT_LINES)
    list(SUBLIST lines 0 ${VFA_SHOWN_GIT_LINES} lines)
    math(EXPR rest "${n} - ${VFA_SHOWN_GIT_LINES}")
    list(APPEND lines "(and ${rest} more lines)")
  endif()
  list(JOIN lines "\n" shown_err)
  if(err MATCHES "(${VFA_GIT_LOCAL_WRITE_ERRORS})")
    get_filename_component(parent "${dir}" DIRECTORY)
    string(CONCAT hint "git could not write into '${parent}' (${CMAKE_MATCH_1}): the cause is this "
      "machine's disk, not the network. Free space there, or set VFA_SOURCE_CACHE to a folder with room "
      "(the two pinned checkouts take about 35 MB).")
  else()
    set(hint "${network_hint}")
  endif()
  set(${out_var} "${what}:\n${shown_err}\n${hint}" PARENT_SCOPE)
endfunction()

# Inside vfa_checkout_pinned: fail with the text in `failure`.
macro(vfa_checkout_failed)
  set(${err_var} "${failure}" PARENT_SCOPE)
  return()
endmacro()

# A sparse checkout of the pinned commit of <component> from <url> in <dir>,
# verified (HEAD, tag, required files, content) and marked complete.
function(vfa_checkout_pinned component url dir err_var)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  set(tag "${VFA_PIN_${component}_TAG}")
  set(prefix ${VFA_${component}_PREFIX})
  vfa_shown_url(shown "${url}")
  string(CONCAT offline_hint
    "If this machine cannot reach ${shown}, point ${prefix}_MIRROR at a mirror "
    "that has the commit, or ${prefix}_SRC_DIR at a local checkout of it.")

  # No template: the user's init.templateDir could bring hooks or info/attributes.
  vfa_git(ignored err init -q --template= "${dir}")
  if(err)
    vfa_git_failure(failure "Could not create '${dir}' for the ${component} checkout" "${err}" "${dir}" "")
    vfa_checkout_failed()
  endif()
  # The remote goes into the checkout's config by hand, readable by this user
  # only while it may hold credentials: on git's command line (remote add,
  # ls-remote <url>) any local user would see them in `ps`.
  if(url MATCHES "\n")
    set(failure "${prefix}_MIRROR holds a line break; give one URL.")
    vfa_checkout_failed()
  endif()
  string(REPLACE "\\" "\\\\" quoted "${url}")
  string(REPLACE "\"" "\\\"" quoted "${quoted}")
  file(CHMOD "${dir}/.git/config" PERMISSIONS OWNER_READ OWNER_WRITE)
  file(APPEND "${dir}/.git/config"
    "[remote \"origin\"]\n\turl = \"${quoted}\"\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n")

  # A server that accepts connections and never answers is caught here, in
  # the stall time and for every protocol: https and ssh hang in their
  # handshake, where git's low-speed limit does not apply yet. Other errors
  # are left to the fetch, which says more.
  set(limit ${VFA_FETCH_STALL_TIMEOUT})
  set(knob VFA_FETCH_STALL_TIMEOUT)
  if(VFA_FETCH_TIMEOUT LESS limit)
    set(limit ${VFA_FETCH_TIMEOUT})
    set(knob VFA_FETCH_TIMEOUT)
  endif()
  execute_process(
    COMMAND "${GIT_EXECUTABLE}" -c protocol.version=2 -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=${limit}
            -C "${dir}" ls-remote origin HEAD
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE probe_err TIMEOUT ${limit})
  vfa_stop_if_interrupted("${rc}" "reaching ${shown} for ${component}")
  if(NOT rc MATCHES "^[0-9]+$" OR probe_err MATCHES "Operation too slow|curl 28")
    string(CONCAT failure "${shown} accepted the connection but did not answer within "
      "${knob}=${limit} s: a hung server or proxy. Raise ${knob} if it is only slow.\n${offline_hint}")
    vfa_checkout_failed()
  endif()

  # Only the folders the build compiles: CUTLASS is large, and the upstream
  # repository carries big assets the build never reads.
  vfa_git(ignored err -C "${dir}" sparse-checkout set ${VFA_PIN_${component}_PATHS})
  if(err)
    string(CONCAT failure "git sparse-checkout failed in '${dir}': ${err}. git 2.25 or newer is needed.")
    vfa_checkout_failed()
  endif()
  set(fetch_args -c protocol.version=2 -C "${dir}" fetch --quiet --no-tags --filter=blob:none)

  if(tag)
    vfa_git(ignored err ${fetch_args} --depth 1 origin "+refs/tags/${tag}:refs/tags/${tag}")
    if(err)
      vfa_git_failure(failure "Could not fetch tag '${tag}' of ${component} from ${shown}" "${err}" "${dir}"
        "${offline_hint}")
      vfa_checkout_failed()
    endif()
    vfa_git(tagged err -C "${dir}" rev-parse "refs/tags/${tag}^{commit}")
    if(NOT tagged STREQUAL commit)
      string(CONCAT failure
        "Tag '${tag}' of ${component} at ${shown} now points at ${tagged}, but the pin "
        "names ${commit}. A moved tag is a supply-chain event, so the build stops here. "
        "Find out why the tag moved; then either drop the tag from the pin and keep the "
        "commit, or review the new commit and bump the pin (vendor/flash-attention/README.md).")
      vfa_checkout_failed()
    endif()
  else()
    vfa_git(ignored err ${fetch_args} --depth 1 origin "${commit}")
    if(err)
      # Some servers refuse fetching an unadvertised commit; fall back to the
      # branches and tags and look for it there. A timeout is not retried.
      set(err2 "${err}")
      set(err3 "")
      if(NOT err MATCHES "VFA_FETCH_TIMEOUT|VFA_FETCH_STALL_TIMEOUT")
        vfa_git(ignored err2 ${fetch_args} --tags origin "+refs/heads/*:refs/remotes/origin/*")
        vfa_git(ignored err3 -C "${dir}" cat-file -e "${commit}^{commit}")
      endif()
      if(err2)
        vfa_git_failure(failure "Could not fetch ${component} commit ${commit} from ${shown}" "${err}" "${dir}"
          "${offline_hint}")
        vfa_checkout_failed()
      elseif(err3)
        string(CONCAT failure "Could not fetch ${component} commit ${commit} from ${shown}:\n"
          "the repository does not contain that commit\n${offline_hint}")
        vfa_checkout_failed()
      endif()
    endif()
  endif()

  # In a partial clone the checkout downloads the blobs: a network step too.
  vfa_git(ignored err -C "${dir}" -c advice.detachedHead=false checkout -q --detach "${commit}")
  vfa_git(head err2 -C "${dir}" rev-parse HEAD)
  if(err OR NOT head STREQUAL commit)
    vfa_git_failure(failure "Could not check out ${component} commit ${commit} from ${shown}" "${err}${err2}"
      "${dir}" "${offline_hint}")
    vfa_checkout_failed()
  endif()
  vfa_pin_commit_lacks_files(failure ${component} "${dir}")
  if(failure)
    vfa_checkout_failed()
  endif()
  # What the next configure checks must hold now (a git filter that does not
  # round-trip would otherwise get the entry refused ever after).
  vfa_compare_with_commit(diff err "${dir}" "${commit}" ${component})
  if(err OR diff)
    string(CONCAT failure "The fresh ${component} checkout in '${dir}' does not hash back to "
      "commit ${commit} (${err}${diff}): git rewrote files as it wrote them. Your git settings "
      "cannot (core.autocrlf, core.eol and attribute files of the user and the system are turned "
      "off for the fetch), so a filter, text/eol or working-tree-encoding rule in the repository's "
      "own .gitattributes did: check the pinned commit's .gitattributes.")
    vfa_checkout_failed()
  endif()
  # No credentials stay in the cache: nothing reads this remote again. Then
  # the config is readable again by every user of a shared cache.
  vfa_git(ignored err -C "${dir}" remote set-url origin "${shown}")
  file(CHMOD "${dir}/.git/config" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  file(WRITE "${dir}/${VFA_SOURCE_MARKER}"
    "{\"name\": \"${component}\", \"commit\": \"${commit}\", \"tag\": \"${tag}\", \"url\": \"${shown}\"}\n")
  set(${err_var} "" PARENT_SCOPE)
endfunction()

# --- resolution ----------------------------------------------------------------

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
    "the build info. README: Where the upstream comes from.")
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
    foreach(key SOURCE_DIR COMMIT MATCHES_PIN VERIFIED DIRTY ORIGIN URL)
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
    vfa_check_cached(${component} "${dest}" url err)
    set(origin "cache")
  elseif(VFA_FULLY_DISCONNECTED)
    string(CONCAT err "FETCHCONTENT_FULLY_DISCONNECTED is set, so ${component} is not fetched, and "
      "the cache has no checkout of ${pinned} at '${dest}'. Set ${prefix}_SRC_DIR to a checkout "
      "of it, or allow the fetch once (cmake -P cmake/fetch_sources.cmake fills the cache).")
  else()
    vfa_fetch_into_cache(${component} "${url}" "${dest}" err)
    set(origin "fetched")
  endif()
  if(err)
    set(VFA_${component}_ERROR "${err}" PARENT_SCOPE)
    return()
  endif()
  set(VFA_${component}_SOURCE_DIR "${dest}" PARENT_SCOPE)
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
  if(VFA_SOURCE_CACHE STREQUAL "")
    vfa_default_source_cache(VFA_SOURCE_CACHE)
  endif()
  vfa_read_pin("${VFA_PIN_FILE}")

  # Git runs for these repositories only, never prompts, and never sees
  # environment that points it elsewhere; restored afterwards.
  foreach(_vfa_name IN LISTS VFA_GIT_LOCATION_ENV ITEMS GIT_TERMINAL_PROMPT GIT_ATTR_NOSYSTEM)
    set(_vfa_saved_${_vfa_name} "$ENV{${_vfa_name}}")
    set(_vfa_had_${_vfa_name} FALSE)
    if(DEFINED ENV{${_vfa_name}})
      set(_vfa_had_${_vfa_name} TRUE)
    endif()
    unset(ENV{${_vfa_name}})
  endforeach()
  set(ENV{GIT_TERMINAL_PROMPT} 0)
  set(ENV{GIT_ATTR_NOSYSTEM} 1)

  set(_vfa_failed FALSE)
  foreach(_vfa_component IN LISTS VFA_COMPONENTS)
    vfa_resolve_source(${_vfa_component})
    if(VFA_${_vfa_component}_ERROR)
      set(_vfa_failed TRUE)
    else()
      message(STATUS "vendored-flash-attn: ${_vfa_component} ${VFA_${_vfa_component}_COMMIT} "
        "(${VFA_${_vfa_component}_ORIGIN}) at ${VFA_${_vfa_component}_SOURCE_DIR}")
    endif()
  endforeach()

  if(_vfa_failed)
    vfa_report_source_failures()
  endif()
  vfa_check_cutlass_matches_submodule()
  foreach(_vfa_name IN LISTS VFA_GIT_LOCATION_ENV ITEMS GIT_TERMINAL_PROMPT GIT_ATTR_NOSYSTEM)
    if(_vfa_had_${_vfa_name})
      set(ENV{${_vfa_name}} "${_vfa_saved_${_vfa_name}}")
    else()
      unset(ENV{${_vfa_name}})
    endif()
  endforeach()
endmacro()

# One message for every component: the failures with their fixes, and where
# the others stand, so one attempt tells all that is needed.
# git's own error text repeats the URL it used, credentials and all: the text is
# scrubbed (every URL in it, and the secret pieces of each URL this configure used).
function(vfa_report_source_failures)
  set(text "vendored-flash-attn could not get every upstream source.")
  foreach(component IN LISTS VFA_COMPONENTS)
    string(APPEND text "\n${component} (commit ${VFA_PIN_${component}_COMMIT}): ")
    if(VFA_${component}_ERROR)
      string(APPEND text "FAILED. ${VFA_${component}_ERROR}")
    else()
      string(APPEND text "ok (${VFA_${component}_ORIGIN}: ${VFA_${component}_SOURCE_DIR}); nothing to do.")
    endif()
  endforeach()
  vfa_url_secrets(text text "${text}")
  message(FATAL_ERROR "${text}")
endfunction()

# flash-attention records the CUTLASS it was developed against as a submodule.
# When both pins disagree, say so: the bump was likely half done.
function(vfa_check_cutlass_matches_submodule)
  if(NOT VFA_flash_attention_ORIGIN STREQUAL "source_dir" AND EXISTS "${VFA_flash_attention_SOURCE_DIR}/.git")
    vfa_find_git()
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
