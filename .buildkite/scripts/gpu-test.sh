#!/usr/bin/env bash
# GPU tests of a built wheel (downloaded as an artifact of the wheel step):
#   fa2: on the A100 queue, FA2 kernels (the selector must pick FA2 there);
#   fa3: on the H100/H200 queue, FA3 kernels including FP8 (e4m3).
#
#   .buildkite/scripts/gpu-test.sh fa2|fa3 CUDA
source "$(dirname "$0")/common.sh"
PART=${1:?usage: gpu-test.sh fa2|fa3 CUDA}
CUDA=${2:?usage: gpu-test.sh fa2|fa3 CUDA}
cd "$ROOT"
rm -rf wheelhouse && mkdir -p wheelhouse
buildkite-agent artifact download "wheelhouse/cu${CUDA}-x86_64/*.whl" .
nvidia-smi || true
index=$(torch_index_for "$CUDA")
tools_venv .venv-gpu pytest numpy
.venv-gpu/bin/python -m pip install -q ${index:+--index-url "$index"} "torch==${VFA_TORCH_VERSION}"
.venv-gpu/bin/python -m pip install -q --no-deps wheelhouse/cu"${CUDA}"-x86_64/*.whl
# A GPU step on an agent whose GPU torch cannot use would only skip every test: stop here.
if ! "$ROOT/.venv-gpu/bin/python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "torch.cuda.is_available() is False on this agent: a GPU step needs a usable GPU" >&2
  exit 1
fi
# Run from outside the checkout so the installed package, not python/, is imported.
cd "$(mktemp -d)"
"$ROOT/.venv-gpu/bin/python" -m vendored_flash_attn info
"$ROOT/.venv-gpu/bin/python" -m vendored_flash_attn.wheel_check installed \
  --pin "$ROOT/vendor/flash-attention/pin.json" --cuda-major "$(cuda_major "$CUDA")" --require fa2,fa3
case "$PART" in
  # A100: the selector picks FA2 by itself; FA3 tests skip off Hopper with the reason.
  # (VLLM_FLASH_ATTN_VERSION stays unset: the selector tests check the defaults.)
  fa2) must_run="FA2 not usable" ;;
  # H100/H200: FA3 with FP8, and first the FA2-vs-FA3 smoke check against SDPA.
  fa3) must_run="FA3 not usable"
       "$ROOT/.venv-gpu/bin/python" "$ROOT/tests/gpu/smoke_check.py" ;;
  *) echo "unknown part $PART (fa2 or fa3)" >&2; exit 2 ;;
esac
rc=0
junit="$ROOT/junit-gpu-$PART.xml"
rm -f "$junit"
# -o pythonpath=: test the installed wheel, not the source tree (pyproject adds python/).
"$ROOT/.venv-gpu/bin/python" -m pytest "$ROOT/tests/gpu" -m gpu -q -rs -p no:cacheprovider -o pythonpath= \
  --junitxml="$junit" || rc=$?
# pytest passes a run whose every test skipped; the step must not (check_gpu_junit.py).
check=0
"$ROOT/.venv-gpu/bin/python" "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$junit" \
  --forbid-skip "$must_run" || check=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
exit "$check"
