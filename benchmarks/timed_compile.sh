#!/bin/sh
# Compiler launcher that records wall time and peak RSS of each compile.
#
#   VFA_TIME_LOG=/abs/path/times.tsv pip wheel ... \
#     -Ccmake.define.VFA_COMPILER_CACHE=off \
#     -Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=$PWD/benchmarks/timed_compile.sh \
#     -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$PWD/benchmarks/timed_compile.sh
#   python benchmarks/build.py --analyse BUILD_DIR --time-log /abs/path/times.tsv
#
# Appends "OUTPUT<TAB>WALL_S MAXRSS_KB" per compile. GNU time's %M is the largest
# resident set of the compiler process or any of its waited-for children (cicc,
# ptxas, cc1plus), so for nvcc it is its heaviest step, as the anchors report it.
# Only meaningful with the compiler cache off: under sccache the compile runs in the
# sccache server, and this would time the client. (build.py's /proc sampler works
# with sccache.) Without VFA_TIME_LOG or /usr/bin/time it just runs the compiler.
if [ -z "$VFA_TIME_LOG" ] || [ ! -x /usr/bin/time ]; then
  exec "$@"
fi
out=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
tmp=$(mktemp "${TMPDIR:-/tmp}/vfa-time.XXXXXX")
/usr/bin/time -f "%e %M" -o "$tmp" "$@"
rc=$?
printf '%s\t%s\n' "$out" "$(tail -n 1 "$tmp")" >> "$VFA_TIME_LOG"
rm -f "$tmp"
exit $rc
