#!/usr/bin/env bash
# Issue 27 on the H200, one device call: the CUDA-graph test, the serving replay and the
# overhead comparison against upstream's wrappers, everything written under $OUT/serving.
#
# Needs: an installed vendored_flash_attn wheel holding FA2, FA3 (bf16 + e4m3) and FA4, FA4's
# dependencies importable (tests/gpu/fa4_h200.sh install puts them in /tmp/vfa-fa4/site,
# which this script puts on PYTHONPATH when it is there; FA4_SITE names another folder), and,
# carried with the working tree, upstream's wrapper for the overhead comparison:
#   mkdir -p .upstream-tests && git -C <clone or mirror of vllm-project/flash-attention> show \
#     617264c1c7955c9e84817654ebeedff069f3c5f1:vllm_flash_attn/flash_attn_interface.py \
#     > .upstream-tests/flash_attn_interface.py          (carry: .upstream-tests)
#
#   tests/gpu/serving_h200.sh [all | tests | serving | overhead ...]      (default: all)
#   OVERHEAD_RUNS=5 (the default): the overhead stage's whole runs, summarized together
#   (benchmarks/overhead.py --summarize: each family's overhead as the median of the runs
#   with their spread, isolated and stalled); about a minute each.
#
# OVERLAY_SOURCE=1 (the default) first copies this checkout's Python files and JSON
# declarations over the installed package (same compiled modules; the interface, the
# capture refusal and measured.json of this checkout); OVERLAY_SOURCE=0 leaves it as installed.
# Exit status: 1 when a stage failed (each stage runs regardless, and says so).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
RES=${OUT:-/tmp}/serving
mkdir -p "$RES"
FA4_SITE=${FA4_SITE:-/tmp/vfa-fa4/site}
if [[ -d $FA4_SITE ]]; then
  export PYTHONPATH=$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/python_packages${PYTHONPATH:+:$PYTHONPATH}
  export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=${FLASH_ATTENTION_CUTE_DSL_CACHE_DIR:-/tmp/vfa-fa4/user-cache}
fi
export PYTHONUNBUFFERED=1 CUDA_CACHE_MAXSIZE=4294967296
cd /tmp || exit 3   # never import the checkout's sources by accident: the installed wheel runs
status=0

package_dir() { "$PY" -c 'import os, vendored_flash_attn as m; print(os.path.dirname(m.__file__))'; }

overlay() {
  [[ "${OVERLAY_SOURCE:-1}" == 1 ]] || { echo "installed package as it is (OVERLAY_SOURCE=0)"; return 0; }
  local site
  site=$(package_dir) || { echo "vendored_flash_attn is not installed for $PY" >&2; exit 4; }
  cp "$ROOT"/python/vendored_flash_attn/*.py "$ROOT"/python/vendored_flash_attn/*.json "$site/"
  cp "$ROOT/cmake/knobs.json" "$site/knobs.json"
  echo "overlaid this checkout's Python files on $site"
}

machine() {
  { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc
    "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'; } > "$RES/machine.txt" 2>&1
  "$PY" -m vendored_flash_attn info > "$RES/info.txt" 2>&1
  cat "$RES/machine.txt"; grep -E "^  (FA[0-9]|cuda:)" "$RES/info.txt"
}

stage_tests() {  # the CUDA-graph test; a family the wheel holds may not skip
  local rc=0
  timeout 240 "$PY" -m pytest "$ROOT/tests/gpu/test_cuda_graphs_gpu.py" -m gpu -p no:cacheprovider -o pythonpath= \
    --junitxml="$RES/graphs-junit.xml" -q -ra > "$RES/graphs-tests.log" 2>&1 || rc=$?
  echo "pytest rc=$rc" >> "$RES/graphs-tests.log"
  tail -n 15 "$RES/graphs-tests.log"
  local info_json
  info_json=$("$PY" -c 'import pathlib, vendored_flash_attn as v; print(pathlib.Path(v.__file__).parent / "build_info.json")')
  mapfile -t FORBID < <("$PY" "$ROOT/benchmarks/dist_model.py" --slice-forbid-skips "$info_json")
  "$PY" "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$RES/graphs-junit.xml" "${FORBID[@]}" \
    --forbid-skip "FA4 not usable" --forbid-skip "no FA3 e4m3" > "$RES/graphs-junit-check.txt" 2>&1 || rc=1
  tail -n 5 "$RES/graphs-junit-check.txt"
  return "$rc"
}

stage_serving() {  # ~2-3 min; its own budget stops it at 300 s with partial rows
  local rc=0
  timeout 420 "$PY" "$ROOT/benchmarks/serving.py" --out "$RES" --plain > "$RES/serving.log" 2>&1 || rc=$?
  echo "serving rc=$rc" >> "$RES/serving.log"
  tail -n 40 "$RES/serving.log"
  return "$rc"
}

stage_overhead() {  # ~1 min a run, OVERHEAD_RUNS (5) runs: this package, upstream's wrappers and the raw ops
  local rc=0 upstream=() runs=${OVERHEAD_RUNS:-5} jsons=() i
  [[ -f $ROOT/.upstream-tests/flash_attn_interface.py ]] && upstream=(--upstream-file "$ROOT/.upstream-tests/flash_attn_interface.py")
  [[ ${#upstream[@]} == 0 ]] && echo "NOT compared with upstream's wrapper: carry .upstream-tests/flash_attn_interface.py"
  for ((i = 1; i <= runs; i++)); do  # whole runs one after another: their spread is the noise between runs
    timeout 300 "$PY" "$ROOT/benchmarks/overhead.py" --out "$RES/overhead-run$i" --plain "${upstream[@]}" \
      > "$RES/overhead-run$i.log" 2>&1 || { rc=$?; echo "overhead run $i rc=$rc"; }
    [[ -f $RES/overhead-run$i/overhead.json ]] && jsons+=("$RES/overhead-run$i/overhead.json")
  done
  tail -n 45 "$RES/overhead-run1.log"
  "$PY" "$ROOT/benchmarks/overhead.py" --summarize "${jsons[@]}" --out "$RES" --plain > "$RES/overhead.log" 2>&1 || rc=1
  echo "overhead rc=$rc (${#jsons[@]} of $runs runs)" >> "$RES/overhead.log"
  cat "$RES/overhead.log"
  return "$rc"
}

stages=("$@")
[[ ${#stages[@]} == 0 || "${stages[0]}" == all ]] && stages=(tests serving overhead)
overlay
machine
for stage in "${stages[@]}"; do
  case $stage in
    tests|serving|overhead) ;;
    *) echo "unknown stage $stage (all, tests, serving, overhead)" >&2; exit 2 ;;
  esac
  start=$SECONDS
  echo "=== $stage"
  "stage_$stage" || { echo "=== $stage FAILED"; status=1; }
  echo "=== $stage: $((SECONDS - start)) s"
done
exit "$status"
