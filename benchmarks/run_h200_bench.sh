#!/usr/bin/env bash
# The performance run on an H200, in one command: kernels, call overhead and first
# call of the installed wheel, then the two measured build choices against variants
# built elsewhere (benchmarks/variant_package.py swaps one module in):
#   FA2 as sm80 SASS + PTX (driver JIT on Hopper) versus the wheel's sm90 SASS;
#   FP8 two-level accumulation off versus the wheel's default (on).
#
#   benchmarks/run_h200_bench.sh WHEEL [FA2_PTX_BUILD_DIR] [FA3_NO_TWO_LEVEL_BUILD_DIR]
#
# STAGES (default: all) picks among first_call overhead fp8 variants kernels.
# OVERLAY_SOURCE=1 copies this checkout's Python files over the installed package
# (same compiled modules, newer Python), to measure a Python-only change.
#
# Everything lands in $OUT/bench.tgz (default .results/).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FINAL=${OUT:-$ROOT/.results}
R=/tmp/vfa-bench
rm -rf "$R" && mkdir -p "$R" "$FINAL"
trap 'tar -czf "$FINAL/bench.tgz" -C "$R" .' EXIT
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
wheel=$1 fa2_ptx=${2:-} fa3_nol2=${3:-}

"$ROOT/tests/gpu/install_wheel.sh" "$wheel"  # honours OVERLAY_SOURCE
cd /tmp  # import the installed package, not the source tree
STAGES=" ${STAGES:-first_call overhead fp8 variants kernels} "

[[ $STAGES == *" first_call "* ]] &&
  "$PY" "$ROOT/benchmarks/first_call.py" --out "$R" 2>&1 | tee "$R/first_call.log" | tail -15
[[ $STAGES == *" overhead "* ]] &&
  "$PY" "$ROOT/benchmarks/overhead.py" --out "$R" 2>&1 | tee "$R/overhead.log" | tail -20
[[ $STAGES == *" fp8 "* ]] &&
  "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --out "$R" 2>&1 | tee "$R/fp8_on.log" | tail -5

if [[ -n "$fa3_nol2" && $STAGES == *" variants "* ]]; then
  "$PY" "$ROOT/benchmarks/variant_package.py" --component fa3 --build-dir "$ROOT/$fa3_nol2" \
    --dest /tmp/variant-nol2 --label fp8-two-level-off
  PYTHONPATH=/tmp/variant-nol2 "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --out "$R" 2>&1 | tee "$R/fp8_off.log" | tail -5
  "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --compare "$R"/fp8_accuracy-*.json 2>&1 | tee "$R/fp8_compare.log"
fi
if [[ -n "$fa2_ptx" && $STAGES == *" variants "* ]]; then
  "$PY" "$ROOT/benchmarks/variant_package.py" --component fa2 --build-dir "$ROOT/$fa2_ptx" \
    --dest /tmp/variant-ptx --label fa2-sm80-ptx
  mkdir -p "$R/fa2-ptx"
  PYTHONPATH=/tmp/variant-ptx timeout 150 "$PY" "$ROOT/benchmarks/first_call.py" --out "$R/fa2-ptx" \
    --timeout 60 2>&1 | tee "$R/fa2-ptx/first_call.log" | tail -12
  PYTHONPATH=/tmp/variant-ptx timeout 120 "$PY" "$ROOT/benchmarks/kernels.py" --quick --impls fa2 \
    --cases paged_prefill_seed paged_decode_seed varlen_2k_causal --budget-s 90 --out "$R/fa2-ptx" 2>&1 \
    | tee "$R/fa2-ptx/kernels.log" | tail -12
fi
# Last, so its table ends the output.
[[ $STAGES == *" kernels "* ]] &&
  "$PY" "$ROOT/benchmarks/kernels.py" --out "$R" 2>&1 | tee "$R/kernels.log" | tail -40
exit 0
