#!/usr/bin/env bash
# The gate on the built x86_64 wheels of one CUDA version: size limit
# (VFA_WHEEL_MAX_MB), abi3 tags + abi3audit, the shared C++ runtime, build info as asked, and every
# compiled module loading with no undefined symbol (needs torch of the same
# CUDA major, installed into a throwaway venv; no GPU).
#
#   .buildkite/scripts/check-wheels.sh 13.0
source "$(dirname "$0")/common.sh"
CUDA=${1:?usage: check-wheels.sh CUDA}
cd "$ROOT"
rm -rf wheelhouse && mkdir -p wheelhouse
buildkite-agent artifact download "wheelhouse/cu${CUDA}-*/*.whl" .
index=$(torch_index_for "$CUDA")
tools_venv .venv-check abi3audit pyelftools packaging
.venv-check/bin/python -m pip install -q ${index:+--index-url "$index"} "torch==${VFA_TORCH_VERSION}"
status=0
for dir in wheelhouse/cu"${CUDA}"-*/; do
  args=(--pin vendor/flash-attention/pin.json --cuda-major "$(cuda_major "$CUDA")"
        --arch-list "${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" --require fa2,fa3)
  [ -n "${VFA_PRESET:-}" ] && args+=(--preset "$VFA_PRESET")
  if [[ "$dir" == *x86_64* ]]; then
    PYTHONPATH=python .venv-check/bin/python -m vendored_flash_attn.wheel_check all "$dir" "${args[@]}" || status=1
  else
    # Modules of another arch cannot be loaded here; cibuildwheel's test-command
    # loaded them on their own arch.
    PYTHONPATH=python .venv-check/bin/python -m vendored_flash_attn.wheel_check size "$dir" || status=1
    PYTHONPATH=python .venv-check/bin/python -m vendored_flash_attn.wheel_check abi3 "$dir" || status=1
    PYTHONPATH=python .venv-check/bin/python -m vendored_flash_attn.wheel_check cxx-runtime "$dir" || status=1
    PYTHONPATH=python .venv-check/bin/python -m vendored_flash_attn.wheel_check build-info "$dir" "${args[@]}" || status=1
  fi
done
exit $status
