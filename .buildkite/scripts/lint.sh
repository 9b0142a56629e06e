#!/usr/bin/env bash
# Lint: Python byte-compiles, shell scripts parse (and pass shellcheck when it
# is installed), the pipeline validates against Buildkite's schema, and the
# cibuildwheel configuration resolves offline.
source "$(dirname "$0")/common.sh"
cd "$ROOT"
.ci/bootstrap
PY=.venv/bin/python
echo "--- python"
$PY -m compileall -q python tests benchmarks
echo "--- shell"
for f in .ci/run .ci/bootstrap .buildkite/scripts/*.sh tests/gpu/*.sh; do
  [ -f "$f" ] && bash -n "$f"
done
if command -v shellcheck >/dev/null; then
  shellcheck -x .buildkite/scripts/*.sh
fi
echo "--- pipeline schema, scripts, cibuildwheel config"
$PY -m pytest -q tests/dist/test_pipeline.py tests/dist/test_cibuildwheel.py
