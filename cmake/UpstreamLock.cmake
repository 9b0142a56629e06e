# The per-entry lock of the source cache: builds side by side share the cache,
# one fetches an entry while the others wait, saying for whom, and not forever.
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

# The lock of the cache entry <dest>: its sidecar <parent>/.<name>.lock and,
# beside it, the .holder file that says who holds it.
#   vfa_cache_entry_lock(lock holder /cache/src/cutlass-62750a2b75c8)
#     ->  /cache/src/.cutlass-62750a2b75c8.lock, /cache/src/.cutlass-62750a2b75c8.holder
function(vfa_cache_entry_lock lock_var holder_var dest)
  get_filename_component(parent "${dest}" DIRECTORY)
  get_filename_component(name "${dest}" NAME)
  set(${lock_var} "${parent}/.${name}.lock" PARENT_SCOPE)
  set(${holder_var} "${parent}/.${name}.holder" PARENT_SCOPE)
endfunction()

# Takes the lock of the cache entry <dest> for this process. Builds running side
# by side share the cache: one fetches, the others wait, saying for whom, and not
# forever (VFA_SOURCE_LOCK_TIMEOUT). <doing> goes into the .holder file for whoever
# waits next (the lock file itself cannot hold it: writing it would release the
# lock). Held until vfa_unlock_cache_entry(<dest>) or the process ends.
# <err_var>: "" once held, else why not and what to do.
#   vfa_lock_cache_entry(err /cache/src/cutlass-62750a2b75c8 "fetching cutlass 62750a2b... from https://...")
#     ->  err="", and .cutlass-62750a2b75c8.holder says "pid 4242 on host ci-7 since
#         2026-12-01T09:30:00Z (fetching cutlass ...)"
function(vfa_lock_cache_entry err_var dest doing)
  vfa_cache_entry_lock(lock_file holder_file "${dest}")
  set(holder "another build (it did not say who)")
  file(LOCK "${lock_file}" GUARD PROCESS TIMEOUT 0 RESULT_VARIABLE lock_result)
  if(NOT lock_result STREQUAL "0")
    if(EXISTS "${holder_file}")
      file(READ "${holder_file}" holder)
      string(STRIP "${holder}" holder)
    endif()
    message(STATUS "vendored-flash-attn: waiting up to ${VFA_SOURCE_LOCK_TIMEOUT} s "
      "(VFA_SOURCE_LOCK_TIMEOUT) for '${lock_file}', held by ${holder}")
    file(LOCK "${lock_file}" GUARD PROCESS TIMEOUT ${VFA_SOURCE_LOCK_TIMEOUT} RESULT_VARIABLE lock_result)
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
  execute_process(COMMAND sh -c "echo $PPID" OUTPUT_VARIABLE pid OUTPUT_STRIP_TRAILING_WHITESPACE)
  cmake_host_system_information(RESULT host QUERY HOSTNAME)
  string(TIMESTAMP now "%Y-%m-%dT%H:%M:%SZ" UTC)
  file(WRITE "${holder_file}" "pid ${pid} on host ${host} since ${now} (${doing})\n")
  set(${err_var} "" PARENT_SCOPE)
endfunction()

# Releases what vfa_lock_cache_entry(<dest>) took.
#   vfa_unlock_cache_entry(/cache/src/cutlass-62750a2b75c8)
function(vfa_unlock_cache_entry dest)
  vfa_cache_entry_lock(lock_file holder_file "${dest}")
  file(LOCK "${lock_file}" RELEASE)
endfunction()
