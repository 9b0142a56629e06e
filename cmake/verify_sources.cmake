# Build-time entry point of the source check (target vfa_verified_sources, added by
# cmake/UpstreamBuildCheck.cmake): compares each repository the configure found matching
# the pin with its commit again, with the configure's own comparison
# (vfa_compare_with_commit), and stops the build, naming the files and the fix, when one
# differs. On success it writes its stamp when what it verified changed (ninja restats
# it, so nothing rebuilds because of an unchanged one).
#   cmake -DVFA_VERIFY_SPEC=<build>/vfa_verified_sources.json -P cmake/verify_sources.cmake
cmake_minimum_required(VERSION 3.26)
include(${CMAKE_CURRENT_LIST_DIR}/UpstreamSources.cmake)

if(NOT VFA_VERIFY_SPEC OR NOT EXISTS "${VFA_VERIFY_SPEC}")
  message(FATAL_ERROR "vendored-flash-attn: no source check spec '${VFA_VERIFY_SPEC}': configure the build again.")
endif()
file(READ "${VFA_VERIFY_SPEC}" spec)
string(JSON GIT_EXECUTABLE GET "${spec}" git)
string(JSON VFA_FETCH_TIMEOUT GET "${spec}" timeout)
string(JSON stamp GET "${spec}" stamp)
string(JSON count LENGTH "${spec}" components)

# Git runs for these repositories only and never sees environment that points it
# elsewhere (a build started from a git hook has GIT_DIR), as at configure.
foreach(name IN LISTS VFA_GIT_LOCATION_ENV)
  unset(ENV{${name}})
endforeach()

set(verified "")
set(failures "")
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON entry GET "${spec}" components ${i})
    foreach(key name dir commit origin)
      string(JSON ${key} GET "${entry}" ${key})
    endforeach()
    string(JSON npaths LENGTH "${entry}" paths)
    set(VFA_PIN_${name}_PATHS "")
    math(EXPR plast "${npaths} - 1")
    foreach(j RANGE ${plast})
      string(JSON path GET "${entry}" paths ${j})
      list(APPEND VFA_PIN_${name}_PATHS "${path}")
    endforeach()
    vfa_compare_with_commit(diff err "${dir}" "${commit}" ${name})
    if(err)
      set(diff "${err}")
    endif()
    if(NOT diff)
      string(APPEND verified "${name} ${commit} ${dir}\n")
      continue()
    endif()
    if(origin STREQUAL "cache")
      string(CONCAT fix "Something edited the source cache after the fetch: remove that folder "
        "(rm -rf '${dir}') and configure again (pip install/pip wheel configure every time; a build "
        "dir: cmake -S <project> -B <build dir>), which fetches it anew.")
    else()
      string(CONCAT fix "Restore those files (git -C '${dir}' status shows them), or configure again: the "
        "configure then records this tree as it is, with a warning and matches_pin: false.")
    endif()
    string(APPEND failures "\n${name}: '${dir}' no longer holds commit ${commit} unmodified: ${diff}. ${fix}")
  endforeach()
endif()

if(failures)
  file(REMOVE "${stamp}")
  message(FATAL_ERROR "vendored-flash-attn: the upstream sources changed since this build was configured, "
    "which verified them (its build info says matches_pin: true), so nothing is compiled or packaged from "
    "them:${failures}")
endif()
set(written "")
if(EXISTS "${stamp}")
  file(READ "${stamp}" written)
endif()
if(NOT EXISTS "${stamp}" OR NOT written STREQUAL verified)
  file(WRITE "${stamp}" "${verified}")
endif()
