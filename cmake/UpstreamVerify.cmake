# Verifying a source tree: every file under the pin's `paths` must hash to the
# pinned commit's tree (vfa_compare_with_commit), for a cache entry (refused
# when it differs) and a local source directory (built with a loud warning);
# and the compile may only see verified folders (vfa_verified_include_dirs).
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

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

# What git's index entries cannot show, and the verification therefore looks for itself:
# entries git skips when it lists a folder (a fifo, socket or device, which a compile would
# open as a header: a fifo with a writer behind it feeds the compiler any bytes; a nested
# repository, whose files `git ls-files` leaves out and which could shadow a header such as
# cute/tensor.hpp on the include path). Paths relative to <dir>, one a list item.
#   vfa_unhashable_entries(found /cache/src/fa-617264c1c795 "hopper;csrc/common")
#     ->  "hopper/cute/.git;hopper/cuda_runtime.h" (a nested repository, a fifo)
function(vfa_unhashable_entries out_var dir paths)
  set(existing "")
  foreach(path IN LISTS paths)
    if(EXISTS "${dir}/${path}" OR IS_SYMLINK "${dir}/${path}")
      list(APPEND existing "${path}")
    endif()
  endforeach()
  set(found "")
  if(existing)
    # -P (the default): no link is followed; a linked folder shows up as a link, which
    # git lists and the comparison reports.
    execute_process(COMMAND find ${existing} "(" -name .git -prune -o ! -type f ! -type d ! -type l ")" -print
      WORKING_DIRECTORY "${dir}" OUTPUT_VARIABLE found ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
      TIMEOUT ${VFA_FETCH_TIMEOUT})
    string(REPLACE ";" "\\;" found "${found}")
    string(REPLACE "\n" ";" found "${found}")
  endif()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()

# Compares the files under the pin's paths in <dir> with the trees of <commit>.
# Sets <out_var> to "" when they are equal, else to a text such as
# "1 file changed (hopper/flash_api.cpp); 141 files missing (include/cutlass/gemm/..., and 136 more)",
# or <err_var> when git cannot tell (no such commit, not a checkout).
# Every entry is recorded as git records it -- a file's bytes as they are, with its mode
# (executable or not), a symlink as a link (mode 120000, the hash of its target's name,
# never of what it points to) -- by a git that reads no configuration
# (vfa_begin_isolated_git) into a throwaway index, then compared with the commit, mode
# included: a file replaced by a link to an identical copy elsewhere, or whose executable
# bit differs from the commit's, is a difference (a link would let a later edit of its
# target through; a199453 hashed through links and took every mode as 100644, which let
# both pass). No attribute of the checkout applies (the scratch repository's
# info/attributes, which outranks every .gitattributes, unsets text, eol, ident, filter
# and working-tree-encoding): no filter, end-of-line or encoding conversion, no command.
# Nothing is written into <dir>. An edit that keeps size and mtime is seen. Entries git
# cannot record (vfa_unhashable_entries) are differences too. The only git run with
# <dir>'s own config is `rev-parse`, which reads refs and runs no configured command.
#   vfa_compare_with_commit(diff err /cache/src/cutlass-62750a2b75c8 62750a2b... cutlass)
function(vfa_compare_with_commit out_var err_var dir commit component)
  set(paths ${VFA_PIN_${component}_PATHS})
  # Where the checkout keeps its objects: .git/objects, or for a worktree or a
  # submodule (a .git file) where git says.
  if(IS_DIRECTORY "${dir}/.git")
    set(objects "${dir}/.git/objects")
  else()
    vfa_git(common err -c "safe.directory=${dir}" -C "${dir}" rev-parse --git-common-dir)
    if(err)
      set(${out_var} "" PARENT_SCOPE)
      set(${err_var} "git could not compare its files with commit ${commit}: ${err}" PARENT_SCOPE)
      return()
    endif()
    get_filename_component(objects "${common}/objects" ABSOLUTE BASE_DIR "${dir}")
  endif()
  vfa_scratch_dir(scratch vfa-verify)
  vfa_begin_isolated_git("${scratch}" "${dir}" "${objects}")
  file(MAKE_DIRECTORY "${scratch}/info")
  file(WRITE "${scratch}/info/attributes" "* -text -eol -ident -filter -working-tree-encoding\n")
  set(git "${GIT_EXECUTABLE}")
  # Every entry under the paths (none is tracked in the empty index, so all are
  # "others", ignored ones included), NUL-separated; recorded as `git add` would,
  # without writing an object. Through a file: an execute_process pipe costs ~40 ms more.
  execute_process(COMMAND ${git} ls-files -z --others -- ${paths} WORKING_DIRECTORY "${dir}"
    OUTPUT_FILE "${scratch}/files" RESULT_VARIABLE rc ERROR_VARIABLE hash_err ERROR_STRIP_TRAILING_WHITESPACE
    TIMEOUT ${VFA_FETCH_TIMEOUT})
  if(rc EQUAL 0)
    execute_process(COMMAND ${git} update-index -z --add --info-only --stdin WORKING_DIRECTORY "${dir}"
      INPUT_FILE "${scratch}/files" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE hash_err
      ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT ${VFA_FETCH_TIMEOUT})
  endif()
  set(raw "")
  if(rc EQUAL 0)
    execute_process(
      COMMAND ${git} diff-index --cached --raw --no-renames "${commit}" -- ${paths} WORKING_DIRECTORY "${dir}"
      RESULT_VARIABLE rc OUTPUT_VARIABLE raw ERROR_VARIABLE hash_err
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE
      TIMEOUT ${VFA_FETCH_TIMEOUT})
  endif()
  vfa_end_isolated_git()
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
  set(linked "")
  set(moded "")
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
    elseif(new_mode STREQUAL "120000" AND NOT old_mode STREQUAL "120000")
      list(APPEND linked "${path}")
    elseif(same_blob)
      list(APPEND moded "${path}: ${new_mode}, not ${old_mode}")
    else()
      list(APPEND changed "${path}")
    endif()
  endforeach()
  vfa_unhashable_entries(unhashable "${dir}" "${paths}")
  set(parts "")
  foreach(kind changed missing added linked moded unhashable)
    if(${kind})
      list(LENGTH ${kind} n)
      vfa_few(few ${${kind}})
      set(files "files")
      if(n EQUAL 1)
        set(files "file")
      endif()
      set(what "${kind}")
      if(kind STREQUAL "linked")
        set(what "replaced by a symlink")
      elseif(kind STREQUAL "moded")
        set(what "with another mode than the commit's")
      elseif(kind STREQUAL "unhashable")
        set(what "that git cannot record: a fifo, socket, device or nested repository")
      endif()
      list(APPEND parts "${n} ${files} ${what} (${few})")
    endif()
  endforeach()
  string(JOIN "; " text ${parts})
  set(${out_var} "${text}" PARENT_SCOPE)
  set(${err_var} "" PARENT_SCOPE)
endfunction()

# The command that runs cmake/vfa_build/sources/source_anchor.py (the pin's anchor: what every pinned file is,
# vendor/flash-attention/anchor.json beside the pin), with the interpreter's standard library only.
#   vfa_anchor_command(cmd)  ->  /venv/bin/python;-E;-s;-S;<project>/cmake/vfa_build;sources.source_anchor
function(vfa_anchor_command out_var)
  vfa_script_python(python)
  if(NOT python)
    message(FATAL_ERROR "vendored-flash-attn: no Python found to verify the upstream sources against the "
      "pin's anchor (cmake/vfa_build/sources/source_anchor.py). Put python3 on PATH, or pass -DPython_EXECUTABLE=<python>.")
  endif()
  set(${out_var} "${python}" -E -s -S "${VFA_BUILD_PY}" sources.source_anchor PARENT_SCOPE)
endfunction()

# Compares the files under the pin's paths in <dir> with the anchor of <component> (hashed
# here, file by file; nothing of <dir>'s .git is read). Sets <out_var> to "" when equal, else to
# "1 file changed (hopper/flash_api.cpp); ..."; <err_var> when the anchor cannot be used.
#   vfa_compare_with_anchor(diff err /cache/src/flash-attention-617264c1c795.partial-x flash_attention)
function(vfa_compare_with_anchor out_var err_var dir component)
  vfa_anchor_command(anchor)
  execute_process(COMMAND ${anchor} compare --pin "${VFA_PIN_FILE}" --component ${component} --source "${dir}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE diff ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT ${VFA_FETCH_TIMEOUT})
  vfa_stop_if_interrupted("${rc}" "checking the files of '${dir}'")
  set(${out_var} "" PARENT_SCOPE)
  set(${err_var} "" PARENT_SCOPE)
  if(rc EQUAL 2)
    set(${out_var} "${diff}" PARENT_SCOPE)
  elseif(NOT rc EQUAL 0)
    set(${err_var} "${err}" PARENT_SCOPE)
  endif()
endfunction()

# Copies the anchored files of <component> from <dir> into the staged store (VFA_STAGED_SOURCES,
# a folder of this user's alone) at <store>/<dirname>-<anchor digest>, hashing what it writes and
# comparing with the anchor, renamed into place when equal; a copy already there is verified again
# (and made again when it changed). The build reads this copy only: nothing in <dir> (a shared,
# foreign-owned or world-writable cache entry included) is compiled, and what is compiled is the
# anchor's bytes. Sets <staged_var> to the copy, or <diff_var> to how <dir> differs from the
# anchor, or <err_var> to why nothing could be staged.
#   vfa_stage_sources(staged diff err flash_attention /cache/src/flash-attention-617264c1c795)
#     ->  staged=~/.cache/vendored-flash-attn/staged/flash-attention-491f75197587b816a5a010d6f31c1fd4
function(vfa_stage_sources staged_var diff_var err_var component dir)
  vfa_anchor_command(anchor)
  execute_process(COMMAND ${anchor} stage --pin "${VFA_PIN_FILE}" --component ${component} --source "${dir}"
      --store "${VFA_STAGED_SOURCES}" --name ${VFA_${component}_DIRNAME}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE TIMEOUT ${VFA_FETCH_TIMEOUT})
  vfa_stop_if_interrupted("${rc}" "staging the files of '${dir}'")
  set(${staged_var} "" PARENT_SCOPE)
  set(${diff_var} "" PARENT_SCOPE)
  set(${err_var} "" PARENT_SCOPE)
  if(rc EQUAL 0)
    string(JSON path GET "${out}" path)
    set(${staged_var} "${path}" PARENT_SCOPE)
  elseif(rc EQUAL 2)
    set(${diff_var} "${out}" PARENT_SCOPE)
  else()
    set(${err_var} "${err}" PARENT_SCOPE)
  endif()
endfunction()

# "" when <rel> is a plain relative path inside <component>'s tree under a folder of the
# pin's `paths` (no '.' or '..' part, no leading '/'), else what is wrong with it.
#   vfa_path_problem(problem flash_attention "csrc/flash_attn/..")  ->  "it has a '..' part, ..."
function(vfa_path_problem out_var component rel)
  set(problem "")
  if(NOT rel MATCHES "^[A-Za-z0-9_][A-Za-z0-9_./+-]*$" OR rel MATCHES "(^|/)\\.\\.?(/|$)" OR rel MATCHES "//")
    string(CONCAT problem "it is not a plain relative path inside the tree (a '.' or '..' part, a leading '/', "
      "an empty part or another character): '..' would reach files the source check does not cover")
  else()
    string(REPLACE ";" ", " paths "${VFA_PIN_${component}_PATHS}")
    string(CONCAT problem "it is not under ${component}.paths (${paths}) of the pin file "
      "'${VFA_PIN_FILE}', whose every file is checked against the pin's anchor")
    foreach(path IN LISTS VFA_PIN_${component}_PATHS)
      string(FIND "${rel}/" "${path}/" at)
      if(at EQUAL 0)
        set(problem "")
      endif()
    endforeach()
  endif()
  set(${out_var} "${problem}" PARENT_SCOPE)
endfunction()

# The absolute include directories <rel_dirs> of <component>'s resolved source tree (its
# staged copy when it matches the pin), each a plain relative path under a folder of the pin's
# `paths` and a folder of that tree: a folder above them (csrc/) or reached through '..' could
# hold files no check has seen, which would shadow a header of the same name found later on the
# include path (csrc/cutlass/numeric_types.h before CUTLASS's). Stops, naming <field> (the
# declaration's field that lists it) and the fix, when one is not.
#   vfa_verified_include_dirs(dirs flash_attention families.fa3.build.include_dirs hopper csrc/common)
#     ->  <staged>/flash-attention-491f7519.../hopper;<staged>/.../csrc/common
#   vfa_verified_include_dirs(dirs flash_attention families.fa2.build.include_dirs csrc/flash_attn/..)
#     ->  FATAL_ERROR "... families.fa2.build.include_dirs names 'csrc/flash_attn/..' ..."
function(vfa_verified_include_dirs out_var component field)
  set(root "${VFA_${component}_SOURCE_DIR}")
  set(dirs "")
  foreach(rel IN LISTS ARGN)
    vfa_path_problem(problem ${component} "${rel}")
    if(NOT problem AND NOT IS_DIRECTORY "${root}/${rel}")
      set(problem "'${root}/${rel}' is not a folder of the verified tree")
    endif()
    if(problem)
      message(FATAL_ERROR
        "The build would compile files nobody verified: ${field} names the include directory '${rel}' "
        "of ${component} ('${root}/${rel}'), but ${problem}. Fix ${field} in cmake/knobs.json (a folder "
        "under the pin's paths, as upstream's CMakeLists.txt names it), or add the folder to "
        "${component}.paths in the pin and write its anchor again (vendor/flash-attention/README.md).")
    endif()
    list(APPEND dirs "${root}/${rel}")
  endforeach()
  set(${out_var} "${dirs}" PARENT_SCOPE)
endfunction()

# The absolute paths of <family>'s sources <rels> (relative to the flash-attention tree), each
# a plain relative path under the pin's `paths` and a regular file of the tree the build reads:
# in the staged copy, exactly an anchored file. Stops naming <field> and the fix otherwise.
#   vfa_verified_sources_of(sources fa3 build.sources hopper/flash_api.cpp)  ->  <staged>/.../hopper/flash_api.cpp
function(vfa_verified_sources_of out_var family field)
  set(root "${VFA_flash_attention_SOURCE_DIR}")
  set(files "")
  foreach(rel IN LISTS ARGN)
    vfa_path_problem(problem flash_attention "${rel}")
    if(NOT problem AND (IS_SYMLINK "${root}/${rel}" OR NOT EXISTS "${root}/${rel}" OR IS_DIRECTORY "${root}/${rel}"))
      set(problem "it is not a file of the verified tree '${root}' (a file not in the pin's anchor)")
    endif()
    if(problem)
      message(FATAL_ERROR
        "The build would compile a file nobody verified: families.${family}.${field} names '${rel}', but "
        "${problem}. Fix families.${family}.${field} in cmake/knobs.json, or add its folder to "
        "flash_attention.paths in the pin and write its anchor again (vendor/flash-attention/README.md).")
    endif()
    list(APPEND files "${root}/${rel}")
  endforeach()
  set(${out_var} "${files}" PARENT_SCOPE)
endfunction()

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
      if(commit STREQUAL pinned)
        # The pinned commit: the anchor says what its files are (the checkout's own git is not
        # asked), and a tree that matches is built from its staged copy.
        # Compared first: a staged copy of the anchor that is there already says nothing of <dir>.
        vfa_compare_with_anchor(diff err "${dir}" ${component})
        if(NOT err AND NOT diff)
          vfa_stage_sources(staged diff err ${component} "${dir}")
        endif()
        if(err)
          set(${err_var} "${src_var}='${dir}' could not be checked against the pin's anchor: ${err}" PARENT_SCOPE)
          return()
        endif()
      else()
        vfa_compare_with_commit(diff err "${dir}" "${commit}" ${component})
      endif()
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
  if(matches)
    set(VFA_${component}_SOURCE_DIR "${staged}" PARENT_SCOPE)
  endif()
  set(VFA_${component}_FROM_DIR "${dir}" PARENT_SCOPE)
  set(VFA_${component}_COMMIT "${commit}" PARENT_SCOPE)
  set(VFA_${component}_MATCHES_PIN ${matches} PARENT_SCOPE)
  set(VFA_${component}_VERIFIED ${verified} PARENT_SCOPE)
  set(VFA_${component}_DIRTY "${dirty}" PARENT_SCOPE)
  set(VFA_${component}_ORIGIN "source_dir" PARENT_SCOPE)
  set(VFA_${component}_URL "" PARENT_SCOPE)
endfunction()

# Checks a cache entry: its marker names the pinned commit and its content
# equals the pin's anchor, staged (vfa_stage_sources). Sets <url_var> to the URL it was
# fetched from and <staged_var> to the staged copy, or <err_var> to why it is refused and how
# to fix it. Reads the entry only; writes only into the staged store.
#   vfa_check_cached(cutlass /cache/src/cutlass-62750a2b75c8 url staged err)
#     ->  url=https://github.com/NVIDIA/cutlass.git, err="" (or "The cached cutlass
#         checkout '...' does not hold commit ...: 1 file changed (...). ... Remove that folder ...")
function(vfa_check_cached component dest url_var staged_var err_var)
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
  # Its content: copied into the staged store, hashed and compared with the anchor as it is
  # copied (nothing of the entry's .git is believed); the build reads that copy only.
  vfa_stage_sources(staged diff err ${component} "${dest}")
  if(err)
    set(${err_var} "The cached ${component} checkout '${dest}' could not be staged: ${err}" PARENT_SCOPE)
    return()
  endif()
  if(diff)
    # Two things can disagree: the entry (edited after the fetch) or the anchor (written for
    # another commit or paths, or its digests edited), and removing the entry helps only in the
    # first case. The entry's own git is asked which one it looks like: never believed for the
    # build (a forged .git can agree with forged files), only to say which causes fit.
    get_filename_component(anchor_file "${VFA_PIN_FILE}" DIRECTORY)
    set(anchor_file "${anchor_file}/anchor.json")
    set(rewrite "python cmake/vfa_build sources.source_anchor anchor --pin '${VFA_PIN_FILE}'")
    set(own_git_agrees FALSE)
    vfa_find_git()
    if(GIT_EXECUTABLE)
      vfa_compare_with_commit(git_diff git_err "${dest}" "${commit}" ${component})
      if(NOT git_err AND NOT git_diff)
        set(own_git_agrees TRUE)
      endif()
    endif()
    string(CONCAT message "The cached ${component} checkout '${dest}' does not hold commit ${commit} "
      "unmodified as the pin's anchor '${anchor_file}' records it: ${diff}. ")
    if(own_git_agrees)
      # Not "likely" either way: a forged .git (tests/build/test_sources.py) agrees as well.
      string(CONCAT message "${message}Its files are what its own git records for ${commit}, so one of "
        "two is wrong. The anchor, if it does not describe that commit (a pin bump whose anchor was not "
        "written again, or its digests edited): a new fetch would hold the same files; write it again from "
        "a fresh fetch with ${rewrite} (vendor/flash-attention/README.md) and review its diff. Or the entry, "
        "if its files and its git were edited after the fetch (the anchor unchanged in this repository): ${fix}")
    else()
      string(CONCAT message "${message}Something edited it after the fetch. ${fix} If a fresh fetch "
        "differs the same way, the anchor is what disagrees: write it again with ${rewrite} "
        "(vendor/flash-attention/README.md), and review its diff.")
    endif()
    set(${err_var} "${message}" PARENT_SCOPE)
    return()
  endif()
  set(${staged_var} "${staged}" PARENT_SCOPE)
  # Unmodified, but the pin asks for files its commit does not have.
  vfa_pin_commit_lacks_files(problem ${component} "${dest}")
  if(problem)
    set(${err_var} "${problem}" PARENT_SCOPE)
    return()
  endif()
  vfa_shown_url(url "${url}")
  set(${url_var} "${url}" PARENT_SCOPE)
endfunction()
