#!/usr/bin/env bash
# Install a wheel built on (or brought back from) the device machine, for the GPU
# scripts (run_h200.sh, benchmarks/run_h200_bench.sh).
#
#   tests/gpu/install_wheel.sh WHEEL
#
# The device tool brings files back with '_' for the '+' of the local version label;
# that is undone first. OVERLAY_SOURCE=1 then copies this checkout's Python files over
# the installed package (same compiled modules, newer Python). PYTHON picks the
# interpreter (default python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
wheel=${1:?usage: install_wheel.sh WHEEL}
fixed=/tmp/$(basename "$wheel" | sed 's/_\(fa[0-9a-f]*\.cu[0-9]*\)-/+\1-/')
cp "$wheel" "$fixed"
"$PY" -m pip install -q --no-deps --force-reinstall "$fixed"
if [[ -n "${OVERLAY_SOURCE:-}" ]]; then
  site=$(cd /tmp && "$PY" -c 'import os, vendored_flash_attn as m; print(os.path.dirname(m.__file__))')
  cp "$ROOT"/python/vendored_flash_attn/*.py "$site/"
fi
