#!/usr/bin/env bash
# The gate on the built wheels of one CUDA version: size limit (VFA_WHEEL_MAX_MB), abi3
# tags + abi3audit, the shared C++ runtime, build info as asked, and every compiled module
# loading with no undefined symbol (needs torch of the same CUDA major, installed into a
# throwaway venv; no GPU). Every family the wheel's build info asked for must be there
# (`--require declared`: each family cmake/knobs.json declares whose build knob the build
# info does not record as off and which runs on an arch of its arch list): FA2's and FA3's
# modules, FA4's subpackage, its build record and, for each arch and Python its precompile
# named, the kernel files (or the index onto another Python's files) its record counts.
#
#   .buildkite/scripts/check-wheels.sh 13.0
#
# Without Buildkite (tests, a release manager's machine): VFA_WHEELHOUSE=DIR takes the wheels
# from DIR/cu<CUDA>-<arch>/ instead of the build's artifacts, and VFA_CHECK_PYTHON=PYTHON
# checks with that interpreter (torch, abi3audit, pyelftools, packaging installed) instead of
# a fresh venv.
source "$(dirname "$0")/common.sh"
CUDA=${1:?usage: check-wheels.sh CUDA}
cd "$ROOT"
if [ -n "${VFA_WHEELHOUSE:-}" ]; then
  wheelhouse=$VFA_WHEELHOUSE
else
  wheelhouse=wheelhouse
  rm -rf wheelhouse && mkdir -p wheelhouse
  buildkite-agent artifact download "wheelhouse/cu${CUDA}-*/*.whl" .
fi
if [ -n "${VFA_CHECK_PYTHON:-}" ]; then
  py=$VFA_CHECK_PYTHON
else
  index=$(torch_index_for "$CUDA")
  tools_venv .venv-check abi3audit pyelftools packaging
  .venv-check/bin/python -m pip install -q ${index:+--index-url "$index"} "torch==${VFA_TORCH_VERSION}"
  py=.venv-check/bin/python
fi
wheel_check() { PYTHONPATH="$ROOT/python" "$py" -m vendored_flash_attn.release.wheel_check "$@"; }
status=0
found=0
for dir in "$wheelhouse"/cu"${CUDA}"-*/; do
  [ -d "$dir" ] || continue
  found=1
  args=(--pin vendor/flash-attention/pin.json --cuda-major "$(cuda_major "$CUDA")"
        --arch-list "${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" --require declared)
  [ -n "${VFA_PRESET:-}" ] && args+=(--preset "$VFA_PRESET")
  if [[ "$dir" == *x86_64* ]]; then
    wheel_check all "$dir" "${args[@]}" || status=1
  else
    # Modules of another arch cannot be loaded here; cibuildwheel's test-command
    # loaded them on their own arch.
    wheel_check size "$dir" || status=1
    wheel_check abi3 "$dir" || status=1
    wheel_check cxx-runtime "$dir" || status=1
    wheel_check build-info "$dir" "${args[@]}" || status=1
  fi
done
if [ "$found" = 0 ]; then
  echo "check-wheels: no wheel folder $wheelhouse/cu${CUDA}-*/" >&2
  exit 1
fi
exit $status
