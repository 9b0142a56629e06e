# Running git for the upstream sources, and showing its URLs: every git call
# of a fetch goes through vfa_git (bounded in time, the content settings
# pinned, an interrupt stops the configure); the verification uses a git that
# reads no configuration at all (vfa_begin_isolated_git); every URL shown or recorded
# goes through the project's one scrubber, cmake/vfa_build/url_secrets.py.
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

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

# Asks cmake/vfa_build/url_secrets.py, the project's one URL scrubber (the compiler-cache
# probe imports it too), about <text>, passed through the environment, never on
# a command line. <mode>: url (one URL, scrubbed), text (every URL in it
# scrubbed) or secrets (what one URL carries that is secret, as a list).
# In text mode the secret pieces of every URL this configure used (the global
# property VFA_SOURCE_URLS) are removed too, wherever they appear.
# It fails closed: when the Python cannot run, nothing of the text is shown, and in
# secrets mode the answer is "credentials that could not be checked", so a caller that
# refuses credentials (vfa_refuse_credentials_in_a_definition) refuses.
#   vfa_url_secrets(out url "https://ci:p@ss@git.example/fa.git?token=x")  ->  https://git.example/fa.git
#   vfa_url_secrets(out secrets "https://ci:s3cret@git.example/fa.git")     ->  a password
function(vfa_url_secrets out_var mode text)
  # Only '@', '?' and '#' start a part that may be secret (user:password@, a
  # query, a fragment): a URL without them is shown as it is, without asking
  # Python (~30 ms a call on the 2-core machine, several per configure).
  if(NOT mode STREQUAL "text" AND NOT text MATCHES "[@?#]")
    if(mode STREQUAL "url")
      set(${out_var} "${text}" PARENT_SCOPE)
    else()
      set(${out_var} "" PARENT_SCOPE)
    endif()
    return()
  endif()
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
    execute_process(COMMAND "${python}" -E -s -S "${VFA_BUILD_PY}" url_secrets ${mode}
      OUTPUT_VARIABLE answer RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 60)
    unset(ENV{VFA_URL_TEXT})
    unset(ENV{VFA_URL_KNOWN})
  endif()
  if(NOT rc EQUAL 0)
    string(STRIP "${err}" err)
    set(answer "(not shown: no Python to remove credentials from it: '${python}' ${rc} ${err})")
    if(mode STREQUAL "secrets")
      set(answer "credentials that could not be checked (the Python that checks URLs, '${python}', did not run: ${rc} ${err})")
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

# The command that runs <command...> in a process group of its own, ended whole after
# <seconds> (exit status 124), when it ends (whatever it left running) or on an interrupt
# (cmake/vfa_build/sources/bounded_run.py): CMake's execute_process TIMEOUT ends only the process it started,
# and a git whose helpers start git again (a partial clone's lazy fetch) would leave them
# running. CMake's own TIMEOUT stays as a backstop, a little later.
#   vfa_bounded(cmd 600)  ->  /venv/bin/python;-E;-s;-S;<project>/cmake/vfa_build;sources.bounded_run;--timeout;600;--
function(vfa_bounded out_var seconds)
  vfa_script_python(python)
  if(NOT python)
    message(FATAL_ERROR "vendored-flash-attn: no Python found to run git within its time limit "
      "(cmake/vfa_build/sources/bounded_run.py). Put python3 on PATH, or pass -DPython_EXECUTABLE=<python>.")
  endif()
  set(${out_var} "${python}" -E -s -S "${VFA_BUILD_PY}" sources.bounded_run --timeout ${seconds} --
      PARENT_SCOPE)
endfunction()

# Runs git with VFA_GIT_CONTENT_SETTINGS, in a process group of its own ended whole after
# VFA_FETCH_TIMEOUT seconds (vfa_bounded), an http(s) transfer also when it stays below
# 1 KB/s for VFA_FETCH_STALL_TIMEOUT seconds (no effect on local commands), never with a
# lazy fetch (GIT_NO_LAZY_FETCH, set while resolving); on failure stores the error text in
# <err_var>. With VFA_GIT_INPUT_FILE set in the caller, git reads its standard input from it.
#   vfa_git(head err -C /src rev-parse HEAD)  ->  head=617264c1..., err=""
function(vfa_git result_var err_var)
  vfa_bounded(bounded ${VFA_FETCH_TIMEOUT})
  math(EXPR backstop "${VFA_FETCH_TIMEOUT} + 30")
  set(input "")
  if(VFA_GIT_INPUT_FILE)
    set(input INPUT_FILE "${VFA_GIT_INPUT_FILE}")
  endif()
  execute_process(
    COMMAND ${bounded} "${GIT_EXECUTABLE}" -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=${VFA_FETCH_STALL_TIMEOUT}
            ${VFA_GIT_CONTENT_SETTINGS} ${ARGN}
    ${input}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_STRIP_TRAILING_WHITESPACE
    TIMEOUT ${backstop})
  if(rc EQUAL 124)
    set(rc "Process terminated due to timeout")
  endif()
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

# Makes every git this process starts, until vfa_end_isolated_git(), one that
# reads no configuration at all (no system, global or repository config, no
# attributes file of the user or the system) and works on <work_tree> with a
# scratch repository <scratch> whose objects are those of <objects>: a
# repository's own config and the user's cannot make it run a command (a
# filter, an fsmonitor hook) or change what it hashes. Through this process's
# environment, saved and restored: a `cmake -E env` wrapper per call cost
# ~25 ms each on the 2-core machine.
#   vfa_begin_isolated_git(/tmp/vfa-verify-x /cache/src/fa-617264c1c795 /cache/src/fa-617264c1c795/.git/objects)
#     ->  GIT_DIR=/tmp/vfa-verify-x, GIT_CONFIG_GLOBAL=/dev/null, ... until vfa_end_isolated_git()
set(VFA_ISOLATED_GIT_ENV GIT_DIR GIT_WORK_TREE GIT_OBJECT_DIRECTORY GIT_INDEX_FILE GIT_CONFIG_NOSYSTEM
    GIT_CONFIG_GLOBAL HOME XDG_CONFIG_HOME GIT_ATTR_NOSYSTEM GIT_NO_REPLACE_OBJECTS GIT_LITERAL_PATHSPECS
    GIT_NO_LAZY_FETCH GIT_OPTIONAL_LOCKS GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_COMMON_DIR
    GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT)
function(vfa_begin_isolated_git scratch work_tree objects)
  # A repository without a config file: HEAD, objects, refs are all git asks for.
  file(WRITE "${scratch}/HEAD" "ref: refs/heads/none\n")
  file(MAKE_DIRECTORY "${scratch}/objects" "${scratch}/refs")
  foreach(name IN LISTS VFA_ISOLATED_GIT_ENV)
    if(DEFINED ENV{${name}})
      set_property(GLOBAL PROPERTY VFA_SAVED_ENV_${name} "$ENV{${name}}")
    else()
      set_property(GLOBAL PROPERTY VFA_SAVED_ENV_${name})
    endif()
    unset(ENV{${name}})
  endforeach()
  set(ENV{GIT_DIR} "${scratch}")
  set(ENV{GIT_WORK_TREE} "${work_tree}")
  set(ENV{GIT_OBJECT_DIRECTORY} "${objects}")
  set(ENV{GIT_INDEX_FILE} "${scratch}/index")
  set(ENV{GIT_CONFIG_NOSYSTEM} 1)
  set(ENV{GIT_CONFIG_GLOBAL} /dev/null)
  # git before 2.32 knows no GIT_CONFIG_GLOBAL: it reads $HOME/.gitconfig.
  set(ENV{HOME} "${scratch}")
  set(ENV{XDG_CONFIG_HOME} "${scratch}")
  foreach(name GIT_ATTR_NOSYSTEM GIT_NO_REPLACE_OBJECTS GIT_LITERAL_PATHSPECS GIT_NO_LAZY_FETCH)
    set(ENV{${name}} 1)
  endforeach()
  set(ENV{GIT_OPTIONAL_LOCKS} 0)
endfunction()

# Restores the environment vfa_begin_isolated_git() changed.
#   vfa_end_isolated_git()
function(vfa_end_isolated_git)
  foreach(name IN LISTS VFA_ISOLATED_GIT_ENV)
    get_property(saved GLOBAL PROPERTY VFA_SAVED_ENV_${name} SET)
    if(saved)
      get_property(value GLOBAL PROPERTY VFA_SAVED_ENV_${name})
      set(ENV{${name}} "${value}")
    else()
      unset(ENV{${name}})
    endif()
  endforeach()
endfunction()
