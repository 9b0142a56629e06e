# Build knobs: each one is a CMake cache variable (-DNAME=..., or
# `pip ... -C cmake.define.NAME=...`) that falls back to an environment
# variable of the same name, then to a default. Where a value came from is
# kept in global properties so the build info can say it.

include_guard(GLOBAL)

# vfa_option(NAME DEFAULT DOC [ENV_NAMES name...])
#   The first of: -DNAME, $ENV{NAME}, $ENV{<each ENV_NAMES>}, DEFAULT.
function(vfa_option name default doc)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "ENV_NAMES")
  set(origin "default")
  set(value "${default}")
  if(DEFINED ${name} AND NOT "${${name}}" STREQUAL "")
    set(value "${${name}}")
    set(origin "cmake")
  else()
    foreach(env_name IN ITEMS ${name} ${arg_ENV_NAMES})
      if(DEFINED ENV{${env_name}} AND NOT "$ENV{${env_name}}" STREQUAL "")
        set(value "$ENV{${env_name}}")
        set(origin "env:${env_name}")
        break()
      endif()
    endforeach()
  endif()
  set(${name} "${value}" PARENT_SCOPE)
  # Remembered globally so the build info can list every knob and its origin.
  get_property(names GLOBAL PROPERTY VFA_OPTION_NAMES)
  if(NOT name IN_LIST names)
    set_property(GLOBAL APPEND PROPERTY VFA_OPTION_NAMES ${name})
  endif()
  set_property(GLOBAL PROPERTY VFA_OPTION_VALUE_${name} "${value}")
  set_property(GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name} "${origin}")
endfunction()

# Normalise a user list: accepts "a,b c;d" and returns "a;b;c;d" in lower case.
function(vfa_normalize_list out_var)
  string(REPLACE "," ";" items "${ARGN}")
  string(REPLACE " " ";" items "${items}")
  string(TOLOWER "${items}" items)
  list(REMOVE_ITEM items "")
  list(REMOVE_DUPLICATES items)
  set(${out_var} "${items}" PARENT_SCOPE)
endfunction()

# Fail with a message that names the knob, the bad value and the allowed ones.
function(vfa_check_choices knob values allowed)
  foreach(item IN LISTS values)
    if(NOT item IN_LIST allowed)
      string(REPLACE ";" ", " allowed_text "${allowed}")
      message(FATAL_ERROR
        "${knob}: '${item}' is not a valid value. Valid values: ${allowed_text}.")
    endif()
  endforeach()
endfunction()

function(vfa_truthy out_var value)
  string(TOUPPER "${value}" upper)
  if(upper MATCHES "^(1|ON|YES|TRUE|Y)$")
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
  endif()
endfunction()
