#!/usr/bin/env bash
# cibuildwheel before-test: the test environment gets the torch the wheel was
# built against (same CUDA major) before the wheel itself is installed.
set -euo pipefail
python -m pip install ${VFA_TORCH_INDEX_URL:+--index-url "$VFA_TORCH_INDEX_URL"} "torch==${VFA_TORCH_VERSION:-2.14.1}"
