# Build knobs, declared once in cmake/knobs.json (type, default, allowed values,
# environment names, one line of doc; how to add one: the "about" lines there).
# This file reads that declaration; cmake/vfa_build/knobs/knobs.py makes the README tables and
# cibuildwheel's environment-pass from the same file.
#
# A knob's value is the first of
#   -DNAME=VALUE (pip: -C cmake.define.NAME=VALUE)     origin "cmake"
#   $ENV{NAME}, then each of its declared "env" names  origin "env:<that name>"
#   its declared default                               origin "default"
# given to THIS configure; an empty or blank value counts as not given. A -D value
# is taken out of the CMake cache as soon as it is read: a knob must not stick to
# a build dir, or a refused typo would come back in the next build, and a preset
# given once would silently outlive a later VFA_PRESET in the environment. (CMake's
# own -D stickiness is what pip's `-C cmake.define` and a rerun of CMake by ninja
# would otherwise inherit; the latter now falls back to the environment and the
# default, and says so.)
#
# Every value is checked against its declaration and normalised: bool -> ON/OFF,
# tristate -> auto/on/off, choice -> lower case, list -> the declared order
# (";"-separated, or "none"), int -> plain digits within min..max, path -> absolute
# (relative to the project root, the same in a configure and in
# `cmake -P cmake/fetch_sources.cmake`). A malformed value stops the configure with
# a message naming the knob, the value, where it came from and what is allowed.
#
#   vfa_read_knobs()                  resolve every "build" knob (start of a configure)
#   vfa_option(VFA_PRESET)            -> VFA_PRESET = "full", or what was given
#   vfa_option(VFA_BUILD_MEMORY_MB DEFAULT 24000)
#                                     a default computed by the caller, for a knob
#                                     declared with "default": ""
#   vfa_check_unknown_settings()      VFA_* variables in the environment or on the
#                                     command line that no knob declares: stop with
#                                     the closest declared name (a loud warning with
#                                     VFA_ALLOW_UNKNOWN_SETTINGS=ON)

# One file over 500 lines, on purpose: one reader of knobs.json (lookup, checks, normalisation,
# origins) whose parts all work on the same declaration.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

get_filename_component(_vfa_project_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set_property(GLOBAL PROPERTY VFA_KNOBS_PROJECT_DIR "${_vfa_project_dir}")
set_property(GLOBAL PROPERTY VFA_KNOBS_FILE "${CMAKE_CURRENT_LIST_DIR}/knobs.json")
file(READ "${CMAKE_CURRENT_LIST_DIR}/knobs.json" _vfa_knobs_json)
# A declaration that does not parse stops here, as what it is: every lookup below would
# otherwise fail as "not declared" and name the wrong fix.
string(JSON _vfa_knobs_type ERROR_VARIABLE _vfa_knobs_err TYPE "${_vfa_knobs_json}")
if(_vfa_knobs_err OR NOT _vfa_knobs_type STREQUAL "OBJECT")
  # CMake's error quotes the whole file: keep where and what.
  string(REGEX MATCH "Line [0-9]+, Column [0-9]+[ \t\r\n]+[^\r\n]+" _vfa_knobs_where "${_vfa_knobs_err}")
  string(REGEX REPLACE "[ \t\r\n]+" " " _vfa_knobs_where "${_vfa_knobs_where}")
  if(NOT _vfa_knobs_where)
    set(_vfa_knobs_where "its top level is ${_vfa_knobs_type}, not an object")
  endif()
  message(FATAL_ERROR "${CMAKE_CURRENT_LIST_DIR}/knobs.json does not parse as a JSON object "
    "(${_vfa_knobs_where}): fix the file there, or restore it from the repository.")
endif()
unset(_vfa_knobs_type)
unset(_vfa_knobs_err)
set_property(GLOBAL PROPERTY VFA_KNOBS_JSON "${_vfa_knobs_json}")
unset(_vfa_knobs_json)
unset(_vfa_project_dir)

# The declaration of <name> as a JSON object, or a stop naming the file to edit.
#   vfa_knob_declaration(decl VFA_PRESET)  ->  {"type": "choice", "choices": ["full", "minimal"], ...}
function(vfa_knob_declaration out_var name)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON decl ERROR_VARIABLE err GET "${json}" knobs ${name})
  if(err)
    get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
    message(FATAL_ERROR
      "vfa_option(${name}): ${name} is not declared in ${file}. Add one entry for it "
      "there (type, default, scope, cibuildwheel, doc: see the file's \"about\" lines) "
      "and run `python cmake/vfa_build knobs.knobs write`.")
  endif()
  set(${out_var} "${decl}" PARENT_SCOPE)
endfunction()

# <field> of a declaration, or <fallback> when it has none. Lists come back as
# CMake lists.
#   vfa_knob_field(choices "${decl}" choices "")  ->  "full;minimal"
#   vfa_knob_field(record "${decl}" record ON)    ->  ON (the field is not there)
function(vfa_knob_field out_var decl field fallback)
  string(JSON type ERROR_VARIABLE err TYPE "${decl}" ${field})
  if(err)
    set(${out_var} "${fallback}" PARENT_SCOPE)
  elseif(type STREQUAL "ARRAY")
    string(JSON count LENGTH "${decl}" ${field})
    set(items "")
    if(count GREATER 0)
      math(EXPR last "${count} - 1")
      foreach(i RANGE ${last})
        string(JSON item GET "${decl}" ${field} ${i})
        list(APPEND items "${item}")
      endforeach()
    endif()
    set(${out_var} "${items}" PARENT_SCOPE)
  else()
    string(JSON value GET "${decl}" ${field})
    set(${out_var} "${value}" PARENT_SCOPE)
  endif()
endfunction()

# Joins <items> as a sentence lists them, into <out_var>: "A", "A and B", "A, B and C" (the
# build's messages name families, archs and generations this way).
#   vfa_join_words(text "9.x;10.x;11.x")  ->  text="9.x, 10.x and 11.x"
#   vfa_join_words(text "FA2 (off)")      ->  text="FA2 (off)"
function(vfa_join_words out_var items)
  list(POP_BACK items final)
  list(JOIN items ", " text)
  if(NOT text STREQUAL "")
    string(APPEND text " and ")
  endif()
  set(${out_var} "${text}${final}" PARENT_SCOPE)
endfunction()

# Splits <record> at the first <separator> into the two parts: the text before it into
# <key_var>, the text after it into <value_var> (a record without <separator>: all of it the key,
# the value ""). The one reader of the build's "key<separator>value" records: a family's
# "cap=knob" SASS knobs, "env:NAME" / "cmake:NAME" unknown settings, "NAME=SUGGESTION" pairs.
#   vfa_split_record(cap knob "9.0=VFA_FA2_SM90_SASS" "=")  ->  cap=9.0, knob=VFA_FA2_SM90_SASS
#   vfa_split_record(kind name "env:VFA_PRESTE" ":")        ->  kind=env, name=VFA_PRESTE
#   vfa_split_record(name value "arch=a=b" "=")             ->  name=arch, value=a=b
function(vfa_split_record key_var value_var record separator)
  string(FIND "${record}" "${separator}" at)
  if(at EQUAL -1)
    set(${key_var} "${record}" PARENT_SCOPE)
    set(${value_var} "" PARENT_SCOPE)
    return()
  endif()
  string(SUBSTRING "${record}" 0 ${at} key)
  string(LENGTH "${separator}" length)
  math(EXPR after "${at} + ${length}")
  string(SUBSTRING "${record}" ${after} -1 value)
  set(${key_var} "${key}" PARENT_SCOPE)
  set(${value_var} "${value}" PARENT_SCOPE)
endfunction()

# The kernel families, declared once in cmake/knobs.json ("families": what each is and
# how it is built or packaged; python/vendored_flash_attn/declaration/families.py reads the same
# section for the package). The build's generic code iterates these instead of naming
# FA2/FA3/FA4: every compiled family goes through one target function (cmake/FamilyTarget.cmake),
# and only a packaged family's own cmake/<NAME>Package.cmake knows its family. Names come in name order (CMake's JSON reader keeps an object's
# members sorted), optionally only those made as <made> ("extension": a CUDA extension
# this build compiles).
#   vfa_declared_families(names)             ->  fa2;fa3;fa4
#   vfa_declared_families(names extension)   ->  fa2;fa3
function(vfa_declared_families out_var)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON count LENGTH "${json}" families)
  math(EXPR last "${count} - 1")
  set(names "")
  foreach(i RANGE ${last})
    string(JSON name MEMBER "${json}" families ${i})
    string(JSON type TYPE "${json}" families ${name})
    if(NOT type STREQUAL "OBJECT")
      continue()  # "about", "default_order": the section's own fields
    endif()
    string(JSON made GET "${json}" families ${name} made)
    if(ARGC EQUAL 1 OR made STREQUAL "${ARGV1}")
      list(APPEND names ${name})
    endif()
  endforeach()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

# <field> of family <name>'s declaration, as vfa_knob_field reads it (a list as a CMake
# list, null as "", <fallback> when the field is absent); a family not declared stops.
#   vfa_family_field(module fa2 module "")            ->  _vendored_fa2_C
#   vfa_family_field(min fa3 "capabilities;min" "")   ->  9.0
function(vfa_family_field out_var name field fallback)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON decl ERROR_VARIABLE err GET "${json}" families ${name})
  if(err)
    get_property(file GLOBAL PROPERTY VFA_KNOBS_FILE)
    message(FATAL_ERROR "vfa_family_field(${name}): no family '${name}' is declared in ${file} (\"families\").")
  endif()
  vfa_knob_field(value "${decl}" "${field}" "${fallback}")
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

# The bool words, declared once in cmake/knobs.json ("bool_words"): VFA_BOOL_WORDS_ON,
# VFA_BOOL_WORDS_OFF and, for messages, VFA_BOOL_WORDS_TEXT ("ON/OFF, 1/0, ... (any case)").
get_property(_vfa_knobs_json GLOBAL PROPERTY VFA_KNOBS_JSON)
vfa_knob_field(VFA_BOOL_WORDS_ON "${_vfa_knobs_json}" "bool_words;on" "")
vfa_knob_field(VFA_BOOL_WORDS_OFF "${_vfa_knobs_json}" "bool_words;off" "")
set(VFA_BOOL_WORDS_TEXT "")
foreach(_vfa_on _vfa_off IN ZIP_LISTS VFA_BOOL_WORDS_ON VFA_BOOL_WORDS_OFF)
  list(APPEND VFA_BOOL_WORDS_TEXT "${_vfa_on}/${_vfa_off}")
endforeach()
list(JOIN VFA_BOOL_WORDS_TEXT ", " VFA_BOOL_WORDS_TEXT)
string(APPEND VFA_BOOL_WORDS_TEXT " (any case)")
unset(_vfa_on)
unset(_vfa_off)
unset(_vfa_knobs_json)

# Stops with the knob, the value, where it came from and what would be accepted.
#   vfa_knob_refuse(VFA_FA2_PTX enable env:VFA_FA2_PTX "ON/OFF, ...")  ->  stops with
#   "VFA_FA2_PTX: 'enable' is not a valid value (from the environment variable
#    VFA_FA2_PTX). Valid values: ON/OFF, ..."
function(vfa_knob_refuse name value origin allowed)
  _vfa_knob_where(where ${name} "${origin}")
  message(FATAL_ERROR "${name}: '${value}' is not a valid value (${where}). Valid values: ${allowed}.")
endfunction()

# Where a knob's value came from, in words, for its messages.
#   _vfa_knob_where(w VFA_FA2_PTX env:VFA_FA2_PTX)  ->  "from the environment variable VFA_FA2_PTX"
function(_vfa_knob_where out_var name origin)
  if(origin STREQUAL "cmake")
    set(where "given as -D${name} (pip: -C cmake.define.${name})")
  elseif(origin MATCHES "^env:(.*)$")
    set(where "from the environment variable ${CMAKE_MATCH_1}")
  else()
    # Declared defaults are checked by tests/unit/test_knob_declaration.py; this is one computed here.
    set(where "the default this build computed; set ${name}")
  endif()
  set(${out_var} "${where}" PARENT_SCOPE)
endfunction()

# Checks and normalises <value> of the knob declared as <decl>; a value that is
# not valid stops (vfa_knob_refuse, naming <origin>). "" stays "" (not set).
#   vfa_knob_normalize(v VFA_FA2_PTX "${decl}" "yes" cmake)              ->  ON
#   vfa_knob_normalize(v VFA_FA3_HEAD_DIMS "${decl}" "256, 64" cmake)    ->  64;256
#   vfa_knob_normalize(v VFA_SOURCE_CACHE "${decl}" "../cache" default)  ->  <project>/../cache
function(vfa_knob_normalize out_var name decl value origin)
  vfa_knob_field(type "${decl}" type "")
  vfa_knob_field(choices "${decl}" choices "")
  string(STRIP "${value}" value)
  if(value STREQUAL "")
    set(${out_var} "" PARENT_SCOPE)
    return()
  endif()
  string(TOUPPER "${value}" upper)
  if(type STREQUAL "bool" OR type STREQUAL "tristate")
    if(upper IN_LIST VFA_BOOL_WORDS_ON)
      set(result ON)
    elseif(upper IN_LIST VFA_BOOL_WORDS_OFF)
      set(result OFF)
    elseif(type STREQUAL "tristate" AND upper STREQUAL "AUTO")
      set(result auto)
    else()
      set(allowed "${VFA_BOOL_WORDS_TEXT}")
      if(type STREQUAL "tristate")
        set(allowed "auto, or ${allowed}")
      endif()
      vfa_knob_refuse(${name} "${value}" "${origin}" "${allowed}")
    endif()
    if(type STREQUAL "tristate")
      string(TOLOWER "${result}" result)
    endif()
  elseif(type STREQUAL "int")
    vfa_knob_field(min "${decl}" min "")
    vfa_knob_field(max "${decl}" max "")
    # Compared as text first: CMake's integers are 64-bit, so a 20-digit value
    # must be refused before any arithmetic sees it.
    string(REGEX REPLACE "^0+([0-9])" "\\1" digits "${value}")
    string(LENGTH "${digits}" n)
    string(LENGTH "${max}" max_n)
    if(NOT digits MATCHES "^[0-9]+$" OR n GREATER max_n OR digits LESS min OR digits GREATER max)
      vfa_knob_refuse(${name} "${value}" "${origin}" "an integer from ${min} to ${max}")
    endif()
    set(result "${digits}")
  elseif(type STREQUAL "choice")
    string(TOLOWER "${value}" lower)
    if(NOT lower IN_LIST choices)
      string(REPLACE ";" ", " allowed "${choices}")
      vfa_knob_refuse(${name} "${value}" "${origin}" "${allowed}")
    endif()
    set(result "${lower}")
  elseif(type STREQUAL "list")
    # "64,96 128;192" -> "64;96;128;192", in the declared order so that equal
    # selections give equal builds.
    string(TOLOWER "${value}" items)
    string(REGEX REPLACE "[ ,;]+" ";" items "${items}")
    list(REMOVE_ITEM items "")
    string(REPLACE ";" ", " allowed "${choices}")
    set(allowed "any of ${allowed} (separated by commas, semicolons or spaces), or none")
    if(items STREQUAL "none")
      set(result "none")
    else()
      foreach(item IN LISTS items)
        if(NOT item IN_LIST choices AND NOT item STREQUAL "none")
          vfa_knob_refuse(${name} "${item}" "${origin}" "${allowed}")
        endif()
      endforeach()
      if("none" IN_LIST items)
        # "none,paged": each word is valid alone, but none means no item at all.
        _vfa_knob_where(where ${name} "${origin}")
        set(others "${items}")
        list(REMOVE_ITEM others "none")
        list(JOIN others ", " others)
        message(FATAL_ERROR
          "${name}: '${value}' mixes none with ${others} (${where}). none stands alone: it selects no item, "
          "so it cannot be combined with others. Give ${name}=none alone, or only the items you want "
          "(${others}).")
      endif()
      set(result "")
      foreach(choice IN LISTS choices)
        if(choice IN_LIST items)
          list(APPEND result "${choice}")
        endif()
      endforeach()
    endif()
  elseif(type STREQUAL "path")
    # Only a shell expands '~', and not inside -C cmake.define.NAME=~/x: taken as a
    # relative path it would be a folder named '~' in the project. Refused instead.
    #   VFA_SOURCE_CACHE=~/cache  ->  stops: "... write '/home/me/cache'"
    if(value MATCHES "^~")
      set(meant "the full path")
      if(value MATCHES "^~(/.*)?$" AND DEFINED ENV{HOME})
        set(meant "'$ENV{HOME}${CMAKE_MATCH_1}'")
      endif()
      vfa_knob_refuse(${name} "${value}" "${origin}"
        "a path; a leading '~' is expanded only by a shell, not here: write ${meant}")
    endif()
    get_property(project_dir GLOBAL PROPERTY VFA_KNOBS_PROJECT_DIR)
    get_filename_component(result "${value}" ABSOLUTE BASE_DIR "${project_dir}")
    # The staged store holds the build's verified copy of the sources (about 90 MB), a folder
    # of the building user's alone: taken relative to the project it would land inside the
    # checkout (and pip's source tree) with no word. Refused, naming the absolute path meant;
    # a relative path that leads out of the project (../stores/x) still means <project>/../stores/x.
    #   VFA_STAGED_SOURCES=staged  ->  stops: "... Write an absolute path (e.g. '<project>/staged' ...)"
    set(inside OFF)
    if(NOT IS_ABSOLUTE "${value}")
      cmake_path(IS_PREFIX project_dir "${result}" NORMALIZE inside)
    endif()
    if(name STREQUAL "VFA_STAGED_SOURCES" AND inside)
      _vfa_knob_where(where ${name} "${origin}")
      message(FATAL_ERROR
        "${name}: '${value}' is a relative path (${where}). It would put the staged copy of the sources "
        "(about 90 MB) at '${result}', inside the project folder '${project_dir}'. Write an absolute path "
        "(e.g. '${result}' if that is what you meant), or leave ${name} unset for the default "
        "(~/.cache/vendored-flash-attn/staged).")
    endif()
  elseif(type STREQUAL "string")
    set(result "${value}")
  else()
    message(FATAL_ERROR "cmake/knobs.json: ${name} has an unknown type '${type}'.")
  endif()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# vfa_option(<name> [DEFAULT <computed default>]): sets <name> in the caller.
function(vfa_option name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "DEFAULT" "")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
      "vfa_option(${name} ${arg_UNPARSED_ARGUMENTS}): defaults and docs live in cmake/knobs.json "
      "now; call vfa_option(${name}) and declare the knob there.")
  endif()
  vfa_knob_declaration(decl ${name})
  vfa_knob_field(declared_default "${decl}" default "")

  get_property(resolved GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name} SET)
  if(resolved)
    # Read once per configure: a -D value is gone from the cache after the first read.
    get_property(value GLOBAL PROPERTY VFA_OPTION_VALUE_${name})
    get_property(origin GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name})
  else()
    set(origin "default")
    set(value "")
    # A blank value is no value: "VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION= " must mean the
    # default (ON), not an empty value that skips the default and reads as OFF.
    if(DEFINED CACHE{${name}})
      string(STRIP "$CACHE{${name}}" given)
      # Read it through ${} too: that is what tells CMake a -D variable was used.
      set(_vfa_mark_used "${${name}}")
      unset(${name} CACHE)
      if(NOT given STREQUAL "")
        set(value "${given}")
        set(origin "cmake")
      endif()
    endif()
    if(origin STREQUAL "default")
      vfa_knob_field(env_names "${decl}" env "")
      foreach(env_name IN ITEMS ${name} ${env_names})
        string(STRIP "$ENV{${env_name}}" given)
        if(NOT given STREQUAL "")
          set(value "${given}")
          set(origin "env:${env_name}")
          break()
        endif()
      endforeach()
    endif()
    if(origin STREQUAL "default")
      set(value "${declared_default}")
    endif()
    vfa_knob_normalize(value ${name} "${decl}" "${value}" "${origin}")
    get_property(names GLOBAL PROPERTY VFA_OPTION_NAMES)
    if(NOT name IN_LIST names)
      set_property(GLOBAL APPEND PROPERTY VFA_OPTION_NAMES ${name})
    endif()
  endif()

  if(DEFINED arg_DEFAULT)
    if(NOT declared_default STREQUAL "")
      message(FATAL_ERROR
        "vfa_option(${name} DEFAULT ...): cmake/knobs.json declares the default "
        "'${declared_default}'; a computed default is only for knobs declared with \"default\": \"\".")
    endif()
    if(origin STREQUAL "default")
      vfa_knob_normalize(value ${name} "${decl}" "${arg_DEFAULT}" "default")
      # A reading of this machine (its memory, say): the wheel's build info leaves it out.
      set_property(GLOBAL PROPERTY VFA_OPTION_COMPUTED_${name} TRUE)
    endif()
  endif()
  set_property(GLOBAL PROPERTY VFA_OPTION_VALUE_${name} "${value}")
  set_property(GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name} "${origin}")
  set(${name} "${value}" PARENT_SCOPE)
endfunction()

# Where <name>'s value came from: cmake, env:<NAME> or default.
#   vfa_option_origin(origin VFA_PRESET)  ->  env:VFA_PRESET
function(vfa_option_origin out_var name)
  get_property(origin GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name})
  set(${out_var} "${origin}" PARENT_SCOPE)
endfunction()

# The declared knobs of one scope (build, version, runtime, ci, benchmark), or all
# (scope ""), sorted by name (CMake's JSON reader keeps an object's members sorted).
#   vfa_declared_knobs(names version)  ->  VFA_CUDA_MAJOR;VFA_VERSION_LOCAL
function(vfa_declared_knobs out_var scope)
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  string(JSON count LENGTH "${json}" knobs)
  math(EXPR last "${count} - 1")
  set(names "")
  foreach(i RANGE ${last})
    string(JSON name MEMBER "${json}" knobs ${i})
    string(JSON knob_scope GET "${json}" knobs ${name} scope)
    if(scope STREQUAL "" OR knob_scope STREQUAL scope)
      list(APPEND names ${name})
    endif()
  endforeach()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

# Resolves and checks every "build" knob, so a malformed one stops the configure in
# its first second whether or not this build reads it, and the build info can list
# them all. Sets each one in the caller.
macro(vfa_read_knobs)
  vfa_declared_knobs(_vfa_build_knobs build)
  foreach(_vfa_knob IN LISTS _vfa_build_knobs)
    vfa_option(${_vfa_knob})
  endforeach()
  vfa_note_dropped_cmake_knobs()
  unset(_vfa_knob)
  unset(_vfa_build_knobs)
endmacro()

# A knob the previous configure of this build dir got as -D, and this one did not,
# now comes from the environment or its default: say so, since a rerun of CMake by
# the build tool (after a CMake file changed) looks like that too.
function(vfa_note_dropped_cmake_knobs)
  set(now "")
  get_property(names GLOBAL PROPERTY VFA_OPTION_NAMES)
  foreach(name IN LISTS names)
    get_property(origin GLOBAL PROPERTY VFA_OPTION_ORIGIN_${name})
    get_property(value GLOBAL PROPERTY VFA_OPTION_VALUE_${name})
    if(origin STREQUAL "cmake")
      list(APPEND now "${name}")
    elseif(name IN_LIST VFA_LAST_CMAKE_KNOBS)
      message(WARNING
        "${name} was given as -D${name} to the previous configure of this build dir, but "
        "not to this one, so it is now '${value}' (${origin}). Knobs do not carry over "
        "between configures: give -D${name} again to keep the earlier value.")
    endif()
  endforeach()
  set(VFA_LAST_CMAKE_KNOBS "${now}" CACHE INTERNAL "knobs the last configure got as -D")
endfunction()

# VFA_* settings no knob declares: environment variables, and -D variables of any
# type (-DVFA_FA2_PTXX:BOOL=OFF too; the project's own cache entries are INTERNAL,
# or declared under "cache_variables" in cmake/knobs.json). Each is named with the
# closest declared name (Python's difflib, through cmake/vfa_build/knobs/knobs.py), is recorded for
# the build info, and a -D one is taken out of the cache like a knob. They stop the
# configure: a typo changes what gets built (VFA_PRESTE=minimal builds the full
# preset, hours instead of minutes), and pip shows a build's output only when it
# fails, so a warning would reach nobody who did not pass -v. With
# VFA_ALLOW_UNKNOWN_SETTINGS=ON (an environment that sets VFA_* variables of its own)
# they get a loud warning instead.
#   VFA_PRESTE=minimal in the environment  ->  " VFA_PRESTE (environment variable)
#   is not a knob of this project: did you mean VFA_PRESET?"
function(vfa_check_unknown_settings)
  vfa_option(VFA_ALLOW_UNKNOWN_SETTINGS)
  vfa_declared_knobs(declared "")
  foreach(name IN LISTS declared)
    vfa_knob_declaration(decl ${name})
    vfa_knob_field(env_names "${decl}" env "")
    list(APPEND declared ${env_names})
  endforeach()
  get_property(json GLOBAL PROPERTY VFA_KNOBS_JSON)
  vfa_knob_field(cache_variables "${json}" "cache_variables;names" "")
  list(APPEND declared ${cache_variables})

  set(unknown "")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E environment OUTPUT_VARIABLE environment)
  string(REGEX MATCHALL "(^|\n)VFA_[A-Za-z0-9_]*=" env_names "${environment}")
  foreach(entry IN LISTS env_names)
    string(REGEX REPLACE "^\n?(.*)=$" "\\1" env_name "${entry}")
    if(NOT env_name IN_LIST declared)
      list(APPEND unknown "env:${env_name}")
    endif()
  endforeach()
  get_cmake_property(cache_names CACHE_VARIABLES)
  foreach(var IN LISTS cache_names)
    if(var MATCHES "^VFA_" AND NOT var IN_LIST declared)
      get_property(type CACHE ${var} PROPERTY TYPE)
      if(NOT type STREQUAL "INTERNAL")
        list(APPEND unknown "cmake:${var}")
        unset(${var} CACHE)
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY VFA_UNKNOWN_SETTINGS "")
  if(NOT unknown)
    return()
  endif()

  set(names "")
  foreach(entry IN LISTS unknown)
    vfa_split_record(kind name "${entry}" ":")
    list(APPEND names "${name}")
  endforeach()
  vfa_knob_suggestions(suggestions ${names})
  set(lines "")
  set(records "")
  foreach(entry IN LISTS unknown)
    vfa_split_record(kind name "${entry}" ":")
    set(suggestion "")
    foreach(pair IN LISTS suggestions)
      vfa_split_record(misspelt closest "${pair}" "=")
      if(misspelt STREQUAL name)
        set(suggestion "${closest}")
      endif()
    endforeach()
    if(kind STREQUAL "env")
      set(where "environment variable")
    else()
      set(where "-D variable")
    endif()
    set(line " ${name} (${where}) is not a knob of this project")
    if(suggestion)
      string(APPEND line ": did you mean ${suggestion}?")
    endif()
    string(APPEND lines "${line}\n")
    list(APPEND records "${kind}:${name}:${suggestion}")
  endforeach()
  set_property(GLOBAL PROPERTY VFA_UNKNOWN_SETTINGS "${records}")
  if(VFA_ALLOW_UNKNOWN_SETTINGS)
    message(WARNING
      "\n"
      "==========================================================================\n"
      "${lines}"
      " It is ignored (VFA_ALLOW_UNKNOWN_SETTINGS=ON). The knobs are listed in\n"
      " docs/knobs.md (cmake/knobs.json).\n"
      "==========================================================================")
  else()
    message(FATAL_ERROR
      "\n"
      "${lines}"
      " Stopped before anything is fetched or built: a misspelt knob would build something\n"
      " else than was asked. Correct or remove it (the knobs are listed in docs/knobs.md,\n"
      " cmake/knobs.json), or set VFA_ALLOW_UNKNOWN_SETTINGS=ON to build with it ignored.")
  endif()
endfunction()

# "NAME=SUGGESTION" for each name that has a close declared knob. Asks Python's
# difflib (cmake/vfa_build/knobs/knobs.py suggest); without a Python there are no suggestions.
#   vfa_knob_suggestions(pairs VFA_PRESTE VFA_XYZZY)  ->  VFA_PRESTE=VFA_PRESET
function(vfa_knob_suggestions out_var)
  set(python "")
  if(Python_EXECUTABLE)
    set(python "${Python_EXECUTABLE}")
  else()
    find_program(_vfa_knobs_python NAMES python3 python NO_CACHE)
    if(_vfa_knobs_python)
      set(python "${_vfa_knobs_python}")
    endif()
  endif()
  set(pairs "")
  if(python)
    execute_process(COMMAND "${python}" "${VFA_BUILD_PY}" knobs.knobs suggest ${ARGN}
      OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
    if(rc EQUAL 0 AND NOT out STREQUAL "")
      string(REPLACE "\n" ";" pairs "${out}")
    endif()
  endif()
  set(${out_var} "${pairs}" PARENT_SCOPE)
endfunction()
