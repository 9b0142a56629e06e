#!/usr/bin/env bash
# Builds the manylinux_2_28 CUDA wheel for one CUDA version and arch with
# cibuildwheel (config: pyproject.toml [tool.cibuildwheel]) into
# wheelhouse/cu<CUDA>-<arch>/, then runs the checks that need no torch.
#
#   .buildkite/scripts/build-wheels.sh 13.0 x86_64
#
# Needs docker on the agent. Cache settings come from the agent environment
# (docs/release.md); they are passed into the container.
source "$(dirname "$0")/common.sh"
CUDA=${1:?usage: build-wheels.sh CUDA ARCH}
ARCH=${2:?usage: build-wheels.sh CUDA ARCH}
cd "$ROOT"

image=$(cuda_image "$CUDA" "$ARCH")
export CIBW_ARCHS_LINUX=$ARCH
export CIBW_MANYLINUX_X86_64_IMAGE=$(cuda_image "$CUDA" x86_64)
export CIBW_MANYLINUX_AARCH64_IMAGE=$(cuda_image "$CUDA" aarch64)
VFA_TORCH_INDEX_URL=$(torch_index_for "$CUDA")
export VFA_TORCH_INDEX_URL
cache_mode_for_build
dist_client_for_build "$ARCH"
# Objects from the cluster: one unit in 10 compiled again here and compared (dist-compile/README.md,
# "Trust model"); an agent's own VFA_DIST_VERIFY wins.
if [ -n "${SCCACHE_CONF:-}" ] && [ -z "${VFA_DIST_VERIFY+set}" ]; then
  export VFA_DIST_VERIFY=10
fi

# Reproducible wheels (docs/build.md, "What a build records"): zip times from the commit's time,
# for scikit-build-core and auditwheel's repair alike (passed into the container), so a
# rebuild of this commit gives the same bytes and the same sha256 (printed below).
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH

# FA4's kernels for every Python the fa4 family declares (cmake/knobs.json "pythons"): the
# build's Python compiles them, each other one ships an index of the same files. An agent
# that sets VFA_FA4_PRECOMPILE_PYTHONS (empty included) keeps its own choice.
if [ -z "${VFA_FA4_PRECOMPILE_PYTHONS+set}" ]; then
  VFA_FA4_PRECOMPILE_PYTHONS=$(python3 .buildkite/scripts/cibw_fa4_deps.py --release-pythons)
fi
export VFA_FA4_PRECOMPILE_PYTHONS

out="wheelhouse/cu${CUDA}-${ARCH}"
rm -rf "$out" && mkdir -p "$out"
echo "--- cibuildwheel: CUDA $CUDA, $ARCH, image $image, torch $VFA_TORCH_VERSION"
tools_venv .venv-cibw "cibuildwheel>=3.1" abi3audit pyelftools packaging
.venv-cibw/bin/cibuildwheel --platform linux --output-dir "$out" .

echo "--- wheel checks (size and sha256, abi3, C++ runtime, build info)"
# Checks that need no torch run here; symbols are checked by check-wheels.sh.
PYTHONPATH=python .venv-cibw/bin/python -m vendored_flash_attn.release.wheel_check size "$out" | tee "$out/checks.txt"
PYTHONPATH=python .venv-cibw/bin/python -m vendored_flash_attn.release.wheel_check abi3 "$out" | tee -a "$out/checks.txt"
PYTHONPATH=python .venv-cibw/bin/python -m vendored_flash_attn.release.wheel_check cxx-runtime "$out" | tee -a "$out/checks.txt"
PYTHONPATH=python .venv-cibw/bin/python -m vendored_flash_attn.release.wheel_check build-info "$out" \
  --pin vendor/flash-attention/pin.json --cuda-major "$(cuda_major "$CUDA")" \
  --arch-list "${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" ${VFA_PRESET:+--preset "$VFA_PRESET"} | tee -a "$out/checks.txt"
