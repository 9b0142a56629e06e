# What the resolution says when it is done: one message for every repository
# when any failed, and a warning when the two pins disagree.
# Part of cmake/UpstreamSources.cmake, which includes it.

include_guard(GLOBAL)

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
      string(APPEND text "ok (${VFA_${component}_ORIGIN}: ${VFA_${component}_FROM_DIR}); nothing to do.")
    endif()
  endforeach()
  vfa_url_secrets(text text "${text}")
  message(FATAL_ERROR "${text}")
endfunction()

# flash-attention records the CUTLASS it was developed against as a submodule.
# When both pins disagree, say so: the bump was likely half done.
function(vfa_check_cutlass_matches_submodule)
  # A hint only (a warning): the cache entry's git is read, never believed for what is compiled.
  if(NOT VFA_flash_attention_ORIGIN STREQUAL "source_dir" AND EXISTS "${VFA_flash_attention_FROM_DIR}/.git")
    vfa_find_git()
    vfa_git(line err -c "safe.directory=${VFA_flash_attention_FROM_DIR}" -C "${VFA_flash_attention_FROM_DIR}"
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
