#!/usr/bin/env bash
# cibuildwheel before-test: the test environment gets the torch the wheel was
# built against (same CUDA major) before the wheel itself is installed.
set -euo pipefail
# torch's index through pip's environment: a URL with credentials stays off the command line.
if [ -n "${VFA_TORCH_INDEX_URL:-}" ]; then
  PIP_INDEX_URL=$VFA_TORCH_INDEX_URL python -m pip install "torch==${VFA_TORCH_VERSION:-2.14.1}"
else
  python -m pip install "torch==${VFA_TORCH_VERSION:-2.14.1}"
fi
