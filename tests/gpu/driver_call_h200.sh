#!/usr/bin/env bash
# How CUTLASS reaches the CUDA driver (VFA_CUDA_DRIVER_CALL): upstream's direct calls
# (links libcuda) against the runtime's entry-point query (a build machine without
# libcuda), measured side by side on the H200: the first call in a fresh process and the
# per-call host time of the FA3 op. Run after `tests/gpu/session_h200.sh start` built B
# (the minimal preset, FA3 direct, two-level off): builds C, the same FA3 with
# entry_point (FA2 off), and times both. Results in $OUT/driver_call.tgz.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RES=/tmp/vfa-driver-call && rm -rf "$RES" && mkdir -p "$RES"
FINAL=${OUT:-$ROOT/.results} && mkdir -p "$FINAL"
trap 'tar -czf "$FINAL/driver_call.tgz" -C "$RES" .' EXIT
PY=${PYTHON:-python3}
export PATH=/tmp/vfa-site/bin:$PATH PYTHONPATH=/tmp/vfa-site${PYTHONPATH:+:$PYTHONPATH}
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ VFA_SOURCE_CACHE=/tmp/vfa-source-cache
src=/tmp/vfa-src-c && rm -rf "$src" && mkdir -p "$src"
tar -cf - --exclude=./build --exclude=./dist --exclude=./.upstream-cache --exclude=./.whl \
  --exclude=./.upstream-tests --exclude=./.git . | tar -xf - -C "$src"
start=$(date +%s)
"$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$src/dist" "$src" \
  -Ccmake.define.VFA_PRESET=minimal -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0 -Ccmake.define.VFA_BUILD_FA2=off \
  -Ccmake.define.VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION=OFF -Ccmake.define.VFA_CUDA_DRIVER_CALL=entry_point \
  > "$RES/build-C.log" 2>&1 || { tail -40 "$RES/build-C.log"; exit 1; }
echo "build C: $(( $(date +%s) - start )) s"
"$PY" -m pip install -q --no-deps --no-compile --target /tmp/vfa-wheel-c "$src"/dist/*.whl
for variant in b c; do
  export PYTHONPATH=/tmp/vfa-wheel-$variant:/tmp/vfa-site
  (cd /tmp && "$PY" -c 'import json, vendored_flash_attn.declaration.build_info as b; print(json.dumps(b.load_build_info().raw["cuda_driver_call"]))') \
    | tee "$RES/driver-$variant.json"
  (cd /tmp && "$PY" "$ROOT/benchmarks/first_call.py" --only-default --out "$RES/$variant" --plain) 2>&1 | tail -n 12
  (cd /tmp && "$PY" "$ROOT/benchmarks/overhead.py" --no-fa2 --out "$RES/$variant" --plain) 2>&1 | tail -n 14
done
