#!/usr/bin/env bash
# FA4 on the H200 with no network, in two device calls made back to back (the machine stays
# warm 30 s): the DSL's libs wheel (nvidia-cutlass-dsl-libs-base, 90 MB) is over what one
# call carries, so it travels in two parts.
#
#   Here:  pip download --no-deps (cp312, manylinux) nvidia-cutlass-dsl==4.6.0.dev0
#            nvidia-cutlass-dsl-libs-base==4.6.0.dev0 quack-kernels==0.5.3
#            apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
#          split -b 46m the libs wheel: part aa + its sha256 (libs.sha256) + the other wheels
#          + a vendored_flash_attn wheel into ignored folder A, part ab into folder B
#   Call 1 (carry A):  tests/gpu/fa4_h200.sh stage A
#   Call 2 (carry B):  tests/gpu/fa4_h200.sh run B      -> $OUT/fa4_check.log, fa4_results.json
#   Again (warm):      tests/gpu/fa4_h200.sh again     (a second process: the disk cache)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=/tmp/vfa-fa4
export PYTHONPATH=$WORK/site:$WORK/site/nvidia_cutlass_dsl/python_packages
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$WORK/user-cache
case "${1:?stage A | run B | again}" in
  stage) rm -rf "$WORK" && mkdir -p "$WORK/in" && cp -r "$ROOT/${2:?folder A}/." "$WORK/in/" && ls -l "$WORK/in" ;;
  run)
    cd "$WORK/in" || exit 3
    cp "$ROOT/${2:?folder B}"/libs.part.* . || exit 3
    wheel=nvidia_cutlass_dsl_libs_base-4.6.0.dev0-cp312-cp312-manylinux_2_28_x86_64.whl
    cat libs.part.* > "$wheel" && echo "$(cat libs.sha256)  $wheel" | sha256sum -c - || exit 4
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
      nvidia_cutlass_dsl*.whl apache_tvm_ffi*.whl quack_kernels*.whl torch_c_dlpack_ext*.whl || exit 5
    python3 -m pip install -q --no-index --no-deps --force-reinstall vendored_flash_attn-*.whl || exit 6
    cd /tmp && python3 -W always "$ROOT/tests/gpu/fa4_check.py" 2>&1 | tee "${OUT:-/tmp}/fa4_check.log" ;;
  again) cd /tmp && python3 -W ignore "$ROOT/tests/gpu/fa4_check.py" 2>&1 | tee "${OUT:-/tmp}/fa4_check_again.log" ;;
esac
