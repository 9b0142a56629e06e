# Shared by the pipeline's scripts (sourced, not run).
# shellcheck shell=bash
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONUNBUFFERED=1
VFA_TORCH_VERSION=${VFA_TORCH_VERSION:-2.14.1}
export VFA_TORCH_VERSION

# "13.0" -> "130", the tag of PyTorch's per-CUDA wheel index.
cuda_tag() { echo "${1//./}"; }
cuda_major() { echo "${1%%.*}"; }

# The manylinux_2_28 CUDA image (PyTorch's wheel builders) for a CUDA version and arch.
cuda_image() {
  local cuda=$1 arch=$2
  case "$arch" in
    x86_64) echo "pytorch/manylinux2_28-builder:cuda${cuda}" ;;
    aarch64) echo "pytorch/manylinuxaarch64-builder:cuda${cuda}" ;;
    *) echo "unknown arch $arch" >&2; return 1 ;;
  esac
}

# The index for torch of one CUDA version: $VFA_TORCH_INDEX_BASE/cu<tag> when the
# agent sets a base, else whatever pip is configured with.
torch_index_for() {
  if [ -n "${VFA_TORCH_INDEX_BASE:-}" ]; then
    echo "${VFA_TORCH_INDEX_BASE%/}/cu$(cuda_tag "$1")"
  else
    echo "${VFA_TORCH_INDEX_URL:-}"
  fi
}

# A throwaway venv with the project's tools (no torch unless asked).
tools_venv() {
  local venv=$1
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${@:2}"
}

# Pull requests read the shared cache but never write it.
cache_mode_for_build() {
  if [ "${BUILDKITE_PULL_REQUEST:-false}" != "false" ]; then
    export SCCACHE_S3_RW_MODE=READ_ONLY SCCACHE_REDIS_RW_MODE=READ_ONLY
    echo "--- compiler cache: read-only (pull request ${BUILDKITE_PULL_REQUEST})"
  else
    export SCCACHE_S3_RW_MODE=${SCCACHE_S3_RW_MODE:-READ_WRITE}
    echo "--- compiler cache: read-write"
  fi
  if [ -z "${SCCACHE_BUCKET:-}${SCCACHE_REDIS_ENDPOINT:-}" ]; then
    echo "^^^ +++"
    echo "warning: neither SCCACHE_BUCKET nor SCCACHE_REDIS_ENDPOINT is set: the build uses a local cache only" >&2
  else
    echo "shared cache: ${SCCACHE_BUCKET:+s3 bucket $SCCACHE_BUCKET ${SCCACHE_S3_KEY_PREFIX:-}}${SCCACHE_REDIS_ENDPOINT:+redis}"
  fi
}

# Distributed compiles (optional): with VFA_DIST_SCHEDULER_URL (or a per-arch
# VFA_DIST_SCHEDULER_URL_<arch>: build servers run the client's architecture) and
# VFA_DIST_CLIENT_TOKEN in the agent's environment, the build compiles through that
# sccache-dist scheduler. The client config goes into the checkout, which
# cibuildwheel mounts as /project in its container; SCCACHE_CONF points there.
#   dist_client_for_build ARCH [CONTAINER_ROOT]
dist_client_for_build() {
  local arch=$1 container_root=${2:-/project} var url
  var="VFA_DIST_SCHEDULER_URL_${arch}"
  url=${!var:-${VFA_DIST_SCHEDULER_URL:-}}
  if [ -z "$url" ]; then
    echo "--- distributed compiles: off (no VFA_DIST_SCHEDULER_URL)"
    return 0
  fi
  : "${VFA_DIST_CLIENT_TOKEN:?VFA_DIST_SCHEDULER_URL is set but VFA_DIST_CLIENT_TOKEN is not (docs/release.md)}"
  mkdir -p "$ROOT/.sccache-dist"
  # The URL through stdin (cluster.py client --scheduler-url -): on a command line `ps` would show it.
  VFA_DIST_CLIENT_TOKEN=$VFA_DIST_CLIENT_TOKEN python3 "$ROOT/dist-compile/cluster.py" client \
    --scheduler-url - --out "$ROOT/.sccache-dist/client.toml" \
    --toolchain-dir "$container_root/.sccache-dist/toolchains" >/dev/null <<< "$url"
  export SCCACHE_CONF="$container_root/.sccache-dist/client.toml"
  # The URL as the project's one scrubber shows it (no user, password, query or fragment).
  # (The URL goes through stdin: on a command line `ps` would show it.)
  local shown
  shown=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from vfa_build.url_secrets import shown_url; print(shown_url(sys.stdin.read().strip()))' "$ROOT/cmake" <<< "$url")
  echo "--- distributed compiles: scheduler $shown (client config $SCCACHE_CONF)"
}
