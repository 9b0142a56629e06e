# Fetching the pinned commit into the source cache: a sparse, blob-filtered,
# depth-1 fetch into a private temporary folder, verified, then renamed into
# place; failures say whether the network or this machine's disk is the cause.
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

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

# Fetches the pinned commit of <component> from <url> into <dest>, under the
# entry's lock, in a private temporary folder renamed into place only once
# verified, so <dest> is never half-written. Stale temporary folders of the
# same entry (from a fetch that was killed) are removed first. Sets <origin_var>
# to what this process did: "fetched", or "cache" when another build fetched the
# entry while this one waited for the lock (then checked like any cache entry);
# <err_var> on failure, with what to do.
#   vfa_fetch_into_cache(cutlass https://github.com/NVIDIA/cutlass.git /cache/src/cutlass-62750a2b75c8 origin err)
#     ->  origin=fetched, err="", /cache/src/cutlass-62750a2b75c8 holds the verified checkout and its marker
function(vfa_fetch_into_cache component url dest origin_var err_var)
  set(${origin_var} "fetched" PARENT_SCOPE)
  set(commit "${VFA_PIN_${component}_COMMIT}")
  set(prefix ${VFA_${component}_PREFIX})
  vfa_shown_url(shown "${url}")
  get_filename_component(parent "${dest}" DIRECTORY)
  vfa_find_git()
  if(NOT GIT_EXECUTABLE)
    string(CONCAT message "git is needed to fetch ${component} but was not found. Install git, or set "
      "${prefix}_SRC_DIR to a checkout of commit ${commit}.")
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  # The cache must be writable to fetch into it (checked before the lock,
  # whose creation would fail with a less helpful message).
  vfa_cache_entry_lock(lock_file holder_file "${dest}")
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

  vfa_lock_cache_entry(err "${dest}" "fetching ${component} ${commit} from ${shown}")
  if(err)
    set(${err_var} "${err}" PARENT_SCOPE)
    return()
  endif()
  if(EXISTS "${dest}")
    # Another build fetched it while this one waited: this one takes it from the cache.
    message(STATUS "vendored-flash-attn: ${component} was fetched by another build while this one waited; "
      "using it from the cache")
    set(${origin_var} "cache" PARENT_SCOPE)
  else()
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
    endif()
  endif()
  vfa_unlock_cache_entry("${dest}")
  set(${err_var} "${err}" PARENT_SCOPE)
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

# The first contact with the remote "origin" of the checkout <dir>: `git ls-remote`,
# bounded by <limit> seconds (the knob <knob>), which must list a ref. Sets <out_var> to
# "" when it does, else to what is wrong and what to do: a server that accepted the
# connection and never answered, or one that answered without being a git repository.
# A repository without HEAD (some mirrors) is asked for its other refs before it is refused.
#   vfa_first_contact(failure /cache/src/fa-x.partial-1 60 VFA_FETCH_STALL_TIMEOUT http://mirror/fa.git
#                     flash_attention "If this machine cannot reach ...")  ->  "" (it listed HEAD)
function(vfa_first_contact out_var dir limit knob shown component offline_hint)
  set(${out_var} "" PARENT_SCOPE)
  vfa_bounded(bounded ${limit})
  math(EXPR backstop "${limit} + 30")
  foreach(refs IN ITEMS HEAD "")
    execute_process(
      COMMAND ${bounded} "${GIT_EXECUTABLE}" -c protocol.version=2 -c http.lowSpeedLimit=1000
              -c http.lowSpeedTime=${limit} -C "${dir}" ls-remote origin ${refs}
      RESULT_VARIABLE rc OUTPUT_VARIABLE listed ERROR_VARIABLE probe_err TIMEOUT ${backstop})
    vfa_stop_if_interrupted("${rc}" "reaching ${shown} for ${component}")
    if(NOT rc MATCHES "^[0-9]+$" OR rc EQUAL 124 OR probe_err MATCHES "Operation too slow|curl 28")
      set(${out_var} "${shown} accepted the connection but did not answer within ${knob}=${limit} s: a hung server or proxy. Raise ${knob} if it is only slow.\n${offline_hint}" PARENT_SCOPE)
      return()
    endif()
    if(NOT rc EQUAL 0 OR listed MATCHES "(^|\n)[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]")
      return()  # a ref, or an error the fetch reports in its own words
    endif()
  endforeach()
  string(CONCAT text "${shown} answered, but not as a git repository: it lists no branch, tag or HEAD "
    "(a web server that answers every path, a captive portal or proxy page, or a wrong path on a "
    "server that answers 200 for anything). Check the URL (${VFA_${component}_PREFIX}_MIRROR, or the "
    "pin's url); `git ls-remote <url>` must list the repository's refs.\n${offline_hint}")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

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
  # handshake, where git's low-speed limit does not apply yet. So is one that
  # answers but serves no git repository (a web server answering 200 to every
  # path, a captive portal): git reads its empty answer as a dumb-HTTP repository
  # without refs, and later steps (a partial clone's lazy fetches) would ask it
  # again and again until VFA_FETCH_TIMEOUT. Other errors are left to the fetch,
  # which says more.
  set(limit ${VFA_FETCH_STALL_TIMEOUT})
  set(knob VFA_FETCH_STALL_TIMEOUT)
  if(VFA_FETCH_TIMEOUT LESS limit)
    set(limit ${VFA_FETCH_TIMEOUT})
    set(knob VFA_FETCH_TIMEOUT)
  endif()
  vfa_first_contact(failure "${dir}" ${limit} ${knob} "${shown}" ${component} "${offline_hint}")
  if(failure)
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

  # The blobs the checkout writes (the files under the paths, and the files a cone checkout
  # takes from the folders above them), fetched by id in one bounded step, so the checkout needs no lazy fetch:
  # GIT_NO_LAZY_FETCH forbids it, as a partial clone's lazy fetch starts a new git for every
  # object it lacks, and a server that lists the commit and answers 200 to everything else
  # made that over a thousand processes in 10 s.
  # A cone checkout takes the files directly in each folder above a path too: a/ and a/b/ for a/b/c.
  set(above "")
  foreach(path IN LISTS VFA_PIN_${component}_PATHS)
    string(REGEX MATCHALL "[^/]+/" parts "${path}")  # a/b/c -> a/;b/
    set(folder "")
    foreach(part IN LISTS parts)
      string(APPEND folder "${part}")
      list(APPEND above "${folder}")
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES above)
  vfa_git(top err -C "${dir}" ls-tree "${commit}" -- . ${above})
  if(NOT err)
    vfa_git(below err -C "${dir}" ls-tree -r "${commit}" -- ${VFA_PIN_${component}_PATHS})
  endif()
  if(err)
    vfa_git_failure(failure "Could not list the files of ${component} commit ${commit} from ${shown}" "${err}"
      "${dir}" "${offline_hint}")
    vfa_checkout_failed()
  endif()
  string(REGEX MATCHALL "[0-7]+ blob [0-9a-f]+" blobs "${top}\n${below}")
  list(TRANSFORM blobs REPLACE "^[0-7]+ blob " "")
  list(REMOVE_DUPLICATES blobs)
  list(JOIN blobs "\n" wanted)
  file(WRITE "${dir}/.git/vfa-wanted-blobs" "${wanted}\n")
  set(VFA_GIT_INPUT_FILE "${dir}/.git/vfa-wanted-blobs")
  vfa_git(ignored err -C "${dir}" -c fetch.negotiationAlgorithm=noop fetch --quiet --no-tags --no-write-fetch-head
    --recurse-submodules=no --filter=blob:none --stdin origin)
  unset(VFA_GIT_INPUT_FILE)
  file(REMOVE "${dir}/.git/vfa-wanted-blobs")
  if(err)
    vfa_git_failure(failure "Could not fetch the files of ${component} commit ${commit} from ${shown}" "${err}"
      "${dir}" "${offline_hint}")
    vfa_checkout_failed()
  endif()
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
  vfa_compare_with_anchor(diff err "${dir}" ${component})
  if(err)
    set(failure "The fresh ${component} checkout in '${dir}' could not be checked: ${err}")
    vfa_checkout_failed()
  endif()
  if(diff)
    string(CONCAT failure "The fresh ${component} checkout in '${dir}' does not hash back to "
      "commit ${commit} (${diff}), as the pin's anchor records it: git rewrote files as it wrote them. Your git settings "
      "cannot (core.autocrlf, core.eol and attribute files of the user and the system are turned "
      "off for the fetch), so a filter, text/eol or working-tree-encoding rule in the repository's "
      "own .gitattributes did: check the pinned commit's .gitattributes.")
    vfa_checkout_failed()
  endif()
  # No credentials stay in the cache: nothing reads this remote again. Then
  # the config is readable again by every user of a shared cache.
  vfa_git(ignored err -C "${dir}" remote set-url origin "${shown}")
  file(CHMOD "${dir}/.git/config" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  # Written by CMake's JSON writer: a '\\' or '"' in a mirror's path stays readable.
  set(marker "{}")
  foreach(pair "name;${component}" "commit;${commit}" "tag;${tag}" "url;${shown}")
    list(POP_FRONT pair key)
    vfa_json_set_text(marker "${pair}" ${key})
  endforeach()
  file(WRITE "${dir}/${VFA_SOURCE_MARKER}" "${marker}\n")
  set(${err_var} "" PARENT_SCOPE)
endfunction()
