# The build's Python: the scripts CMake runs are the modules of one package, cmake/vfa_build/
# (by concern: sources, compiler_cache, cluster, units, progress, fa4, knobs), run through its one
# entry point, which puts cmake/ first on sys.path and runs the module as __main__:
#   COMMAND "${Python_EXECUTABLE}" -E -s -S "${VFA_BUILD_PY}" sources.staged_tree stage ...
# -E -s -S (the interpreter's standard library only, whatever the environment says) wherever
# the module needs nothing else. Cached (internal) so that a function that includes this file
# first does not keep it to itself.

include_guard(GLOBAL)
set(VFA_BUILD_PY "${CMAKE_CURRENT_LIST_DIR}/vfa_build" CACHE INTERNAL "the build's Python package (its entry point)")
