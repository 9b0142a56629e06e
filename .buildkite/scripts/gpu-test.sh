#!/usr/bin/env bash
# GPU tests of a built wheel (downloaded as an artifact of the wheel step):
#   fa2: on the A100 queue, FA2 kernels (the selector must pick FA2 there);
#   fa3: on the H100/H200 queue, FA3 kernels including FP8 (e4m3), and FA4's.
# Every family the wheel holds that runs on the agent's GPU is tested, with no skip: the
# wheel is installed with its [fa4] extra (the pin's versions, from the wheel's metadata)
# when it holds FA4, FA4's shipped kernels must all run with no compile
# (python -m vendored_flash_attn.release.wheel_check fa4-kernels), and a GPU test skipped "FAn not usable" for a
# family the wheel holds fails the step (check_gpu_junit.py --forbid-held-skips).
#
#   .buildkite/scripts/gpu-test.sh fa2|fa3 CUDA
#
# Without Buildkite or a network (a GPU machine given the files): VFA_WHEELHOUSE=DIR holds
# the wheel (DIR/cu<CUDA>-x86_64/*.whl, or DIR/vendored_flash_attn-*.whl) and the wheels
# of the [fa4] extra, which pip takes from there only (--no-index --find-links DIR);
# VFA_GPU_PYTHON=PYTHON is an interpreter with torch and pytest installed (no venv, no
# torch install); VFA_FA4_NO_DEPS=1 installs every other wheel of VFA_WHEELHOUSE and each
# [fa4] requirement with --no-deps (what else they need already installed), then the
# package's own check of the installed versions against the pin (fa4_deps) must pass.
source "$(dirname "$0")/common.sh"
PART=${1:?usage: gpu-test.sh fa2|fa3 CUDA}
CUDA=${2:?usage: gpu-test.sh fa2|fa3 CUDA}
cd "$ROOT"
case "$PART" in fa2|fa3) ;; *) echo "unknown part $PART (fa2 or fa3)" >&2; exit 2 ;; esac
if [ -n "${VFA_WHEELHOUSE:-}" ]; then
  wheels=("$VFA_WHEELHOUSE"/cu"${CUDA}"-x86_64/vendored_flash_attn-*.whl)
  [ -e "${wheels[0]}" ] || wheels=("$VFA_WHEELHOUSE"/vendored_flash_attn-*.whl)
  pip_source=(--no-index --find-links "$VFA_WHEELHOUSE")
else
  rm -rf wheelhouse && mkdir -p wheelhouse
  buildkite-agent artifact download "wheelhouse/cu${CUDA}-x86_64/*.whl" .
  wheels=(wheelhouse/cu"${CUDA}"-x86_64/vendored_flash_attn-*.whl)
  pip_source=()
fi
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "gpu-test: expected one vendored_flash_attn wheel, found: ${wheels[*]}" >&2
  exit 1
fi
wheel=$(cd "$(dirname "${wheels[0]}")" && pwd)/$(basename "${wheels[0]}")
nvidia-smi || true
if [ -n "${VFA_GPU_PYTHON:-}" ]; then
  py=$VFA_GPU_PYTHON
else
  index=$(torch_index_for "$CUDA")
  tools_venv .venv-gpu pytest numpy
  .venv-gpu/bin/python -m pip install -q ${index:+--index-url "$index"} "torch==${VFA_TORCH_VERSION}"
  py=$ROOT/.venv-gpu/bin/python
fi
# Does the wheel hold FA4 (its build record, cmake/knobs.json's fa4 "record")?
holds_fa4=$("$py" - "$wheel" <<'PY'
import sys, zipfile
print(int("vendored_flash_attn/_fa4/build_info.json" in zipfile.ZipFile(sys.argv[1]).namelist()))
PY
)
"$py" -m pip install -q --force-reinstall --no-deps "${pip_source[@]}" "$wheel"
if [ "$holds_fa4" = 1 ]; then
  echo "--- the [fa4] extra at the pin's versions (this wheel holds FA4)"
  if [ "${VFA_FA4_NO_DEPS:-0}" = 1 ]; then
    mapfile -t fa4_requirements < <("$py" - "$wheel" <<'PY'
import re, sys, zipfile
from email.parser import HeaderParser
zf = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
for requirement in HeaderParser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []:
    spec, _, marker = requirement.partition(";")
    if re.search(r"extra\s*==\s*['\"]fa4['\"]", marker):
        print(spec.strip())
PY
)
    # Every other wheel of the folder first (the extra's requirements and what they need that
    # this machine lacks, nvidia-cutlass-dsl-libs-base among them), then the requirements by
    # name: each must be met, by a wheel of the folder or what is installed.
    mapfile -t others < <(find "${VFA_WHEELHOUSE:?VFA_FA4_NO_DEPS=1 needs VFA_WHEELHOUSE}" -maxdepth 1 -name '*.whl' \
                            ! -name 'vendored_flash_attn-*' | sort)
    if [ "${#others[@]}" -gt 0 ]; then
      "$py" -m pip install -q --no-deps "${pip_source[@]}" "${others[@]}"
    fi
    "$py" -m pip install -q --no-deps "${pip_source[@]}" "${fa4_requirements[@]}"
  else
    "$py" -m pip install -q "${pip_source[@]}" "${wheel}[fa4]"
  fi
  (cd /tmp && "$py" -c 'import sys; from vendored_flash_attn.families.fa4 import deps as fa4_deps
problems = fa4_deps.problems()
sys.exit("the [fa4] extra is not installed at the pin'"'"'s versions: " + "; ".join(problems) if problems else 0)')
fi
# A GPU step on an agent whose GPU torch cannot use would only skip every test: stop here.
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "torch.cuda.is_available() is False on this agent: a GPU step needs a usable GPU" >&2
  exit 1
fi
# Run from outside the checkout so the installed package, not python/, is imported. FA4's
# user kernel cache starts empty (a private folder of this run): a kernel found there was
# compiled by this run, never carried over.
work=$(mktemp -d)
cd "$work"
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$work/fa4-user-cache
"$py" -m vendored_flash_attn info
"$py" -m vendored_flash_attn.release.wheel_check installed \
  --pin "$ROOT/vendor/flash-attention/pin.json" --cuda-major "$(cuda_major "$CUDA")" --require declared
case "$PART" in
  # A100: the selector picks FA2 by itself; FA3 and FA4 tests skip off Hopper with the reason.
  # (VLLM_FLASH_ATTN_VERSION stays unset: the selector tests check the defaults.)
  fa2) must_run="FA2 not usable" ;;
  # H100/H200: FA3 with FP8, and first the FA2-vs-FA3 smoke check against SDPA.
  fa3) must_run="FA3 not usable"
       "$py" "$ROOT/tests/gpu/smoke_check.py" ;;
esac
fa4_check=0
fa4_runs_here=$("$py" -c 'import sys, torch
from vendored_flash_attn.declaration.families import registry
print(int(registry().by_name("fa4").capability_problem(*torch.cuda.get_device_capability(0), 0) is None))')
if [ "$holds_fa4" = 1 ] && [ "$fa4_runs_here" = 1 ]; then
  echo "--- FA4's shipped kernels: each runs with no compile (user cache empty)"
  "$py" -m vendored_flash_attn.release.wheel_check fa4-kernels --report "$ROOT/fa4-check-installed-$PART.json" \
    || fa4_check=$?
  rm -rf "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
fi
rc=0
junit="$ROOT/junit-gpu-$PART.xml"
rm -f "$junit"
# -o pythonpath=: test the installed wheel, not the source tree (pyproject adds python/).
"$py" -m pytest "$ROOT/tests/gpu" -m gpu -q -rs -p no:cacheprovider -o pythonpath= \
  --junitxml="$junit" || rc=$?
# pytest passes a run whose every test skipped; the step must not (check_gpu_junit.py), nor
# one where a family the wheel holds skipped on a GPU it runs on.
check=0
"$py" "$ROOT/.buildkite/scripts/check_gpu_junit.py" "$junit" \
  --forbid-skip "$must_run" --forbid-held-skips || check=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
if [ "$fa4_check" -ne 0 ]; then
  echo "FA4's shipped kernels: check-installed failed ($fa4_check): see its lines above" >&2
  exit "$fa4_check"
fi
exit "$check"
