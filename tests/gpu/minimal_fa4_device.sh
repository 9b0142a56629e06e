#!/usr/bin/env bash
# A `minimal` + FA4 wheel built on the GPU machine itself (16 cores, no network), then the
# project's GPU step and the overhead runs on it, in two device calls made back to back
# (the machine stays warm 30 s). Used on 2026-12-06 (docs/gpu-results.md); FA4's dependency
# wheels travel as in tests/gpu/fa4_h200.sh (the DSL's libs wheel split in parts, libs.sha256).
#
#   Here:  the carried folder DIR holds FA4's five dependency wheels (the libs wheel as
#          libs.part.* + libs.sha256; parts may come in an earlier call: copy them to
#          /tmp/vfa-fa4/in) and cache.tar.xz, a tar of a filled source cache's src/ folder
#          (5 MB for the pin: `tar -C <source cache> -cJf DIR/cache.tar.xz src`)
#   Calls: tests/gpu/minimal_fa4_device.sh build DIR   install FA4's dependencies into this
#                                                      Python, build the wheel into /tmp/wh
#                                                      (-Cbuild-dir=/tmp/vfa-build: a build
#                                                      cut at BUILD_S resumes in the next call)
#          tests/gpu/minimal_fa4_device.sh test        .buildkite/scripts/gpu-test.sh fa3 13.0
#                                                      on it, then OVERHEAD_RUNS (2) overhead
#                                                      runs (carry .upstream-tests)
#   EXTRA_DEFINES: more -C arguments (2026-12-06: -Ccmake.define.VFA_FA4_PRECOMPILE_HEAD_DIMS=128,512,
#   FA4's FP8 KV kernels precompiled through FA4's own knob). Results under $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IN=/tmp/vfa-fa4/in
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ PYTHONUNBUFFERED=1
mkdir -p "$IN" /tmp/wh "${OUT:=/tmp/vfa-out}"
case "${1:?build DIR | test}" in
  build)
    DIR=$ROOT/${2:?the carried folder}
    cp -n "$DIR"/*.whl "$DIR"/libs.* "$IN"/ 2>/dev/null
    wheel=nvidia_cutlass_dsl_libs_base-4.6.0.dev0-cp312-cp312-manylinux_2_28_x86_64.whl
    if [ ! -f /tmp/vfa-deps.done ]; then
      (cd "$IN" && cat libs.part.* > "$wheel" && echo "$(cat libs.sha256)  $wheel" | sha256sum -c -) || exit 4
      (cd "$IN" && python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages \
        nvidia_cutlass_dsl-*.whl "$wheel" apache_tvm_ffi*.whl quack_kernels*.whl torch_c_dlpack_ext*.whl) || exit 5
      touch /tmp/vfa-deps.done
    fi
    mkdir -p /tmp/srccache
    [ -d /tmp/srccache/src ] || tar -C /tmp/srccache -xJf "$DIR/cache.tar.xz" || exit 6
    read -r -a extra <<< "${EXTRA_DEFINES:-}"
    SECONDS=0
    (cd "$ROOT" && VFA_SOURCE_CACHE=/tmp/srccache timeout "${BUILD_S:-560}" python3 -m pip wheel \
      --no-build-isolation --no-deps -v -w /tmp/wh -Cbuild-dir=/tmp/vfa-build \
      -Ccmake.define.VFA_PRESET=minimal -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 \
      -Ccmake.define.VFA_FA2_SM90_SASS=ON -Ccmake.define.VFA_FA2_PTX=OFF \
      -Ccmake.define.VFA_FA4_PRECOMPILE=on "${extra[@]}" . > "$OUT/build.log" 2>&1)
    rc=$?
    echo "build rc=$rc in ${SECONDS} s"
    grep -E "staged|what runs where|kernels compiled|Created wheel" "$OUT/build.log" | tail -12
    exit $rc ;;
  test)
    cp "$IN"/*.whl /tmp/wh/ 2>/dev/null
    mkdir -p "$OUT/r"
    SECONDS=0
    (cd "$ROOT" && VFA_WHEELHOUSE=/tmp/wh VFA_GPU_PYTHON=python3 VFA_FA4_NO_DEPS=1 timeout "${GPU_S:-330}" \
      .buildkite/scripts/gpu-test.sh fa3 13.0 > "$OUT/r/gpu-test.log" 2>&1)
    echo "gpu-test rc=$? in ${SECONDS} s"
    tail -20 "$OUT/r/gpu-test.log"
    SECONDS=0
    OVERHEAD_RUNS=${OVERHEAD_RUNS:-2} OUT=$OUT/r timeout "${OV_S:-240}" "$ROOT/tests/gpu/serving_h200.sh" overhead \
      > "$OUT/r/overhead-run.log" 2>&1
    echo "overhead rc=$? in ${SECONDS} s"
    tail -14 "$OUT/r/overhead-run.log" ;;
  *) echo "usage: minimal_fa4_device.sh build DIR | test" >&2; exit 2 ;;
esac
