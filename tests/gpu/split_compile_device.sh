#!/usr/bin/env bash
# Issue 46's proof on the GPU machine: this checkout's `minimal` wheel built cold twice, with
# VFA_NVCC_SPLIT_COMPILE=SPLIT (default auto) and with it off, each build's own per-unit times
# kept (its .ninja_log); then the GPU tests on the split wheel and the kernels benchmark of both
# side by side (benchmarks/kernels_pair.py). Three device calls back to back (the machine stays
# warm 30 s between them); no compiler cache (cold is what is measured); FA4 staged, not
# precompiled (its dependencies are not carried).
#
#   Here:  DIR (carried) holds cache.tar.xz, a tar of a filled source cache's src/ folder
#          (`tar -C <source cache> -cJf DIR/cache.tar.xz src`).
#   Calls: tests/gpu/split_compile_device.sh build split DIR   the wheel with the knob on
#          tests/gpu/split_compile_device.sh build whole DIR   the wheel with it off
#          tests/gpu/split_compile_device.sh compare           GPU tests on the split wheel, then
#                                                              kernels_pair.py whole=... split=...
# Results under $OUT: build-<label>.log, ninja-<label>.log, build_info-<label>.json, gpu-tests.log,
# junit-gpu.xml, kernels-pair.txt/.json.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ PYTHONUNBUFFERED=1
export VFA_SOURCE_CACHE=/tmp/srccache
mkdir -p "${OUT:=/tmp/vfa-out}"
case "${1:?build split|whole DIR | compare}" in
  build)
    label=${2:?split or whole}
    DIR=$ROOT/${3:?the carried folder}
    case "$label" in split) knob=${SPLIT:-auto} ;; whole) knob=off ;; *) echo "split or whole" >&2; exit 2 ;; esac
    mkdir -p /tmp/srccache
    [ -d /tmp/srccache/src ] || tar -C /tmp/srccache -xJf "$DIR/cache.tar.xz" || exit 4
    rm -rf "/tmp/wh-$label" "/tmp/vfa-build-$label"
    SECONDS=0
    (cd "$ROOT" && timeout "${BUILD_S:-570}" python3 -m pip wheel --no-build-isolation --no-deps -v \
      -w "/tmp/wh-$label" -Cbuild-dir="/tmp/vfa-build-$label" -Ccmake.define.VFA_PRESET=minimal \
      -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 -Ccmake.define.VFA_FA2_SM90_SASS=ON \
      -Ccmake.define.VFA_FA2_PTX=OFF -Ccmake.define.VFA_FA4_PRECOMPILE=off \
      -Ccmake.define.VFA_COMPILER_CACHE=off -Ccmake.define.VFA_NVCC_SPLIT_COMPILE="$knob" . \
      > "$OUT/build-$label.log" 2>&1)
    rc=$?
    echo "build $label (VFA_NVCC_SPLIT_COMPILE=$knob) rc=$rc in ${SECONDS} s"
    cp "/tmp/vfa-build-$label/.ninja_log" "$OUT/ninja-$label.log" 2>/dev/null
    cp "/tmp/vfa-build-$label/build_info.json" "$OUT/build_info-$label.json" 2>/dev/null
    # The five longest units of this build (ninja's own start and end times, ms)
    awk -F'\t' 'NR > 1 && $4 ~ /\.o$/ { printf "%7.1f s  %s\n", ($2 - $1) / 1000, $4 }' \
      "$OUT/ninja-$label.log" 2>/dev/null | sort -rn | head -5
    grep -E "split|Created wheel" "$OUT/build-$label.log" | tail -4
    exit $rc ;;
  compare)
    for label in split whole; do
      rm -rf "/tmp/pkg-$label"
      python3 -m pip install -q --no-deps --target "/tmp/pkg-$label" /tmp/wh-$label/vendored_flash_attn-*.whl || exit 5
    done
    SECONDS=0
    (cd /tmp && PYTHONPATH=/tmp/pkg-split timeout "${GPU_S:-200}" python3 -m pytest "$ROOT/tests/gpu" -m gpu -q -rs \
      -p no:cacheprovider -o pythonpath= --junitxml="$OUT/junit-gpu.xml" > "$OUT/gpu-tests.log" 2>&1)
    echo "gpu tests on the split wheel rc=$? in ${SECONDS} s"
    tail -1 "$OUT/gpu-tests.log"
    SECONDS=0
    timeout "${BENCH_S:-330}" python3 "$ROOT/benchmarks/kernels_pair.py" whole=/tmp/pkg-whole split=/tmp/pkg-split \
      --out "$OUT/pair" --rounds "${ROUNDS:-2}" --impls fa2 fa3 fa3_fp8 -- --quick > "$OUT/kernels-pair.txt" 2>&1
    rc=$?
    cp "$OUT/pair/kernels-pair.json" "$OUT/" 2>/dev/null
    tar -C "$OUT" -czf "$OUT/pair.tar.gz" pair && rm -rf "$OUT/pair"  # each run's kernels.json, one file back
    echo "kernels_pair rc=$rc in ${SECONDS} s"
    cat "$OUT/kernels-pair.txt" | grep -v '^\[kernels_pair\]'
    exit $rc ;;
  *) echo "usage: split_compile_device.sh build split|whole DIR | compare" >&2; exit 2 ;;
esac
