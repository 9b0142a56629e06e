# The C++ runtime the modules link: the shared libstdc++, the one torch uses.
# A toolchain that has only the static archive (some self-built GCCs) links a
# private copy of libstdc++ into each module. A C++ exception thrown inside an
# op -- a failed argument check, an out-of-memory error from an allocation --
# then kills the process with SIGSEGV instead of reaching Python as a
# RuntimeError: measured on the H200 machine, whose /opt/gcc g++ does this
# (tests/gpu/op_refusal_probe.py), while the same source linked to the shared
# libstdc++ raises.
#
#   VFA_ALLOW_STATIC_LIBSTDCXX   ON: build anyway, with a warning (default OFF)

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Options.cmake)

function(vfa_check_cxx_runtime)
  vfa_option(VFA_ALLOW_STATIC_LIBSTDCXX)
  set(allow ${VFA_ALLOW_STATIC_LIBSTDCXX})
  set(runtime "unknown")
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # The linker takes libstdc++.so when the compiler can name one, else libstdc++.a.
    execute_process(
      COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
      OUTPUT_VARIABLE shared_lib ERROR_QUIET RESULT_VARIABLE rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND IS_ABSOLUTE "${shared_lib}" AND EXISTS "${shared_lib}")
      set(runtime "shared")
    else()
      set(runtime "static")
      set(problem
        "The C++ compiler ${CMAKE_CXX_COMPILER} has no shared libstdc++ "
        "(`-print-file-name=libstdc++.so` finds none), so each module would carry its "
        "own static copy. A C++ exception thrown inside an op (a failed argument check, "
        "an out-of-memory error) then kills the process instead of raising in Python. "
        "Build with a compiler that has the shared libstdc++ (for example "
        "CXX=/usr/bin/g++ CC=/usr/bin/gcc), ")
      if(allow)
        message(WARNING ${problem} "or leave VFA_ALLOW_STATIC_LIBSTDCXX unset to make this an error.")
      else()
        message(FATAL_ERROR ${problem} "or set VFA_ALLOW_STATIC_LIBSTDCXX=ON to build anyway.")
      endif()
    endif()
  endif()
  set(VFA_CXX_RUNTIME "${runtime}" PARENT_SCOPE)
endfunction()
